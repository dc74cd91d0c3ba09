"""The ``alphaagent`` console script: the CLI, with Ctrl-C answered the same way at every moment.

``alphaagent.cli`` imports the whole product (pydantic models, the sandbox, the viewer's
dependencies), which takes most of a second; a Ctrl-C during that import, or after the command
returned while the process shuts down, would otherwise print a ``KeyboardInterrupt`` traceback.
This module imports nothing heavy itself, so it can catch the interrupt around all of it.
"""

from __future__ import annotations

import sys

EXIT_INTERRUPTED = 130
"""The shell's convention for a process ended by Ctrl-C: 128 + SIGINT (2)."""


def main() -> int:
    """Run the CLI; exit status 130 and one line when interrupted, wherever that happens."""
    try:
        from alphaagent.cli import main as cli_main
        from alphaagent.program import program_name

        # As it was started (a symlink, another name, a relative path): what it prints pastes as is.
        return cli_main(prog=program_name(sys.argv[0]))
    except KeyboardInterrupt:
        print("alphaagent: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
