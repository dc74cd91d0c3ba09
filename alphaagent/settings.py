"""How every process kind reads its configuration (STYLE §7): one pydantic model per process kind,
whose fields are the environment variables it reads (each with a ``description``), read once through
a cached getter; a bad value is one line naming the variable (``InvalidSettingError``).

The models, per process kind (``PROCESS_KINDS``; the README's "Settings" table is generated from them
by ``python -m alphaagent.settings``):

- the local CLI, Python API and MCP server: ``alphaagent.local.settings.LocalSettings`` (and, with a
  model, ``coder.settings.CoderSettings``; with ``--backend aws``, ``alphaagent.aws.client.ClientSettings``);
- each zip Lambda function: its model in ``alphaagent.aws.settings`` (``FUNCTION_SETTINGS``);
- the env function: ``alphaagent.aws.settings.EnvSettings``;
- the coder worker: ``coder.worker.WorkerSettings``, ``coder.settings.CoderSettings`` and
  ``alphaagent.aws.settings.CoderBackendSettings``.

A field whose value the template never sets is marked ``json_schema_extra=ORIGIN_DEFAULT`` (a
tunable with a documented default); the rest are set in ``template.yaml``
(tests/unit/test_settings.py checks both directions). Variables a model documents but reads
elsewhere (set by a runtime) are its ``VARIABLES``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from typing import Final, TypeVar

from pydantic import AliasChoices, BaseModel, ValidationError
from pydantic.config import JsonDict

from alphaagent.errors import InvalidSettingError

M = TypeVar("M", bound=BaseModel)

ORIGIN_DEFAULT: Final[JsonDict] = {"origin": "default"}
"""``json_schema_extra`` of a field the template leaves at its default (a tunable)."""

PROCESS_KINDS: Final[dict[str, tuple[str, ...]]] = {
    "local (CLI, API, MCP, viewer)": (
        "alphaagent.local.settings:LocalSettings",
        "alphaagent.aws.client:ClientSettings",
        "coder.settings:CoderSettings",
    ),
    "StartTurnFunction": ("alphaagent.aws.settings:StartTurnSettings",),
    "AcquireLockFunction": ("alphaagent.aws.settings:AcquireLockSettings",),
    "PrepareTurnFunction": ("alphaagent.aws.settings:PrepareTurnSettings",),
    "FinalizeTurnFunction": ("alphaagent.aws.settings:FinalizeTurnSettings",),
    "ReleaseLockFunction": ("alphaagent.aws.settings:ReleaseLockSettings",),
    "RecordEventFunction": ("alphaagent.aws.settings:RecordEventSettings",),
    "ReleaseOrphanLockFunction": ("alphaagent.aws.settings:ReleaseOrphanLockSettings",),
    "SweepNoticeQueuesFunction": ("alphaagent.aws.settings:SweepNoticeQueuesSettings",),
    "EnvBuiltinFunction": ("alphaagent.aws.settings:EnvSettings",),
    "coder worker": (
        "coder.worker:WorkerSettings",
        "coder.settings:CoderSettings",
        "alphaagent.aws.settings:CoderBackendSettings",
    ),
}
"""Each process kind and the settings models it reads, as ``module:Class`` (imported on demand:
``coder`` is a separate package with its own dependencies)."""


def variable_of(model: type[BaseModel], field: str) -> str:
    """The environment variable that fills ``field`` of ``model``: the model's ``ENV_NAMES`` entry
    (models whose fields have Python names), else its alias (the first of several), else the field's
    own name (the zip functions' models name fields after their variables)."""
    names = getattr(model, "ENV_NAMES", None)
    if isinstance(names, Mapping) and field in names:
        return str(names[field])
    info = model.model_fields[field]
    alias = info.validation_alias or info.alias
    if isinstance(alias, AliasChoices):
        alias = alias.choices[0]
    return str(alias) if isinstance(alias, str) else field


def read_env(model: type[M], env: Mapping[str, str]) -> M:
    """``model`` validated from the environment ``env``.

    Raises:
        InvalidSettingError: a value breaks a rule or a required variable is unset; one line that
            starts with the variable (``WORKER_CONCURRENCY: Input should be less than or equal to 64``).
    """
    try:
        return model.model_validate(dict(env))
    except ValidationError as exc:
        raise InvalidSettingError(describe_error(model, exc)) from None


def describe_error(model: type[BaseModel], exc: ValidationError) -> str:
    """The first error of ``exc`` as one line naming the variable (never the model's field), the
    rule and the value as it was set, quoted as text (``alphaagent.wording``'s rule):
    ``ALPHAAGENT_LOCK_LEASE_S: must be a number of seconds > 0, got 'abc'``; the rule alone when
    the error already names the variable, as a connector's does."""
    from alphaagent.models.rules import value_rule
    from alphaagent.wording import shown_typed

    first = exc.errors()[0]
    message = str(first["msg"]).removeprefix("Value error, ").splitlines()[0]
    loc = [str(part) for part in first["loc"]]
    if not loc:
        return message
    # pydantic names the alias it validated by, or the field when the field is the variable.
    field = loc[0] if loc[0] in model.model_fields else _field_of_alias(model, loc[0])
    variable = variable_of(model, field) if field is not None else loc[0]
    if first["type"] == "missing":
        message = "not set (required)"
    else:
        info = model.model_fields.get(field) if field is not None else None
        shown = lambda value: shown_typed(value) if isinstance(value, str) else repr(value)  # noqa: E731
        message = value_rule(first, info, shown, variable) or message
    return f"{variable}: {message}"


def _field_of_alias(model: type[BaseModel], alias: str) -> str | None:
    """The field of ``model`` whose variable is ``alias`` (pydantic's error names the alias)."""
    return next((field for field in model.model_fields if variable_of(model, field) == alias), None)


def documented_variables(model: type[BaseModel]) -> dict[str, str]:
    """Every environment variable ``model`` reads, with its description: its fields' variables,
    and the connectors' variables of its backend when it carries connector settings
    (``CONNECTORS_BACKEND``: ``"local"`` or ``"aws"``)."""
    from alphaagent import connectors

    found: dict[str, str] = {}
    documented = getattr(model, "VARIABLES", None)
    if isinstance(documented, Mapping):
        found.update(documented)
    names = getattr(model, "ENV_NAMES", None)
    for field, info in model.model_fields.items():
        if info.exclude or (isinstance(names, Mapping) and field not in names):
            continue  # not read from the environment
        found.setdefault(variable_of(model, field), str(info.description or ""))
    backend = getattr(model, "CONNECTORS_BACKEND", None)
    if isinstance(backend, str):
        found.update(connectors.env_variables(backend))
    return found


def model_of(path: str) -> type[BaseModel]:
    """The settings model named by ``module:Class``."""
    module, _, name = path.partition(":")
    model = getattr(importlib.import_module(module), name)
    assert isinstance(model, type) and issubclass(model, BaseModel), path
    return model


def settings_table() -> str:
    """The README's "Settings" reference: each variable once, the process kinds that read it (in
    ``PROCESS_KINDS`` order) and what it means (the first model's description)."""
    readers: dict[str, list[str]] = {}
    meanings: dict[str, str] = {}
    for kind, paths in PROCESS_KINDS.items():
        for path in paths:
            for variable, description in documented_variables(model_of(path)).items():
                kinds = readers.setdefault(variable, [])
                if kind not in kinds:
                    kinds.append(kind)
                meanings.setdefault(variable, " ".join(description.split()).replace("|", "\\|"))
    lines = ["| Variable | Read by | Meaning |", "| --- | --- | --- |"]
    for variable, kinds in readers.items():
        lines.append(f"| `{variable}` | {', '.join(kinds)} | {meanings[variable]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m alphaagent.settings``: print the settings table (README, "Settings")."""
    print(settings_table())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
