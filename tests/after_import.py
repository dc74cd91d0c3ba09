"""Running a patch right after a module's first import, wherever it is imported from."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any


class _AfterImport(importlib.abc.MetaPathFinder):
    """A finder that finds nothing itself: for a watched name it asks the other finders, and makes
    the loader they return run the name's patches once the module has executed."""

    def __init__(self) -> None:
        self.patches: dict[str, list[Callable[[], None]]] = {}

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        patches = self.patches.pop(fullname, None)
        if patches is None:
            return None
        spec = importlib.util.find_spec(fullname)  # this finder no longer watches the name
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            for patch in patches:  # nothing to wait for: the import fails or loads another way
                patch()
            return spec
        execute = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            parent, _, child = fullname.rpartition(".")
            if parent:  # as the import does next, so that the patch's `import a.b` finds a.b on a
                setattr(sys.modules[parent], child, module)
            for patch in patches:
                patch()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_FINDER = _AfterImport()


def when_imported(module: str, patch: Callable[[], None]) -> None:
    """Run ``patch`` once, just after ``module`` is first imported (at once if it already is).

    For the process-wide patches of moto and botocore (tests/conftest.py): applied at start-up they
    imported boto3 and moto (~1.5 CPU-s) into every pytest worker, also into those that run no AWS
    test. ``wrapt.register_post_import_hook`` does the same but imports asyncio and
    importlib.metadata (~0.15 CPU-s a worker); this is the part of it the suite needs.
    """
    if module in sys.modules:
        patch()
        return
    _FINDER.patches.setdefault(module, []).append(patch)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
