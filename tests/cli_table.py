"""Every command of the CLI, for the tests that walk them all (the one-rule tables of the newcomer
and second-review tests), and a usage error caught the way those tests read it."""

from __future__ import annotations

import argparse

import pytest

from alphaagent.cli import main

COMMAND_ARGV: dict[str, list[str]] = {
    "exec": ["-"],
    "run": ["spec.json"],
    "submit": ["spec.json"],
    "demo": [],
    "files": [],
    "cat": ["a.txt"],
    "history": [],
    "artifacts": [],
    "sessions": [],
    "turns": [],
    "conversations": [],
    "serve": [],
    "mcp": [],
    "export": ["-o", "x.zip"],
    "help": [],
    "version": [],
    "env add": ["x", "--python", "p"],
    "env list": [],
    "env show": ["x"],
    "env remove": ["x"],
}
"""Every command a user can run (``env add`` for a sub-command), with the arguments it needs to
parse. A test that walks the parser checks this table names every command (``commands``)."""


def commands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    """Every command ``parser`` has that takes no sub-command (``turns``, ``env add``), by name."""
    found: dict[str, argparse.ArgumentParser] = {}
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs and prefix:
        found[prefix] = parser
    for sub in subs:
        for name, command in sub.choices.items():
            found.update(commands(command, f"{prefix} {name}".strip()))
    return found


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``main(argv)`` that argparse refuses: its exit code, stdout and stderr."""
    with pytest.raises(SystemExit) as refused:
        main(argv)
    out, err = capsys.readouterr()
    return int(refused.value.code or 0), out, err
