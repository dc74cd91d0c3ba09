"""The committed weight of each test module (seconds), for ordering the modules on a fresh clone.

``tests/conftest.py`` runs the costliest modules first so that no long module is left for the end of
the run (pytest-xdist, ``--dist worksteal``). Its figures are each module's summed test durations
from the last run, in pytest's cache; a fresh clone has no cache, so it reads these, committed as
``tests/module_weights.json`` (one line per module, whole seconds, like pytest-split's
``.test_durations``). The cache's figure wins where both have one.

``make test-weights`` rewrites the file from the cache after a run (``python tests/module_weights.py``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = ROOT / "tests" / "module_weights.json"
CACHE_KEY = "alphaagent/module_seconds"
"""The pytest cache key under which tests/conftest.py keeps the last run's seconds per module."""


def committed() -> dict[str, float]:
    """The committed weights: module path (as in a node id) -> seconds; empty without the file."""
    try:
        weights: dict[str, float] = json.loads(WEIGHTS.read_text())
    except FileNotFoundError:
        return {}
    return weights


def render(seconds: dict[str, float]) -> str:
    """The file's text for ``seconds``: modules that still exist, whole seconds, one line each,
    sorted by name (so that a refresh's diff shows only the modules whose cost moved)."""
    kept = {module: round(value) for module, value in sorted(seconds.items()) if (ROOT / module).is_file()}
    return json.dumps(kept, indent=0) + "\n"


def main() -> int:
    """Write the cache's figures (``.pytest_cache``) over the committed ones; 1 with a one-line
    error when no run has left figures."""
    cached = ROOT / ".pytest_cache" / "v" / CACHE_KEY
    try:
        seconds: dict[str, float] = json.loads(cached.read_text())
    except FileNotFoundError:
        print(f"{cached.relative_to(ROOT)}: no figures yet; run `make test` first", file=sys.stderr)
        return 1
    WEIGHTS.write_text(render({**committed(), **seconds}))
    print(f"{WEIGHTS.relative_to(ROOT)}: {len(seconds)} modules from the last run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
