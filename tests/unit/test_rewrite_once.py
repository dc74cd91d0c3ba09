"""The xdist controller rewrites the test modules' assertions once (tests/rewrite_once.py), into the
very cache files pytest's workers read."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest
import rewrite_once
from _pytest.assertion import rewrite


class _Controller:
    """The running session's configuration, seen as an xdist controller with two workers to start
    and ``root`` as its only argument."""

    def __init__(self, config: pytest.Config, root: Path, workers: int = 2) -> None:
        self._config, self._workers = config, workers
        self.args = [str(root)]
        self.invocation_params = types.SimpleNamespace(dir=root)

    def getoption(self, name: str, default: Any = None) -> Any:
        if name == "numprocesses":
            return self._workers
        if name == "assertmode":
            return "rewrite"
        return self._config.getoption(name, default)

    def __getattr__(self, name: str) -> Any:
        if name == "workerinput":  # a controller, even when this test runs in a worker
            raise AttributeError(name)
        return getattr(self._config, name)


def _tree(root: Path) -> list[Path]:
    (root / "sub").mkdir(parents=True)
    (root / "__pycache__").mkdir()
    modules = [root / "test_one.py", root / "sub" / "test_two.py", root / "conftest.py"]
    for index, module in enumerate(modules):
        module.write_text(
            f"def test_{index}():\n    left, right = {index}, {index + 10}\n    assert left == right\n"
        )
    (root / "helper.py").write_text("VALUE = 1\n")  # not a test module: imported as is, never rewritten
    (root / "test_broken.py").write_text("def test_(:\n")  # a syntax error, left to the workers
    return modules


def _cached(module: Path) -> types.CodeType | None:
    pyc = rewrite.get_cache_dir(module) / (module.name[:-3] + rewrite.PYC_TAIL)
    return rewrite._read_pyc(module, pyc, lambda *_: None)


def test_the_controller_writes_the_rewritten_modules_pytest_then_reads(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    modules = _tree(tmp_path)
    controller: Any = _Controller(request.config, tmp_path)
    assert sorted(rewrite_once.test_modules(controller)) == sorted([*modules, tmp_path / "test_broken.py"])
    assert all(_cached(module) is None for module in modules)

    assert rewrite_once.rewrite_before_workers(controller) == 4  # the broken one counted, not written

    for index, module in enumerate(modules):  # each read back as valid by pytest's own check
        code = _cached(module)
        assert code is not None, module
        namespace: dict[str, Any] = {}
        exec(code, namespace)
        with pytest.raises(AssertionError) as failure:
            namespace[f"test_{index}"]()
        # the rewritten assert explains itself, as a worker's own rewrite would
        assert f"assert {index} == {index + 10}" in str(failure.value)
    assert _cached(tmp_path / "test_broken.py") is None
    assert not (tmp_path / "__pycache__" / f"helper.{rewrite.PYTEST_TAG}.pyc").exists()
    assert rewrite_once.rewrite_before_workers(controller) == 1  # only the broken one is still stale


def test_nothing_is_written_where_no_worker_would_read_it(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    modules = _tree(tmp_path)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert rewrite_once.rewrite_before_workers(_Controller(request.config, tmp_path)) == 0  # type: ignore[arg-type]
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    assert rewrite_once.rewrite_before_workers(_Controller(request.config, tmp_path, workers=0)) == 0  # type: ignore[arg-type]
    assert all(_cached(module) is None for module in modules)
