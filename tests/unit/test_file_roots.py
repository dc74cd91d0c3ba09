"""``ALPHAAGENT_FILE_ROOTS`` as a new user sets it (new-user review): each root is an absolute path
to an existing directory, ``~`` meaning the home directory; a relative root (resolved against
wherever a command starts, so it silently never matched) or a missing one is refused with the
variable's name and the rule, by every command. The refusal of a file outside the roots shows the
spec's value as JSON and the resolved path once. In process: nothing is run."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from alphaagent.cli import main
from alphaagent.connectors import ConnectorSettings
from alphaagent.connectors.base import FetchLimits
from alphaagent.connectors.file import EXAMPLES_DIR, Request, Settings, check
from alphaagent.errors import ToolError

_LIMITS = FetchLimits(max_bytes=1 << 20, timeout_s=5)


def _roots(value: str) -> tuple[Path, ...]:
    return ConnectorSettings.from_env({"ALPHAAGENT_FILE_ROOTS": value}, "local").file_roots


def test_an_absolute_existing_root_is_taken_and_replaces_the_default(tmp_path: Path) -> None:
    assert _roots(str(tmp_path)) == (tmp_path,)
    assert _roots(f"{tmp_path}:{EXAMPLES_DIR}") == (tmp_path, EXAMPLES_DIR)
    assert _roots("") == (EXAMPLES_DIR,)  # unset or empty: the default


def test_a_tilde_root_is_the_home_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "data").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path))
    assert _roots("~/data") == (tmp_path / "data",)


@pytest.mark.parametrize(
    ("value", "line"),
    [
        ("data", "ALPHAAGENT_FILE_ROOTS: 'data' is not an absolute path (each root is /... or ~/...)"),
        (
            "./examples",
            "ALPHAAGENT_FILE_ROOTS: './examples' is not an absolute path (each root is /... or ~/...)",
        ),
        ("/no/such/dir", "ALPHAAGENT_FILE_ROOTS: '/no/such/dir' is not an existing directory"),
    ],
)
def test_a_relative_or_missing_root_is_refused_naming_the_variable(
    value: str, line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()  # a relative root that exists here is refused all the same
    with pytest.raises(ValueError) as refused:
        _roots(f"{EXAMPLES_DIR}:{value}")
    assert str(refused.value) == line


def test_the_cli_refuses_such_a_setting_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ALPHAAGENT_FILE_ROOTS", "data")
    spec = EXAMPLES_DIR / "penguins" / "turn1.json"
    assert main(["run", str(spec), "--home", str(tmp_path / "home"), "--conversation", "p"]) == 2
    out, err = capsys.readouterr()
    assert (out, err.count("\n")) == ("", 1)
    assert err.startswith("alphaagent: error: ALPHAAGENT_FILE_ROOTS: 'data' is not an absolute path")
    assert not (tmp_path / "home").exists()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path: a long value is shortened in a refusal (``wording.shown_json``),
    and pytest's own temporary paths are longer on some machines than on others."""
    folder = Path(tempfile.mkdtemp(prefix="fr", dir="/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


def test_a_file_outside_the_roots_shows_the_value_as_json_and_the_resolved_path_once(short_dir: Path) -> None:
    tmp_path = short_dir
    (tmp_path / "root").mkdir()
    (tmp_path / "a.csv").write_text("x\n")
    settings = Settings(file_roots=(tmp_path / "root",))
    with pytest.raises(ToolError) as refused:
        check(Request(path=str(tmp_path / "a.csv")), settings, _LIMITS)
    assert str(refused.value) == (
        f"request.path: {json.dumps(str(tmp_path / 'a.csv'))} is outside the file connector's allowed"
        f" directories ({tmp_path / 'root'}; set ALPHAAGENT_FILE_ROOTS)"
    )
    # A path that resolves elsewhere (`..`) says where, once
    dotted = f"{tmp_path}/root/../a.csv"
    with pytest.raises(ToolError) as refused:
        check(Request(path=dotted), settings, _LIMITS)
    assert str(refused.value).startswith(
        f"request.path: {json.dumps(dotted)} (resolves to {tmp_path / 'a.csv'}) is outside"
    )


def test_the_readme_says_where_the_variable_is_introduced_that_it_replaces_the_default() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("### Run a spec") :]
    intro = section[: section.index("```")]  # what a user reads before the first command
    assert "replaces" in intro and '$CHECKOUT/examples"' in intro and "~" in intro
