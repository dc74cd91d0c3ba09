"""Building the command line asks the terminal its width and argparse's words once per build
(alphaagent.cli._Parser._get_formatter, _argparse_words_once): the help must still follow the
terminal of each call, and argparse must be left as it was found."""

from __future__ import annotations

import argparse
import gettext

import pytest

from alphaagent.cli import build_parser


def _help_of_files(columns: int, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setenv("COLUMNS", str(columns))
    parser = build_parser("alphaagent")
    files = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["files"]
    help_text: str = files.format_help()
    return help_text.splitlines()


def test_each_build_wraps_the_help_to_the_terminal_of_its_own_call(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given two builds in one process, for a narrow terminal and then a wide one
    narrow = _help_of_files(60, monkeypatch)
    wide = _help_of_files(200, monkeypatch)
    # Then each help is wrapped to its own width (argparse's: the columns less 2), not the first's:
    # the usage takes several lines of at most 58 columns in the narrow one, one line in the wide one
    usage = narrow[: narrow.index("")]
    assert len(usage) > 1 and max(map(len, usage)) <= 58, narrow
    assert wide[0].startswith("usage: alphaagent files") and wide[0].endswith("[--home DIR]"), wide
    assert _help_of_files(60, monkeypatch) == narrow


def test_a_build_leaves_argparse_translating_through_gettext() -> None:
    # When the parser is built, argparse's words are looked up once each for the build
    build_parser("alphaagent")
    # Then argparse translates through gettext again afterwards, for every other parser
    assert argparse._ is gettext.gettext  # type: ignore[attr-defined]
