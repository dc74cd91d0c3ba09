"""The test modules' assertions rewritten once, by pytest-xdist's controller, before its workers start.

pytest rewrites each test module's ``assert`` statements (parse, rewrite, compile) and caches the
result in ``__pycache__/<name>.cpython-311-pytest-<version>.pyc``. A fresh clone (CI) has no such
cache, so each of the ``-n`` workers rewrote every test module itself, at the same moment, and each
wrote the same files: measured on this 2-core VM from a clone without ``__pycache__``, a worker spent
9.7-9.9 CPU-s before its first test against 3.0-3.1 with the cache (``-p cpu_profile``'s worker lines);
a cProfile of one collection put the difference in ``rewrite_asserts`` and ``compile``. The controller
itself collects nothing under xdist, so here it writes those cache files once, through pytest's own
functions (the same bytes a worker would write: a checked-hash pyc of the rewritten module), spread
over the cores, before the workers are started; each worker then finds them valid and only loads them.

A module this cannot rewrite (a syntax error) is left to the workers, which report it as before.
"""

from __future__ import annotations

import fnmatch
import os
import sys
from pathlib import Path

import pytest
from _pytest.assertion import rewrite


def test_modules(config: pytest.Config) -> list[Path]:
    """The files under the run's arguments that pytest would rewrite: ``conftest.py`` and every
    file matching ``python_files``, largest first."""
    patterns = [*config.getini("python_files"), "conftest.py"]
    found: set[Path] = set()
    for arg in config.args:
        root = (config.invocation_params.dir / arg.split("::", 1)[0]).resolve()
        candidates = [root] if root.is_file() else root.rglob("*.py") if root.is_dir() else []
        for path in candidates:
            inside = path.relative_to(root).parts if path != root else ()
            if any(part == "__pycache__" or part.startswith(".") for part in inside):
                continue
            if any(fnmatch.fnmatch(path.name, pattern) for pattern in patterns):
                found.add(path)
    return sorted(found, key=lambda path: -path.stat().st_size)


def _stale(path: Path) -> bool:
    """Whether ``path`` has no valid rewritten pyc yet (pytest's own check: the source's hash)."""
    pyc = rewrite.get_cache_dir(path) / (path.name[:-3] + rewrite.PYC_TAIL)
    return rewrite._read_pyc(path, pyc, lambda *_: None) is None


def _rewrite(paths: list[Path], config: pytest.Config) -> None:
    state = config.stash[rewrite.assertstate_key]
    for path in paths:
        cache_dir = rewrite.get_cache_dir(path)
        try:
            source_hash, code = rewrite._rewrite_test(path, config)
        except Exception:  # a broken module is the workers' to report
            continue
        if rewrite.try_makedirs(cache_dir):
            rewrite._write_pyc(state, code, source_hash, cache_dir / (path.name[:-3] + rewrite.PYC_TAIL))


def rewrite_before_workers(config: pytest.Config) -> int:
    """Write the missing rewritten pycs of the run's test modules when this process is an xdist
    controller about to start workers that would each write them; the number of modules rewritten."""
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", None):
        return 0
    if sys.dont_write_bytecode or config.getoption("assertmode") != "rewrite":
        return 0  # the workers will not read a cache either
    stale = [path for path in test_modules(config) if _stale(path)]
    if not stale:
        return 0
    share = max(1, min(os.cpu_count() or 1, len(stale)))
    chunks = [stale[index::share] for index in range(share)]  # largest first, dealt round
    children = []
    for chunk in chunks[1:]:
        pid = os.fork()  # before any worker or thread exists: the controller is still alone
        if pid == 0:
            try:
                _rewrite(chunk, config)
            finally:
                os._exit(0)
        children.append(pid)
    _rewrite(chunks[0], config)
    for pid in children:
        os.waitpid(pid, 0)
    return len(stale)
