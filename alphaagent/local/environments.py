"""The local backend's environment registry (DESIGN §1, §4.9): ``builtin`` plus what
``alphaagent env add`` registered, in the ``environments`` table of the data directory's SQLite store.

An environment here is a Python >= 3.11 interpreter and the modules its zygote preloads. Registering
one proves it works before anything is written: the interpreter runs and is new enough, and a zygote
started under it imports every preload module (``register_environment``). ``builtin`` is code, not a
row: always present, never removable.

Example::

    registry = LocalEnvironmentRegistry(store, builtin_local())
    register_environment(registry, SandboxConfig(), environment_id="stats", python="/opt/stats/bin/python")
    [e.environment_id for e in registry.list()]    # ["builtin", "stats"]
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from pydantic import ValidationError

from alphaagent.environments import (
    BUILTIN_ID,
    MAX_PACKAGES,
    Environment,
    EnvironmentLimits,
    LocalStart,
)
from alphaagent.errors import InvalidEnvironmentError, NotFoundError
from alphaagent.local import interpreter_probe
from alphaagent.local.store import SqliteStore
from alphaagent.models.common import printable_text, utcnow
from alphaagent.models.rules import string_rule
from alphaagent.sandbox.config import SandboxConfig
from alphaagent.sandbox.environment import zygote_environment
from alphaagent.sandbox.supervisor import Sandbox
from alphaagent.wording import shown_typed

MIN_PYTHON = (3, 11)
"""The zygote's floor (DESIGN §5: it runs under any Python >= 3.11)."""

PROBE_TIMEOUT_S = 60.0
"""How long the interpreter may take to report its version and packages (a cold disk, many
distributions) before it is refused."""

_PROBE_OUTPUT_MAX = 1 << 20
"""The probe's answer is a few KiB (``MAX_PACKAGES`` names); more is not an interpreter's answer."""


class LocalEnvironmentRegistry:
    """``EnvironmentRegistry`` over the store: ``builtin`` (given, with this interpreter's packages
    filled in on first use) and the stored environments. Thread-safe (the store is)."""

    def __init__(self, store: SqliteStore, builtin: Environment) -> None:
        self._store = store
        self._builtin = builtin
        self._builtin_packages: tuple[str, ...] | None = None
        self._lock = threading.Lock()

    @property
    def builtin(self) -> Environment:
        """``builtin``, with the packages of the interpreter alphaagent runs under when that is the
        one it starts (computed once: a listing of ~100 distributions takes tens of ms)."""
        if self._builtin.packages or not _is_this_interpreter(self._builtin):
            return self._builtin
        with self._lock:
            if self._builtin_packages is None:
                self._builtin_packages = tuple(interpreter_probe.installed_packages(MAX_PACKAGES))
        return self._builtin.model_copy(update={"packages": self._builtin_packages})

    def get(self, environment_id: str) -> Environment | None:
        """The environment (ready or removed), or None if it was never registered."""
        if environment_id == BUILTIN_ID:
            return self.builtin
        return self._store.get_environment(environment_id)

    def list(self) -> list[Environment]:
        """The ready environments, ``builtin`` first, then by id."""
        return [self.builtin, *self._store.list_environments()]

    def add(self, environment: Environment) -> None:
        """Record ``environment``; ``InvalidEnvironmentError`` (nothing written) if its id is
        ``builtin`` or registered and ready already."""
        _refuse_taken(self, environment.environment_id)
        if not self._store.add_environment(environment):
            raise _taken(environment.environment_id)  # registered meanwhile by another process

    def remove(self, environment_id: str) -> Environment:
        """Mark an environment removed: its specs are refused from now on, its record kept. Raises
        ``InvalidEnvironmentError`` for ``builtin``, ``NotFoundError`` for an id that is not
        registered (or removed already)."""
        if environment_id == BUILTIN_ID:
            raise InvalidEnvironmentError("environment_id", "'builtin' is built in and cannot be removed")
        removed = self._store.remove_environment(environment_id, utcnow())
        if removed is None:
            state = (
                "was removed already" if self._store.get_environment(environment_id) else "is not registered"
            )
            raise NotFoundError(f"environment {environment_id!r} {state}")
        return removed


