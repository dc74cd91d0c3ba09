"""How to start this program again, as a command a user can paste from any directory.

The help text, the usage errors and the demo's follow-up command name the program the way it was
started, so that what they print works pasted as is:

- the console script (``alphaagent``, a copy or symlink of it under another name, or
  ``.venv/bin/alphaagent`` as ``make demo`` starts it): its name when that name on ``PATH`` is the
  same program, else its absolute path;
- ``python -m alphaagent.cli``: the interpreter (its name when that name on ``PATH`` is the same
  interpreter, else its absolute path) followed by ``-m alphaagent.cli``.

This module imports nothing heavy: the console script's entry point uses it before the CLI loads.
"""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path

DEFAULT_PROGRAM = "alphaagent"
"""What the CLI calls itself when it is not started from a command line (``main(argv)`` in-process)."""


def program_name(argv0: str) -> str:
    """The console script started as ``argv0`` (``sys.argv[0]``), shell-quoted: its bare name when
    ``PATH`` finds the same file under that name (a symlink counts as the file it points to: it
    runs the same program), else its absolute path. ``alphaagent`` when ``argv0`` is empty."""
    if not argv0:
        return DEFAULT_PROGRAM
    started = Path(argv0)
    on_path = shutil.which(started.name)
    if on_path is not None and Path(on_path).resolve() == started.absolute().resolve():
        return shlex.quote(started.name)
    return shlex.quote(str(started.absolute()))


def module_program(executable: str | None = None) -> str:
    """``python -m alphaagent.cli`` as this interpreter (``executable``, default ``sys.executable``)
    is reached: its bare name when ``PATH`` finds this very file under that name, else its absolute
    path. Not resolved through symlinks: a virtual environment's ``bin/python`` is a symlink to the
    system interpreter, and only the link's path runs with the environment's packages."""
    interpreter = Path(executable or sys.executable).absolute()
    on_path = shutil.which(interpreter.name)
    same = on_path is not None and Path(on_path).absolute() == interpreter
    python = interpreter.name if same else str(interpreter)
    return f"{shlex.quote(python)} -m alphaagent.cli"
