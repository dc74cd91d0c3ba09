"""The ``alphaagent`` command line.

Exit codes: 0 when the run's status is ``ok``; 1 when user code failed, timed out or was killed;
2 for usage errors (one line naming the problem, nothing written) and platform failures.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from pydantic import ValidationError

from alphaagent.errors import AlphaAgentError, InvalidRequestError
from alphaagent.models.run import RunLimits

EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE = 0, 1, 2
_LIMIT_FLAGS = {"timeout_s": "--timeout", "memory_mb": "--memory-mb"}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"alphaagent: error: {message}\n")


def _fail(message: str) -> int:
    print(f"alphaagent: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _limits_from(args: argparse.Namespace) -> RunLimits:
    values = {"timeout_s": args.timeout, "memory_mb": args.memory_mb}
    try:
        return RunLimits(**{k: v for k, v in values.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        flag = _LIMIT_FLAGS.get(str(first["loc"][0]), str(first["loc"][0]))
        raise InvalidRequestError(f"{flag}: {first['msg'].lower()}") from None


def _read_code(source: str) -> bytes:
    if source == "-":
        return sys.stdin.buffer.read()
    path = Path(source)
    if not path.is_file():
        raise InvalidRequestError(f"{source}: no such file")
    return path.read_bytes()


def cmd_exec(args: argparse.Namespace) -> int:
    """Run a file (or stdin) exactly as ``run_in_env`` would and print the result."""
    from alphaagent.sandbox.supervisor import Sandbox, _validate_code, _validate_workdir, iter_result_lines

    limits = _limits_from(args)
    code = _validate_code(_read_code(args.file))
    workdir = _validate_workdir(Path(args.workdir))
    with Sandbox() as sandbox:
        result = sandbox.run(code, cwd=workdir, limits=limits, network=args.network == "on")
    if args.json:
        print(result.model_dump_json(indent=2))
    else:
        for line in iter_result_lines(result):
            print(line)
    return EXIT_OK if result.status == "ok" else EXIT_RUN_FAILED


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the demo analysis on the embedded default."""
    from alphaagent.demo import run_demo

    return run_demo(json_output=args.json)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="alphaagent", description="The code-execution plane for AI agents.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("exec", help="run Python in the sandbox, exactly as run_in_env would")
    run.add_argument("file", metavar="FILE|-", help="the code to run ('-' reads standard input)")
    run.add_argument("--workdir", default=".", help="working directory of the run (default: .)")
    run.add_argument("--timeout", type=float, metavar="SECONDS", help="wall-clock limit (default 60)")
    run.add_argument("--memory-mb", type=int, metavar="N", help="address-space limit in MiB (default 2048)")
    run.add_argument("--network", choices=("on", "off"), default="off", help="network access (default off)")
    run.add_argument("--json", action="store_true", help="print the run result as JSON")
    run.set_defaults(handler=cmd_exec)

    demo = sub.add_parser("demo", help="run the demo analysis on the embedded default")
    demo.add_argument("--json", action="store_true", help="print the results as JSON")
    demo.set_defaults(handler=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``alphaagent`` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.handler(args)
    except InvalidRequestError as exc:
        return _fail(str(exc))
    except AlphaAgentError as exc:
        return _fail(f"{type(exc).__name__}: {exc}")
    except KeyboardInterrupt:
        return _fail("interrupted")
    return code


if __name__ == "__main__":
    sys.exit(main())