def register_environment(
    registry: LocalEnvironmentRegistry,
    base: SandboxConfig,
    *,
    environment_id: str,
    python: str,
    preload: tuple[str, ...] = (),
    description: str = "",
    limits: EnvironmentLimits | None = None,
) -> Environment:
    """Check, then register, a local environment: its id (DESIGN §4.1, not taken), the interpreter
    (exists, runs, Python >= 3.11), and a zygote started once under it with ``base``'s isolation
    settings that imports every ``preload`` module. The interpreter's distributions are recorded
    as ``packages`` (at most ``MAX_PACKAGES``).

    ``python`` is a path, or a name looked up on ``PATH``; it is made absolute but not resolved: a
    virtual environment's ``bin/python`` is a link to the base interpreter, and only the link's
    path selects the venv.

    Raises ``InvalidEnvironmentError`` naming the field (``environment_id``, ``python``, ``preload``,
    ``description``, ``limits``) and the rule; nothing is registered then. ``SandboxError`` when the
    zygote fails for another reason (the platform's isolation, not the interpreter).
    """
    # A bare name (``python3.12``) is looked up on PATH, as a shell would.
    found = shutil.which(python) if "/" not in python else None
    path = str(Path(found or python).expanduser().absolute())
    try:
        candidate = Environment(
            environment_id=environment_id,
            description=description,
            start=LocalStart(python=path),
            preload=preload,
            limits=limits or EnvironmentLimits(),
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "environment"
        # An id's rule and a length bound in the words of every other refusal, the value as typed.
        rule = string_rule(first, shown_typed) or first["msg"].removeprefix("Value error, ")
        raise InvalidEnvironmentError(field, rule) from None
    _refuse_taken(registry, environment_id)
    packages = _probe(path)
    config = base.model_copy(update={"python": path, "preload": candidate.preload, "warmup": ""})
    with Sandbox(config) as sandbox:
        errors = dict(sandbox.info.get("preload_errors", {}))
    if errors:
        module, error = next(iter(errors.items()))
        raise InvalidEnvironmentError("preload", f"module {module!r} does not import under {path}: {error}")
    registered = candidate.model_copy(update={"packages": tuple(packages), "registered_at": utcnow()})
    registry.add(registered)
    return registered


def _probe(python: str) -> list[str]:
    """Run ``interpreter_probe`` under ``python`` (in the zygote's environment: what runs will see);
    its packages. ``InvalidEnvironmentError`` (field ``python``) when it is missing, does not run,
    or is older than ``MIN_PYTHON``."""
    path = Path(python)
    if not path.exists():
        raise InvalidEnvironmentError("python", f"{python}: no such interpreter")
    if not path.is_file():
        raise InvalidEnvironmentError("python", f"{python}: not a file")
    with tempfile.TemporaryDirectory(prefix="alphaagent-probe-") as scratch:
        mpl = Path(scratch) / "mplconfig"
        mpl.mkdir()
        env = zygote_environment(SandboxConfig(python=python, hidden_paths=()), mpl)
        try:
            done = subprocess.run(
                [python, interpreter_probe.__file__, str(MAX_PACKAGES)],
                env=env,
                cwd=scratch,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=PROBE_TIMEOUT_S,
            )
        except PermissionError:
            raise InvalidEnvironmentError("python", f"{python}: not executable") from None
        except OSError as exc:
            raise InvalidEnvironmentError(
                "python", f"{python}: cannot run it ({exc.strerror or exc})"
            ) from None
        except subprocess.TimeoutExpired:
            raise InvalidEnvironmentError(
                "python", f"{python}: did not answer within {PROBE_TIMEOUT_S:g} s"
            ) from None
    try:
        if done.returncode != 0:
            raise ValueError(f"exit status {done.returncode}")
        report = json.loads(done.stdout[:_PROBE_OUTPUT_MAX].decode())
        version = tuple(int(part) for part in report["version"])
        packages = [str(p) for p in report.get("packages", [])][:MAX_PACKAGES]
    except (ValueError, TypeError, KeyError, AttributeError):
        said = done.stderr.decode(errors="replace").strip().splitlines()
        detail = f": {printable_text(said[-1][:200])}" if said else ""
        raise InvalidEnvironmentError(
            "python", f"{python}: did not run as a Python interpreter{detail}"
        ) from None
    if version[:2] < MIN_PYTHON:
        shown = ".".join(str(v) for v in version)
        floor = ".".join(str(v) for v in MIN_PYTHON)
        raise InvalidEnvironmentError(
            "python", f"{python} is Python {shown}; an environment needs Python >= {floor}"
        )
    return packages


def _refuse_taken(registry: LocalEnvironmentRegistry, environment_id: str) -> None:
    if environment_id == BUILTIN_ID:
        raise InvalidEnvironmentError("environment_id", "'builtin' is built in and always registered")
    found = registry.get(environment_id)
    if found is not None and found.status == "ready":
        raise _taken(environment_id)


def _taken(environment_id: str) -> InvalidEnvironmentError:
    return InvalidEnvironmentError(
        "environment_id",
        f"{environment_id!r} is registered already (alphaagent env remove {environment_id} first)",
    )


def _is_this_interpreter(environment: Environment) -> bool:
    import sys

    return isinstance(environment.start, LocalStart) and environment.start.python == sys.executable
