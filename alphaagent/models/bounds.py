"""The bounds of a run's limits, with no import at all: the models (``RunLimits``,
``EnvironmentLimits``) enforce them, and the command line's option types state them in their usage
errors without importing pydantic (``bench/cli_start.py``)."""

from __future__ import annotations

from typing import Final

MAX_TIMEOUT_S: Final = 900
"""Lambda's maximum function timeout (seconds): the env function runs one run per invocation."""
MIN_MEMORY_MB: Final = 256
"""The least address space a run may ask for (MiB): the preloaded scientific stack alone maps ~400."""
MAX_MEMORY_MB: Final = 10_240
"""Lambda's largest memory size (MiB)."""
