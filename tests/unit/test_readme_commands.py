"""The README's shell commands can be pasted as they are: no ``[--optional]`` or ``<placeholder>``
notation inside a code block, and every ``alphaagent`` command there parses (new-user review)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
_NOT_PASTEABLE = re.compile(r"\[--|<[A-Za-z][\w-]*>|\w\.\.\.(\s|$)")


def _shell_lines() -> list[tuple[int, str]]:
    """Each command line of the README's bash/sh blocks (continuations joined, heredoc bodies
    left out), with its line number."""
    found: list[tuple[int, str]] = []
    fence: str | None = None
    heredoc: str | None = None
    pending, start = "", 0
    for number, line in enumerate(README.read_text().splitlines(), start=1):
        if line.startswith("```"):
            fence = line[3:].strip() if fence is None else None
            continue
        if fence not in ("bash", "sh"):
            continue
        if heredoc is not None:
            heredoc = None if line.strip() == heredoc else heredoc
            continue
        if not pending:
            start = number
        pending += line.rstrip("\\")
        if line.endswith("\\"):
            continue
        if match := re.search(r"<<'?(\w+)'?", pending):
            heredoc = match.group(1)
        found.append((start, pending))
        pending = ""
    return found


def test_no_command_in_a_code_block_uses_usage_notation() -> None:
    bad = [(n, line) for n, line in _shell_lines() if _NOT_PASTEABLE.search(line.split(" #")[0])]
    assert bad == [], "README commands that cannot be pasted as they are: " + repr(bad)


def test_every_alphaagent_command_in_a_code_block_parses() -> None:
    from alphaagent.cli import _refused_option, build_parser

    parser = build_parser()
    checked = 0
    for number, line in _shell_lines():
        command = line.split(" | ")[-1].split("<<")[0].strip()
        if not re.match(r"(\S*/)?alphaagent\s", command):
            continue
        words = shlex.split(command, comments=True)
        try:
            args = parser.parse_args(words[1:])
        except SystemExit:
            pytest.fail(f"README line {number} does not parse: {line}")
        # An option the command does not take parses (one rule for every command) but is refused.
        assert _refused_option(args, "alphaagent") is None, f"README line {number}: {line}"
        checked += 1
    assert checked >= 20, "the README's commands were not found"


def test_every_alphaagent_command_in_a_code_block_works_from_any_directory() -> None:
    # A block that starts `.venv/bin/alphaagent` or reads `examples/...` worked only from the
    # checkout (new-user review): the README puts alphaagent on PATH once, in "Run a spec", and
    # names the checkout's files through $CHECKOUT, which that same line sets.
    setup = [line.split(" #")[0].strip() for _, line in _shell_lines() if line.startswith("export PATH=")]
    assert setup == ['export PATH="$PWD/.venv/bin:$PATH" CHECKOUT="$PWD"'], setup
    checked = 0
    for number, line in _shell_lines():
        command = line.split(" | ")[-1].split("<<")[0].strip()
        if not re.match(r"(\S*/)?alphaagent\s", command):
            continue
        words = shlex.split(command, comments=True)
        assert words[0] == "alphaagent", f"README line {number}: the program as found on PATH: {line}"
        relative = [w for w in words if w.startswith(("examples/", "./examples/", ".venv/"))]
        assert relative == [], f"README line {number}: a path that exists only in the checkout: {line}"
        checked += 1
    assert checked >= 20
