"""The bounds of a run's limits and the rules of the ids a command names, with no import at all: the
models (``RunLimits``, ``EnvironmentLimits``, ``models.common``'s ids) enforce them, and the
command line's option types check and state them in their usage errors without importing pydantic
(``bench/cli_start.py``)."""

from __future__ import annotations

from typing import Final

MAX_TIMEOUT_S: Final = 900
"""Lambda's maximum function timeout (seconds): the env function runs one run per invocation."""
MIN_MEMORY_MB: Final = 256
"""The least address space a run may ask for (MiB): the preloaded scientific stack alone maps ~400."""
MAX_MEMORY_MB: Final = 10_240
"""Lambda's largest memory size (MiB)."""

SCOPE_ID_PATTERN: Final = r"^[A-Za-z0-9_-]{1,80}$"
"""A conversation, workflow execution or node id (DESIGN §4.1): 1-80 of letters, digits, ``_``, ``-``."""
ENVIRONMENT_ID_PATTERN: Final = r"^[a-z][a-z0-9-]{0,31}$"
"""An environment id: 1-32 of ``a-z``, ``0-9``, ``-``, starting with a letter."""
