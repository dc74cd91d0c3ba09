"""The order of the modules (tests/conftest.py) from the committed weights and pytest's cache."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import conftest
import module_weights
import pytest


@dataclass
class _Item:
    nodeid: str
    fixturenames: tuple[str, ...] = ()
    markers: tuple[str, ...] = ()

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.markers else None


class _Cache:
    def __init__(self, figures: dict[str, float]) -> None:
        self.figures = figures

    def get(self, key: str, default: Any) -> Any:
        return self.figures if key == module_weights.CACHE_KEY and self.figures else default


@dataclass
class _Config:
    cache: _Cache | None


def _ordered(cache: _Cache | None) -> list[str]:
    items: list[Any] = [
        _Item("tests/unit/test_a.py::one"),
        _Item("tests/unit/test_b.py::one"),
        _Item("tests/unit/test_a.py::two"),
        _Item("tests/unit/test_c.py::one"),
    ]
    conftest.pytest_collection_modifyitems(_Config(cache), items)  # type: ignore[arg-type]
    return [item.nodeid for item in items]


@pytest.fixture
def weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "module_weights.json"
    path.write_text(json.dumps({"tests/unit/test_c.py": 30, "tests/unit/test_b.py": 5}))
    monkeypatch.setattr(module_weights, "WEIGHTS", path)
    return path


def test_a_fresh_clone_orders_the_modules_by_the_committed_weights(weights: Path) -> None:
    # Given no cache (a fresh clone, or -p no:cacheprovider)
    # When the modules are ordered; Then the heaviest committed module goes first, and a module's
    # tests stay together in their order (test_a has no weight: last)
    assert _ordered(None) == [
        "tests/unit/test_c.py::one",
        "tests/unit/test_b.py::one",
        "tests/unit/test_a.py::one",
        "tests/unit/test_a.py::two",
    ]
    assert _ordered(_Cache({})) == _ordered(None)


def test_the_caches_figure_wins_over_the_committed_one(weights: Path) -> None:
    # Given a last run in which test_a took longest and test_b longer than committed
    order = _ordered(_Cache({"tests/unit/test_a.py": 60.0, "tests/unit/test_b.py": 40.0}))
    # Then the cache decides where it has figures, the committed file elsewhere
    assert order == [
        "tests/unit/test_a.py::one",
        "tests/unit/test_a.py::two",
        "tests/unit/test_b.py::one",
        "tests/unit/test_c.py::one",
    ]


def test_modules_that_share_a_workers_fixture_go_one_after_another_weighing_their_sum(
    weights: Path,
) -> None:
    # Given two modules whose tests use the worker's env sandbox (5 + 20 s), a heavier module that
    # does not (test_c, 22 s), and a light one (test_b, 1 s)
    items: list[Any] = [
        _Item("tests/unit/test_a.py::one", ("env_sandbox",)),
        _Item("tests/unit/test_b.py::one"),
        _Item("tests/unit/test_c.py::one"),
        _Item("tests/unit/test_d.py::one", ("stack", "env_sandbox")),
        _Item("tests/unit/test_a.py::two", ("env_sandbox",)),
    ]
    figures = {"tests/unit/test_a.py": 5.0, "tests/unit/test_b.py": 1.0, "tests/unit/test_c.py": 22.0}
    cache = _Cache(figures | {"tests/unit/test_d.py": 20.0})
    conftest.pytest_collection_modifyitems(_Config(cache), items)  # type: ignore[arg-type]
    # Then the two go together, first: their sum (25 s) outweighs test_c; the heavier of them
    # first, each module's tests together and in their order
    assert [item.nodeid for item in items] == [
        "tests/unit/test_d.py::one",
        "tests/unit/test_a.py::one",
        "tests/unit/test_a.py::two",
        "tests/unit/test_c.py::one",
        "tests/unit/test_b.py::one",
    ]


def test_modules_marked_as_importing_the_mcp_sdk_go_one_after_another_and_a_fixture_unit_wins(
    weights: Path,
) -> None:
    # Given two light modules that import the MCP SDK (3 + 4 s), a heavier module that does not
    # (test_c, 6 s), and a module that both imports the SDK and uses the env sandbox (test_e, 2 s)
    items: list[Any] = [
        _Item("tests/unit/test_a.py::one", markers=("mcp_sdk",)),
        _Item("tests/unit/test_c.py::one"),
        _Item("tests/unit/test_e.py::one", ("env_sandbox",), ("mcp_sdk",)),
        _Item("tests/unit/test_d.py::one", markers=("mcp_sdk",)),
        _Item("tests/unit/test_a.py::two", markers=("mcp_sdk",)),
    ]
    figures = {"tests/unit/test_a.py": 3.0, "tests/unit/test_c.py": 6.0, "tests/unit/test_d.py": 4.0}
    conftest.pytest_collection_modifyitems(_Config(_Cache(figures | {"tests/unit/test_e.py": 2.0})), items)  # type: ignore[arg-type]
    # Then the two marked modules go together and first (7 s outweighs test_c), the heavier first;
    # test_e stays with its fixture's unit
    assert [item.nodeid for item in items] == [
        "tests/unit/test_d.py::one",
        "tests/unit/test_a.py::one",
        "tests/unit/test_a.py::two",
        "tests/unit/test_c.py::one",
        "tests/unit/test_e.py::one",
    ]


def test_without_any_figures_the_order_is_pytests_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(module_weights, "WEIGHTS", tmp_path / "absent.json")
    assert _ordered(None) == [
        "tests/unit/test_a.py::one",
        "tests/unit/test_b.py::one",
        "tests/unit/test_a.py::two",
        "tests/unit/test_c.py::one",
    ]


def test_the_file_is_one_line_a_module_in_whole_seconds_of_modules_that_exist() -> None:
    # Given figures for a real module and for one deleted since
    text = module_weights.render({"tests/unit/test_wording.py": 3.6, "tests/unit/test_gone.py": 9.0})
    # Then the file keeps the real one, rounded, on a line of its own
    assert text == '{\n"tests/unit/test_wording.py": 4\n}\n'


def test_the_committed_file_names_only_modules_that_exist() -> None:
    # The committed weights are the ones a fresh clone (CI) schedules with
    weights = module_weights.committed()
    assert weights, "tests/module_weights.json is missing or empty: run `make test` then `make test-weights`"
    missing = [module for module in weights if not (module_weights.ROOT / module).is_file()]
    assert not missing, f"modules in tests/module_weights.json that no longer exist: {missing}"
