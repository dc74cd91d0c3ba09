"""The environment of the zygote and of every child: rebuilt from scratch, never inherited.

Nothing of the supervisor's environment reaches user code except the names in ``PASSTHROUGH``
(hardware tuning that numerical libraries need to compute correctly on some CPUs). In particular no
``AWS_*``, no Lambda runtime variable (``AWS_LAMBDA_RUNTIME_API``, ``_HANDLER``, ``_X_AMZN_TRACE_ID``)
and no model API key.

The child's variables (``child_environment``):

====================== ==============================================================
``PATH``               the environment interpreter's directory, then the system's
``HOME``, ``TMPDIR``   the run's private directory in its scratch area (wiped afterwards;
                       ``/tmp`` itself at the ``namespaces`` level)
``LANG``, ``LC_ALL``   ``C.UTF-8``
``PYTHONIOENCODING``   ``utf-8``; ``PYTHONUNBUFFERED=1``, ``PYTHONDONTWRITEBYTECODE=1``
``MPLBACKEND``         ``Agg``: charts render headless; ``plt.show()`` is a no-op
``ARROW_DEFAULT_MEMORY_POOL`` ``system``: no 1 GiB address-space reservation (see ``_base``)
``TERM``, ``NO_COLOR`` ``dumb`` and ``1``: well-behaved tools drop colours and progress bars
``*_NUM_THREADS``      ``threads`` (default 1): BLAS/OpenMP pools do not survive ``fork``
====================== ==============================================================
"""

from __future__ import annotations

import os
from pathlib import Path

from alphaagent.sandbox.config import SandboxConfig

PASSTHROUGH = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "TZ")
_THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "ARROW_NUM_THREADS",
)


def _base(config: SandboxConfig) -> dict[str, str]:
    bin_dir = str(Path(config.python).parent)
    env = {
        "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "MPLBACKEND": "Agg",
        # pyarrow's default mimalloc pool reserves ~1 GiB of address space up front, which RLIMIT_AS
        # counts: with it, a 2 GiB limit left ~600 MiB for the code. The system allocator does not.
        "ARROW_DEFAULT_MEMORY_POOL": "system",
    }
    env.update({name: str(config.threads) for name in _THREAD_VARIABLES})
    env.update({name: os.environ[name] for name in PASSTHROUGH if name in os.environ})
    return env


def zygote_environment(config: SandboxConfig, mpl_config_dir: Path) -> dict[str, str]:
    """The zygote's environment: the base set, with a private matplotlib cache built once."""
    env = _base(config)
    env["HOME"] = str(mpl_config_dir.parent)
    env["MPLCONFIGDIR"] = str(mpl_config_dir)
    # pyarrow's bundled jemalloc starts a purging thread at import (even with the system pool): the
    # zygote must stay single-threaded to clone its spares (``zygote._clone_usable``). Without it
    # jemalloc purges on its own calls instead; runs never had the thread (a fork keeps one thread).
    env["JE_ARROW_MALLOC_CONF"] = "background_thread:false"
    return env


def child_environment(config: SandboxConfig, *, tmp_dir: str) -> dict[str, str]:
    """The environment user code sees (see the module docstring), plus ``config.extra_env``.

    ``HOME`` is the run's private temporary directory too: tools that write ``~/.cache`` or
    ``~/.config`` write into the scratch area, which is wiped after the run.
    """
    env = _base(config)
    env.update(
        {
            "HOME": tmp_dir,
            "TMPDIR": tmp_dir,
            "MPLCONFIGDIR": f"{tmp_dir}/.matplotlib",
            "PYTHONUNBUFFERED": "1",
            "TERM": "dumb",
            "NO_COLOR": "1",
        }
    )
    env.update(config.extra_env)
    return env


def secrets_to_redact(names: tuple[str, ...]) -> tuple[str, ...]:
    """Values of the supervisor's variables ``names`` that are long enough (8+ chars) to redact."""
    return tuple(v for n in names if len(v := os.environ.get(n, "")) >= 8)
