"""Skipping a test module whose optional dependency is missing, without importing the dependency."""

from __future__ import annotations

import importlib.util

import pytest


def skip_unless_installed(*modules: str) -> None:
    """Skip the calling test module (at collection) unless every one of ``modules`` is installed.

    ``pytest.importorskip`` imports the module to learn that; a worker collecting the suite would
    then import the Agent SDK or the MCP SDK (~1 CPU-s) for modules whose tests it may never run.
    ``find_spec`` of a top-level name only looks for it on the path.
    """
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)}", allow_module_level=True)
