"""The example scripts of ``examples/`` as modules, for the tests that run them (they are scripts
next to their data, not a package)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example(relative: str) -> ModuleType:
    """The module of ``examples/<relative>`` (e.g. ``"workflow/penguins_workflow.py"``), loaded anew."""
    path = EXAMPLES / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
