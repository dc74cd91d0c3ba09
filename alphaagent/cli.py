"""The ``alphaagent`` command line.

Exit codes: 0 success; 1 the work failed (a run's code failed, timed out or was killed; a turn
failed) or the thing asked for was not found; 2 a usage error or bad input (one line naming the
field or path, nothing written) or a platform failure. ``submit``, which talks to a deployed stack,
exits 2 when AWS refuses, cannot be reached or has no credentials (a platform failure: nothing of
the turn ran), and 1 when ``--wait`` times out (the turn goes on and may still finish).
130 interrupted (Ctrl-C: the run's processes are killed, the turn is recorded as failed and its
lease released first). 141 standard output was closed by its reader (``| head -1``): the command
stops quietly, as a Unix tool killed by SIGPIPE.

The data directory is ``--home``, else ``$ALPHAAGENT_HOME``, else
``${XDG_DATA_HOME:-~/.local/share}/alphaagent`` (``alphaagent.api.alphaagent_home``); read commands
never create it. Every command has one identity: ``--user``, else ``$ALPHAAGENT_USER``, else
``local``; a command that reads a scope answers for another user's conversation exactly as for one
that does not exist.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path, PurePath, PurePosixPath
from typing import TYPE_CHECKING, Any, Final, NoReturn, cast

from alphaagent.errors import (
    AlphaAgentError,
    InvalidArgumentError,
    InvalidRequestError,
    InvalidSettingError,
    InvalidSpecError,
    ModelConfigError,
    NotFoundError,
    PathRuleError,
)
from alphaagent.models.bounds import (
    ENVIRONMENT_ID_PATTERN,
    MAX_MEMORY_MB,
    MAX_TIMEOUT_S,
    MIN_MEMORY_MB,
    SCOPE_ID_PATTERN,
)
from alphaagent.program import DEFAULT_PROGRAM
from alphaagent.suggest import did_you_mean, did_you_mean_name
from alphaagent.wording import (
    ENVIRONMENT_ID_RULE,
    SCOPE_ID_RULE,
    USER_ID_RULE,
    id_refusal,
    number_rule,
    shown_json,
    shown_typed,
)

# Only the standard library and the error classes at import: `--version`, `COMMAND --help` and a
# usage error answer without pydantic or the backend (benchmarked by bench/cli_start.py); each
# command imports what it uses.
if TYPE_CHECKING:
    from datetime import datetime

    from pydantic import BaseModel

    from alphaagent.api import AlphaAgent
    from alphaagent.domain.turns import Coder
    from alphaagent.environments import Environment
    from alphaagent.models.common import Scope
    from alphaagent.models.records import Turn, TurnResult
    from alphaagent.models.run import RunLimits
    from alphaagent.models.spec import Spec
    from alphaagent.sandbox.config import SandboxConfig

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_PLATFORM = EXIT_USAGE  # the platform failed (AWS refused, unreachable, no credentials)
EXIT_INTERRUPTED = 128 + 2  # 128 + SIGINT, what shells report for a command ended by Ctrl-C
EXIT_BROKEN_PIPE = 128 + 13  # 128 + SIGPIPE: what shells report for `yes | head -1`'s yes
DEFAULT_USER = "local"
USER_ENV = "ALPHAAGENT_USER"
_LIMIT_FLAGS = {"timeout_s": "--timeout", "memory_mb": "--memory-mb"}
_SUBMIT_TIMEOUT_S = 3600.0


class _RecordedStore(argparse._StoreAction):
    """The ``store`` action of every option, which also notes each value an option that takes one
    was given (``--conversation``, ``--limit``, ``-o``, the global ``--home`` and ``--user``),
    wherever it was given: argparse keeps only the last, and a second ``--conversation`` with
    another value must be refused, not win silently (``_given_twice``)."""

    typed = ""
    """The words of the value being stored, as typed (set by the parser's ``_get_values``)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, *rest: Any) -> None:
        if self.option_strings:  # positionals are given once by construction
            _GIVEN.setdefault("/".join(self.option_strings), []).append((rest[0], self.typed))
        super().__call__(parser, namespace, *rest)


_GIVEN: dict[str, list[tuple[Any, str]]] = {}
"""Each value given to each option that takes one while ``main`` parses, in order, under the
option's names (``-o/--output``): as converted (``--limit 03`` is 3, the same as ``--limit 3``)
and as typed (what a refusal shows)."""


class _Number:
    """The type of every numeric option, with its range. A value that is not such a number, or is
    out of range, is refused by ``_Parser`` in the one line every option's value gets, naming the
    option and the rule: ``--limit: must be a whole number ≥ 1, got 'abc'`` (new-user review:
    argparse said "argument --limit: invalid int value: 'abc'"). ``low``/``high`` are inclusive;
    ``above`` is an exclusive lower bound (a timeout must be > 0 seconds); ``unit`` is what a number
    of that option counts (``seconds``)."""

    def __init__(
        self,
        kind: type[int] | type[float],
        *,
        low: float | None = None,
        high: float | None = None,
        above: float | None = None,
        unit: str = "",
    ) -> None:
        self.kind, self.low, self.high, self.above = kind, low, high, above
        self.rule = number_rule(kind is int, low=low, high=high, above=above, unit=unit)
        self.__name__ = self.rule  # what argparse would name the type with

    def __call__(self, text: str) -> int | float:
        """The number ``text`` says; ``ValueError`` when it is none or out of range."""
        value = self.kind(text.strip())  # int("2.5") and float("x") raise ValueError
        if not value == value or value in (float("inf"), float("-inf")):  # nan, inf
            raise ValueError(text)
        if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
            raise ValueError(text)
        if self.above is not None and value <= self.above:
            raise ValueError(text)
        return value


class _Id:
    """The type of an id a command is given (``env add ID``, ``--conversation``): checked when
    argparse reads the value, so a bad id is refused before a required option that is missing
    (new-user review: ``env add 'BAD!ID'`` without ``--python`` said --python was required, and only
    the next try said the id could never be registered). ``refusal`` is the line's rule, given the
    value as typed; the same words the command's own check has always used."""

    def __init__(self, pattern: str, refusal: Callable[[str], str]) -> None:
        import re

        self.pattern, self.refusal = re.compile(pattern), refusal
        self.__name__ = "id"

    def __call__(self, text: str) -> str:
        """``text`` when it is such an id; ``ValueError`` otherwise."""
        if self.pattern.fullmatch(text) is None:
            raise ValueError(text)
        return text


_SCOPE_ID = _Id(SCOPE_ID_PATTERN, lambda text: id_refusal(SCOPE_ID_RULE, shown_typed(text)))
_ENVIRONMENT_ID = _Id(ENVIRONMENT_ID_PATTERN, lambda text: id_refusal(ENVIRONMENT_ID_RULE, shown_typed(text)))


def _option_name(action: argparse.Action) -> str:
    """How a usage error names an option: its long flag (``--output`` for ``-o/--output``), or a
    positional argument's metavar (``ID``)."""
    if action.option_strings:
        return max(action.option_strings, key=len)
    return str(action.metavar or action.dest)


_COUNT = _Number(int, low=1)
"""``--limit N`` and ``--version N``: 1, 2, ..."""
_SECONDS = _Number(float, above=0, unit="seconds")
_RUN_SECONDS = _Number(float, above=0, high=MAX_TIMEOUT_S, unit="seconds")
_MEMORY_MB = _Number(int, low=MIN_MEMORY_MB, high=MAX_MEMORY_MB, unit="MiB")
_PORT = _Number(int, low=0, high=65535)


class _Parser(argparse.ArgumentParser):
    describe_home = False
    """Whether the help ends its description with where the data directory is (the top-level
    help): read from the settings when the help is shown, so that building the parser reads none."""

    def format_help(self) -> str:
        if self.describe_home and self.description is not None:
            self.description += (
                f"\n\ndata directory: {_where_home(self.home_given)}\nidentity:       {_IDENTITY}"
            )
            self.describe_home = False
        return super().format_help()

    home_given: str | None = None
    """The ``--home`` of ``help --home DIR``: the data directory its help names."""

    def print_help(self, file: Any = None) -> None:
        # argparse's own swallows a failed write: a help piped to `| head -1` must end as every
        # other output does when its reader went away (main: 141), not exit 0 as if all was read.
        if _JSON_FLAG in _ARGV:
            # `run --help --json`: the help as JSON, as `help run --json` prints it (argparse's
            # --help action prints and exits before --json is even read).
            (file or sys.stdout).write(json.dumps(help_document(self, self.command_path), indent=2) + "\n")
            return
        (file or sys.stdout).write(self.format_help())

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", None, _RecordedStore)
        self.register("action", "store", _RecordedStore)

    _width: int | None = None
    """The help's width in columns, as argparse's formatter takes it (the terminal's less 2): asked
    once per parser."""

    def _get_formatter(self) -> argparse.HelpFormatter:
        # argparse makes a formatter for each add_argument (to check its metavar) and each one asks
        # the terminal for its size (the environment's COLUMNS, then an ioctl): ~160 times for the
        # ~160 options, ~2.5 ms of every command (bench/cli_start.py). One command's help has one width.
        if self._width is None:
            import shutil

            self._width = shutil.get_terminal_size().columns - 2
        return self.formatter_class(prog=self.prog, width=self._width)  # type: ignore[call-arg]

    command_path = ""
    """The command this parser reads (``turns``, ``env list``; empty for the program itself), which a
    usage error names: set by ``_globals_anywhere``."""

    program = DEFAULT_PROGRAM
    """How the program was started (``alphaagent``), for a line that names one of its options."""

    _parsing: Sequence[str] = ()
    """The words this parser is reading (``parse_known_args``), for ``_check_value``."""

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        # What was typed, for a "given twice" line: argparse hands the action only the converted
        # value (`--timeout 5` would show as 5.0).
        if isinstance(action, _RecordedStore):
            action.typed = " ".join(arg_strings)
        return super()._get_values(action, arg_strings)

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        # A command name argparse does not know: the closest one, not the whole list (new-user
        # review: `histroy` said "invalid choice" and listed seventeen commands).
        if isinstance(action, argparse._SubParsersAction) and value not in action.choices:
            # `--hmoe /tmp/x turns`: argparse takes the value of the option it does not know for
            # the command; the option is the mistake, and is named first.
            option = self._unknown_option_before(value)
            if option is not None:
                raise argparse.ArgumentError(None, self._stray(option, self._command_after(value, action)))
            where = f" for {self.command_path}" if self.command_path else ""
            guess = did_you_mean(value, action.choices)
            raise argparse.ArgumentError(None, f"{value}: unknown command{where}{guess}")
        if action.choices is not None and value not in action.choices:
            # The one rule of an option's value (_Number), for a choice: not argparse's own words.
            known = ", ".join(map(str, action.choices))
            name = _option_name(action)
            raise argparse.ArgumentError(None, f"{name}: must be one of {known}, got {shown_typed(value)}")
        super()._check_value(action, value)

    def _unknown_option_before(self, value: str) -> str | None:
        """The word before ``value`` when it is an option (``--hmoe``) this parser does not know."""
        words = list(self._parsing)
        at = words.index(value) if value in words else 0
        word = words[at - 1] if at > 0 else ""
        if not word.startswith("-") or word in ("-", "--") or "=" in word:
            return None
        known = any(option.startswith(word) for option in self._option_string_actions)
        return None if known else word

    def _command_after(self, value: str, action: argparse._SubParsersAction[Any]) -> list[str]:
        """The command named after ``value`` (``turns``; ``env list``), as words; empty if none."""
        words = list(self._parsing)
        rest = words[words.index(value) + 1 :] if value in words else []
        return self._command_in(rest, action)

    @staticmethod
    def _command_in(words: Sequence[str], action: argparse._SubParsersAction[Any]) -> list[str]:
        name = next((word for word in words if word in action.choices), None)
        if name is None:
            return []
        inner = next(
            (a for a in action.choices[name]._actions if isinstance(a, argparse._SubParsersAction)), None
        )
        deeper = [] if inner is None else _Parser._command_in(words[list(words).index(name) + 1 :], inner)
        return [name, *deeper]

    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
        if isinstance(action.type, _Id):
            try:
                return action.type(arg_string)
            except ValueError:
                refusal = action.type.refusal(arg_string)
                raise argparse.ArgumentError(None, f"{_option_name(action)}: {refusal}") from None
        if isinstance(action.type, _Number):
            try:
                return action.type(arg_string)
            except ValueError:
                rule = action.type.rule
                raise argparse.ArgumentError(
                    None, f"{_option_name(action)}: must be {rule}, got {shown_typed(arg_string)}"
                ) from None
        return super()._get_value(action, arg_string)

    def _match_argument(self, action: argparse.Action, arg_strings_pattern: str) -> int:
        try:
            return super()._match_argument(action, arg_strings_pattern)
        except argparse.ArgumentError:
            if not action.option_strings or action.nargs is not None:
                raise
            # `turns --limit` with nothing after it: argparse said "argument --limit: expected one
            # argument"; the one rule names the option and what it takes.
            if isinstance(action.type, _Number):
                rule = action.type.rule
            elif action.choices is not None:
                rule = "one of " + ", ".join(map(str, action.choices))
            else:
                rule = f"a value ({action.metavar or action.dest.upper()})"
            raise argparse.ArgumentError(None, f"{_option_name(action)}: needs {rule}") from None

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        # argparse hands what a command did not know up to the program, whose error then points
        # at the program's help: this command refuses it itself, naming itself and its help.
        self._parsing = list(sys.argv[1:] if args is None else args)
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            sub = next((a for a in self._actions if isinstance(a, argparse._SubParsersAction)), None)
            command = [] if sub is None else self._command_in(self._parsing, sub)
            self.error(self._stray(extras[0], command))
        return parsed, extras

    def _stray(self, word: str, command: Sequence[str] = ()) -> str:
        """The line refusing ``word``, which this command does not know; ``command`` is the one
        named after it (``turns``), whose own option it may be, put before its name."""
        where = f" for {self.command_path}" if self.command_path else ""
        if word.startswith("-") and word != "-":
            option = word.split("=", 1)[0]
            theirs = self._leaf(command)._option_string_actions.get(option) if command else None
            if theirs is not None:
                at = self._parsing.index(word)
                moved = [word] if "=" in word or theirs.nargs == 0 else self._parsing[at : at + 2]
                import shlex

                put = " ".join([self.prog, *command, shlex.join(moved)])
                return f"{option}: an option of the command; put it after the command: {put}"
            if not command and option in self._commands_options():
                # `alphaagent --conversation penguins`: no guess among the program's own options
                # (--version is "close" to --conversation), but where it goes.
                after = f"{self.prog} COMMAND {option} ..."
                return f"{option}: an option of a command; give it after the command ({after})"
            if option == "--version" and self.command_path:
                return f"{option}: unknown option{where} (the program's version: {self.program} --version)"
            # Only the options the help lists: a hidden global one would be refused anyway.
            known = [o for a in self._actions if a.help != argparse.SUPPRESS for o in a.option_strings]
            return f"{option}: unknown option{where}{did_you_mean(option, known)}"
        return f"{word!r}: unexpected argument{where}"

    def _commands_options(self) -> set[str]:
        """The options of the commands under this one (their help lists), at any depth."""
        found: set[str] = set()
        for sub in (a for a in self._actions if isinstance(a, argparse._SubParsersAction)):
            for command in sub.choices.values():
                found.update(
                    o for a in command._actions if a.help != argparse.SUPPRESS for o in a.option_strings
                )
                if isinstance(command, _Parser):
                    found |= command._commands_options()
        return found

    def _leaf(self, command: Sequence[str]) -> argparse.ArgumentParser:
        """The parser of ``command`` (words under this one)."""
        parser: argparse.ArgumentParser = self
        for name in command:
            sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
            parser = sub.choices[name]
        return parser

    def error(self, message: str) -> NoReturn:
        text = f"{message} (see {self.prog} --help)"
        if _JSON_FLAG in _ARGV:  # a script asked for JSON: it gets the usage error as JSON too
            print(json.dumps(_cli_error(text, EXIT_USAGE)))
        self.exit(EXIT_USAGE, f"alphaagent: error: {text}\n")


_JSON_FLAG = "--json"
_ARGV: list[str] = []
"""The arguments being parsed, so a usage error can honour ``--json`` before parsing succeeded."""

CLI_ERROR_KEY = "cli_error"
"""The one key of the JSON a command prints when the command itself failed. Not ``error``: that
key is the code's error inside a result (a run's or a turn's ``{name, value, traceback}``), so a
script tells "the command failed" from "the work failed" by the key alone."""


def _cli_error(message: str, code: int) -> dict[str, Any]:
    return {CLI_ERROR_KEY: {"message": message, "exit_code": code}}


def _fail(message: str, code: int = EXIT_USAGE, *, as_json: bool = False) -> int:
    """Say why the command failed in one line on standard error; with ``as_json`` (the command's
    ``--json``) also as ``{"cli_error": {"message", "exit_code"}}`` on standard output, so a script
    that parses the output gets an answer it can read whatever happened."""
    print(f"alphaagent: error: {message}", file=sys.stderr)
    if as_json:
        print(json.dumps(_cli_error(message, code)))
    return code


def _emit(args: argparse.Namespace, data: Any, lines: Sequence[str]) -> None:
    from pydantic import BaseModel

    from alphaagent.models.common import printable_text

    if args.json:
        payload = data.model_dump(mode="json") if isinstance(data, BaseModel) else data
        print(json.dumps(payload, indent=2, default=str))
    else:
        # Lines for people carry what code produced (names, messages, tracebacks): never obeyed
        # by the terminal.
        for line in lines:
            print(printable_text(line))


def _dump(items: Sequence[BaseModel]) -> list[Any]:
    return [item.model_dump(mode="json") for item in items]


# ----------------------------------------------------------------------------- exec


def _limits_from(args: argparse.Namespace) -> RunLimits:
    from pydantic import ValidationError

    from alphaagent.models.run import RunLimits

    values = {"timeout_s": args.timeout, "memory_mb": args.memory_mb}
    try:
        return RunLimits(**{k: v for k, v in values.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        flag = _LIMIT_FLAGS.get(str(first["loc"][0]), str(first["loc"][0]))
        raise InvalidRequestError(f"{flag}: {first['msg'].lower()}") from None


def _read_input(source: str, what: str) -> bytes:
    limit = 4 * 2**20 + 1  # above both the 4 MiB code limit and the 64 KiB spec limit
    if source == "-":
        data = sys.stdin.buffer.read(limit)
        if len(data) >= limit:
            raise InvalidRequestError(f"standard input: larger than the {what} size limit")
        return data
    path = Path(source)
    if path.is_dir():
        raise InvalidRequestError(f"{source}: is a directory, not a file")
    if not path.is_file():
        raise InvalidRequestError(f"{source}: no such file")
    if path.stat().st_size >= limit:
        raise InvalidRequestError(f"{source}: larger than the {what} size limit")
    return path.read_bytes()


def _exec_environment(
    args: argparse.Namespace, limits: RunLimits
) -> tuple[SandboxConfig | None, RunLimits, bool]:
    """The sandbox settings, limits and network of ``exec``: builtin's defaults without ``--env``;
    with it, the registered local environment's interpreter and preload, the limits lowered to its
    ceilings and network only where it allows it, as a spec's runs there get (nothing is created:
    the registry is read from the data directory)."""
    network = args.network == "on"
    if args.env is None:
        return None, limits, network
    from alphaagent.environments import LocalStart, check_environment
    from alphaagent.local.executor import config_for
    from alphaagent.sandbox.config import SandboxConfig

    with _agent(args) as agent:
        try:
            environment = check_environment(agent.environments, args.env, shown_typed)
        except InvalidSpecError as exc:
            raise InvalidRequestError(f"--env: {str(exc).removeprefix('environment_id: ')}") from None
    if not isinstance(environment.start, LocalStart):
        raise InvalidRequestError(f"--env: environment {args.env!r} runs on AWS Lambda, not locally")
    ceilings = environment.limits
    return config_for(SandboxConfig(), environment), ceilings.bound(limits), network and ceilings.network


def cmd_exec(args: argparse.Namespace) -> int:
    """Run a file (or stdin) exactly as ``run_in_env`` would, its output shown as it is produced,
    and print the result: without ``--json`` the run's stdout, then its stderr lines prefixed
    ``stderr | `` go to standard output as they come, then the status lines; with ``--json`` they
    go to standard error, and standard output is the result alone."""
    import tempfile

    from alphaagent.models.common import printable_path
    from alphaagent.sandbox.scratch import remove_path
    from alphaagent.sandbox.supervisor import Sandbox, _validate_code, _validate_workdir, iter_result_lines
    from alphaagent.sandbox.waiting import waits_told_to
    from alphaagent.terminal import LiveOutput

    limits = _limits_from(args)
    code = _validate_code(_read_input(args.file, "code"))
    config, limits, network = _exec_environment(args, limits)
    live = LiveOutput(sys.stderr if args.json else sys.stdout, stdout_prefix="", stderr_prefix="stderr | ")
    temporary = args.workdir is None
    with contextlib.ExitStack() as stack:
        # Untrusted code may change or delete anything in its working directory, and every file in
        # it is walked and reported: never the folder the user happens to be in, unless asked for.
        if temporary:
            folder = Path(tempfile.mkdtemp(prefix="alphaagent-exec-"))
            # remove_path, not TemporaryDirectory's rmtree: the code may nest folders thousands
            # deep, lock them (chmod 000) or plant symlinks; whatever is left never loses the result.
            stack.callback(remove_path, folder)
            workdir = _validate_workdir(folder)
        else:
            try:
                workdir = _validate_workdir(Path(args.workdir))
            except InvalidRequestError as exc:  # the rule's words, under the flag the user gave
                raise InvalidRequestError(f"--workdir: {str(exc).removeprefix('workdir: ')}") from None
        # A start of more than a second is said on stderr, never in --json's standard output.
        stack.enter_context(waits_told_to(lambda line: print(line, file=sys.stderr, flush=True)))
        sandbox = stack.enter_context(Sandbox(config, label=args.env or "builtin"))
        result = sandbox.run(code, cwd=workdir, limits=limits, network=network, on_output=live)
    live.end_lines()
    if temporary:
        # The spill files went with the folder: no path to a file that no longer exists.
        result = result.model_copy(update={"stdout_path": None, "stderr_path": None})
        full_output = "full output: not kept (the temporary folder is removed; give --workdir DIR to keep it)"
    else:
        # Spill paths are relative to the working directory; shown from where the command ran.
        spills = (result.stdout_path, result.stderr_path)
        full_output = "full output: " + " ".join(
            "-" if path is None else printable_path(str(Path(args.workdir) / path)) for path in spills
        )
    # The output was shown as it came; what is left to print is the error and the status lines.
    shown = result.model_copy(update={"stdout": "", "stderr": ""})
    _emit(args, result, list(iter_result_lines(shown, full_output=full_output)))
    return EXIT_OK if result.status == "ok" else EXIT_FAILED


# ----------------------------------------------------------------------------- turns


def _scope_from(args: argparse.Namespace, *, required: bool = True) -> Scope | None:
    from pydantic import ValidationError

    from alphaagent.models.common import ConversationScope, NodeScope

    conversation = getattr(args, "conversation", None)
    workflow, node = getattr(args, "workflow", None), getattr(args, "node", None)
    try:
        if conversation is not None and (workflow is not None or node is not None):
            raise InvalidRequestError("give --conversation, or --workflow with --node, not both")
        if conversation is not None:
            return ConversationScope(conversation_id=conversation)
        if workflow is not None or node is not None:
            if workflow is None or node is None:
                raise InvalidRequestError("--workflow and --node go together")
            return NodeScope(workflow_execution_id=workflow, node_id=node)
    except ValidationError as exc:
        field, typed = str(exc.errors()[0]["loc"][0]), str(exc.errors()[0]["input"])
        flag = {
            "conversation_id": "--conversation",
            "workflow_execution_id": "--workflow",
            "node_id": "--node",
        }[field]
        raise InvalidRequestError(f"{flag}: {id_refusal(SCOPE_ID_RULE, shown_typed(typed))}") from None
    if required:
        raise InvalidRequestError("name the scope: --conversation ID, or --workflow EXEC --node ID")
    return None


def _required_scope(args: argparse.Namespace) -> Scope:
    scope = _scope_from(args)
    assert scope is not None  # _scope_from raises when a required scope is missing
    return scope


def _agent(args: argparse.Namespace, *, with_coder: bool = False, writes: bool = False) -> AlphaAgent:
    """The local backend on the data directory (``--home``, else ``$ALPHAAGENT_HOME``, else the
    per-user default). Only commands that ``writes`` may create it: a read of a missing data
    directory answers like a read of an empty one, and leaves nothing behind."""
    from alphaagent.api import AlphaAgent

    return AlphaAgent(
        _home(args),
        coder=_coder() if with_coder else None,
        read_only=not writes,
    )


def _home(args: argparse.Namespace) -> Path:
    """The data directory (``--home``, else ``$ALPHAAGENT_HOME``, else the per-user default);
    ``InvalidRequestError`` naming where it came from when it is a file, before any command uses
    it (not an ``OSError`` of the file half-way through a turn)."""
    from alphaagent.local.settings import alphaagent_home, local_settings

    home = alphaagent_home(getattr(args, "home", None))
    if home.exists() and not home.is_dir():
        if getattr(args, "home", None):
            source = "--home"
        else:
            source = "$ALPHAAGENT_HOME" if local_settings().ALPHAAGENT_HOME else "the data directory"
        raise InvalidRequestError(f"{source}: {home} is not a directory")
    return home


def _coder() -> Coder | None:
    """The model-backed coder when a model is configured (``coder.settings``) and the ``coder``
    extra is installed; otherwise ``None`` (a spec without steps is then refused, naming what to set)."""
    from alphaagent.client import configured_coder

    return configured_coder(on_missing=lambda message: print(f"alphaagent: {message}", file=sys.stderr))


_SPEC_SCOPE_HINT: Final = {
    "scope": "name the scope in the spec or with --conversation ID (or --workflow EXEC --node ID)"
}
"""What ``run`` and ``submit`` say of a spec without a scope: the flags that supply one."""


def _spec_from(args: argparse.Namespace, *, local_files: bool = False) -> Spec:
    """The spec file (or stdin) of ``run``/``submit``, with the command's identity and scope flags.

    The identity rule: a spec without ``user_id`` runs as the command's user (``--user``, else
    ``$ALPHAAGENT_USER``, else ``local``); a spec whose ``user_id`` disagrees with a user given
    explicitly (``--user`` or ``$ALPHAAGENT_USER``) is refused, since the later reads as that user
    would not find it. A relative ``path`` of a ``file`` connector input is resolved against the
    spec file's folder (the current directory for standard input), so a spec runs the same from
    wherever the command is started. With ``local_files`` (``run``: the local backend's roots) such
    a path is checked against ``ALPHAAGENT_FILE_ROOTS`` here, so that a refusal shows it as typed.
    """
    from alphaagent.models.spec import parse_spec

    raw = _read_input(args.spec, "spec")
    overrides: dict[str, Any] = {}
    scope = _scope_from(args, required=False)
    if scope is not None:
        overrides["scope"] = scope.model_dump()
    spec = parse_spec(raw, overrides, defaults={"user_id": args.user}, missing=_SPEC_SCOPE_HINT)
    if spec.user_id != args.user and args.user_source is not None:
        raise InvalidSpecError(
            f"user_id: the spec says {shown_json(spec.user_id)} but {args.user_source} says"
            f" {shown_typed(args.user)};"
            " drop one of them"
        )
    base = Path.cwd() if args.spec == "-" else Path(args.spec).absolute().parent
    return _with_file_paths_under(spec, base, check_local=local_files)


def _with_file_paths_under(spec: Spec, base: Path, *, check_local: bool = False) -> Spec:
    from alphaagent.models.spec import ConnectorInput

    inputs = []
    for i, item in enumerate(spec.inputs):
        path = item.request.get("path") if isinstance(item, ConnectorInput) else None
        relative = isinstance(path, str) and "\x00" not in path and not Path(path or "/").is_absolute()
        if isinstance(item, ConnectorInput) and item.connector == "file" and relative:
            item = item.model_copy(update={"request": {**item.request, "path": str(base / str(path))}})
            if check_local:
                _check_local_file(i, item.request, str(path))
        inputs.append(item)
    return spec.model_copy(update={"inputs": inputs})


def _check_local_file(index: int, request: Mapping[str, Any], typed: str) -> None:
    """Refuse a spec's relative ``file`` input that the local roots do not allow, showing the path
    as the spec has it (``"data.csv" (resolves to /home/me/specs/data.csv) is outside ...``), not
    the absolute path it was made (the backend checks it again, with the data directory, later)."""
    from alphaagent.connectors import check_request
    from alphaagent.connectors import file as file_connector
    from alphaagent.errors import ToolError
    from alphaagent.local.settings import local_settings

    settings = local_settings().connector_settings
    try:
        parsed = cast(file_connector.Request, check_request("file", request))
        file_connector.check(parsed, settings.of("file"), settings.limits, typed=typed)
    except ToolError as exc:
        raise InvalidSpecError(f"inputs[{index}].{exc}") from None


def _emit_turn_result(args: argparse.Namespace, result: TurnResult, scope_root: PurePath) -> int:
    """Print a turn's result (artifact paths under ``scope_root``); the exit code of its status."""
    lines = [f"turn {result.turn_id}: {result.status}"]
    if result.summary:
        lines.append(result.summary)
    if result.error:
        where = f" in {result.failed_step}" if result.failed_step else ""
        lines.append(f"error{where}: {result.error.name}: {result.error.value}")
        if result.error.traceback:
            lines.append(result.error.traceback.rstrip())
    for artifact in result.artifacts:
        lines.append(f"  {artifact.kind:8} {artifact.name} v{artifact.version}  {scope_root / artifact.path}")
    for citation in result.citations:
        lines.append(f"  cites    {citation.source}" + (f" ({citation.claim})" if citation.claim else ""))
    _emit(args, result, lines)
    return EXIT_OK if result.status == "completed" else EXIT_FAILED


def _running_as(args: argparse.Namespace, spec: Spec) -> str:
    """The first progress line of ``run``: the user and scope the turn runs as, and where the user
    came from, so that a later read as another user (``conversation X not found``) is explained."""
    from alphaagent.domain.labels import scope_label

    source = "the spec's user_id" if spec.user_id != args.user else args.user_source or "the default"
    return f"running as user {spec.user_id!r} ({source}) in {scope_label(spec.scope)}"


def cmd_run(args: argparse.Namespace) -> int:
    """Run a spec end to end on the local backend: progress and each run's output, as it is
    produced, on standard error (output lines prefixed ``  | `` and ``  stderr | ``); the result on
    standard output."""
    from alphaagent.models.common import printable_text
    from alphaagent.sandbox.waiting import waits_told_to
    from alphaagent.terminal import LiveOutput, ReaderMayLeave

    spec = _spec_from(args, local_files=True)
    watcher = ReaderMayLeave(sys.stderr)  # a reader of the progress that leaves fails no turn
    live = LiveOutput(watcher, stdout_prefix="  | ", stderr_prefix="  stderr | ")  # type: ignore[arg-type]

    def say(message: str) -> None:
        live.end_lines()  # a run's unfinished last line ends before the next progress line
        print(printable_text(message), file=watcher, flush=True)

    started: list[bool] = []

    def progress(message: str) -> None:
        # The turn's first line says whom it runs as (once its checks passed: a refusal stays one line).
        if not started:
            started.append(True)
            say(_running_as(args, spec))
        say(message)

    with _agent(args, with_coder=spec.steps is None, writes=True) as agent, waits_told_to(say):
        result = agent.run_analysis(spec, progress=progress, on_output=live)
        scope_root = agent.home / spec.scope.key
    live.end_lines()
    if args.user_source is None and spec.user_id != args.user:
        # The spec's own user_id, with no --user or $ALPHAAGENT_USER: reads need it named.
        print(
            f"ran as user {spec.user_id!r} (the spec's user_id); read its results with --user {spec.user_id}",
            file=sys.stderr,
            flush=True,
        )
    return _emit_turn_result(args, result, scope_root)


def cmd_submit(args: argparse.Namespace) -> int:
    """Send a spec to a deployed stack's SpecQueue; with ``--wait``, wait for the turn's result.

    Everything is checked before anything is sent (the queue URL, the table when waiting, the flags,
    the spec), so a usage error never leaves a turn behind. AWS failures (no credentials, no region,
    refused, unreachable) are one line and exit 2, a platform failure; a wait timeout is one line and
    exits 1. The turn itself keeps going after a timeout or an interrupted wait.
    """
    from alphaagent.aws.client import client_settings

    settings = client_settings()
    queue_url = args.queue_url or settings.spec_queue_url
    if not queue_url:
        raise InvalidRequestError(
            "--queue-url: give the stack's SpecQueueUrl output, or set ALPHAAGENT_SPEC_QUEUE_URL"
        )
    if not queue_url.startswith(("https://", "http://")):
        raise InvalidRequestError(
            f"--queue-url: {queue_url!r} is not a queue URL (https://sqs.REGION.amazonaws.com/ACCOUNT/NAME)"
        )
    table = args.table or settings.state_table
    if not args.wait and (args.table is not None or args.timeout is not None):
        raise InvalidRequestError("--table and --timeout go with --wait")
    if args.wait and not table:
        raise InvalidRequestError(
            "--table: --wait reads the result from the stack's StateTableName output;"
            " give --table NAME or set ALPHAAGENT_STATE_TABLE"
        )
    timeout_s = _SUBMIT_TIMEOUT_S if args.timeout is None else args.timeout
    spec = _spec_from(args)
    try:
        from botocore.exceptions import BotoCoreError, ClientError, NoRegionError
    except ImportError:
        return _fail("submit needs boto3 (pip install 'alphaagent[lambda]')", as_json=args.json)
    try:
        return _submit(args, spec, queue_url, table, timeout_s)
    except NoRegionError:
        return _fail(
            "AWS: no region: the queue URL names none; set AWS_REGION", EXIT_PLATFORM, as_json=args.json
        )
    except (BotoCoreError, ClientError) as exc:
        # AWS refusing or not answering is a platform failure: exit 2, as everywhere else.
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return _fail(f"AWS: {detail}", EXIT_PLATFORM, as_json=args.json)


def _submit(args: argparse.Namespace, spec: Spec, queue_url: str, table: str, timeout_s: float) -> int:
    from alphaagent.aws.client import aws_client, open_turn_waiter, queue_region, submit_spec, wait_for_turn
    from alphaagent.aws.store import DynamoStore
    from alphaagent.clock import get_clock
    from alphaagent.errors import TurnWaitTimeoutError

    region = queue_region(queue_url)
    sqs = aws_client("sqs", region)
    turn_id = submit_spec(spec, queue_url=queue_url, sqs=sqs)
    if not args.wait:
        _emit(args, {"turn_id": turn_id, "queue_url": queue_url}, [f"submitted turn {turn_id}"])
        return EXIT_OK
    print(f"submitted turn {turn_id}", file=sys.stderr, flush=True)
    store = DynamoStore(table, client=aws_client("dynamodb", region))
    clock = get_clock()

    def say(line: str) -> None:
        print(f"turn {turn_id}: {line}", file=sys.stderr, flush=True)

    # Opened before the first read of the record: an end after that read is announced on it.
    notices = open_turn_waiter(sqs, spec.user_id, turn_id, timeout_s=timeout_s, clock=clock, say=say)
    try:
        result = wait_for_turn(
            store,
            spec.user_id,
            turn_id,
            timeout_s=timeout_s,
            progress=say,
            spec_sha256=spec.digest(),
            sleep=clock.sleep,
            clock=clock.monotonic,
            notices=notices,
        )
    except TurnWaitTimeoutError as exc:
        return _fail(f"{exc}; it may still finish", EXIT_FAILED, as_json=args.json)
    finally:
        if notices is not None:
            notices.close()
    # Artifacts live in the workspaces bucket under the scope's key (DESIGN §4.2).
    return _emit_turn_result(args, result, PurePosixPath(spec.scope.key))


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the demo analysis on the embedded default, in the data directory, as the command's user."""
    from alphaagent.demo import run_demo
    from alphaagent.local.settings import local_settings

    # The follow-up it prints names the data directory unless it is the per-user default, which
    # the pasted command finds by itself wherever and whenever it runs.
    moved = args.home is not None or local_settings().home() is not None
    return run_demo(
        json_output=args.json,
        home=_home(args),
        user_id=args.user,
        program=args.prog,
        name_home=moved,
    )


def cmd_mcp(args: argparse.Namespace) -> int:
    """Serve ``run_analysis`` and the result readers over MCP for one user (``alphaagent.mcp_server``)."""
    try:
        from alphaagent.mcp_server import http_token, serve
    except ImportError:
        return _fail("mcp needs the MCP SDK (pip install 'alphaagent[mcp]')")
    from alphaagent.client import connect
    from alphaagent.local.settings import local_settings

    token = http_token(local_settings().ALPHAAGENT_MCP_TOKEN or None) if args.http is not None else None
    aws = {"queue_url": args.queue_url, "table": args.table, "bucket": args.bucket}
    if args.backend == "local" and any(aws.values()):
        raise InvalidRequestError("--queue-url, --table and --bucket go with --backend aws")
    if args.backend == "local":
        options: dict[str, Any] = {"home": _home(args)}
    else:
        options = aws
    if args.timeout is not None:
        options["timeout_s"] = args.timeout
    try:
        client = connect(backend=args.backend, user=args.user, **options)
    except InvalidArgumentError as exc:  # named as this command's flag, not the client's keyword
        flag = {"timeout_s": "--timeout"}.get(exc.argument, "--" + exc.argument.replace("_", "-"))
        raise InvalidRequestError(f"{flag}: {exc.detail}") from None
    with client:
        serve(client, http_port=args.http, token=token)
    return EXIT_OK


# ----------------------------------------------------------------------------- reads


def cmd_files(args: argparse.Namespace) -> int:
    scope = _required_scope(args)
    with _agent(args) as agent:
        try:
            files = agent.files(args.user, scope, args.prefix or "")
        except InvalidRequestError as exc:  # the prefix broke a path rule: named as the flag
            raise InvalidRequestError(f"--prefix: {str(exc).removeprefix('path ')}") from None
    data = [
        {"path": f.path, "size_bytes": f.size_bytes, "modified_at": f.modified_at.isoformat()} for f in files
    ]
    _emit(args, data, [f"{f.size_bytes:>12}  {f.modified_at:%Y-%m-%d %H:%M}  {f.path}" for f in files])
    return EXIT_OK


def cmd_cat(args: argparse.Namespace) -> int:
    """Write a file's (or an artifact version's) bytes to standard output or ``-o FILE``; refuse
    binary bytes for a terminal, where they would be garbage or escape sequences."""
    from alphaagent.models.common import printable_path
    from alphaagent.terminal import looks_binary

    scope = _required_scope(args)
    if not args.artifact and not args.path:
        raise InvalidRequestError("give a PATH, or --artifact NAME [--version N]")
    out = Path(args.output) if args.output is not None else None
    if out is not None and out.is_dir():
        raise InvalidRequestError(f"-o: {out} is a directory; give a file name")
    if out is not None and not out.parent.is_dir():
        raise InvalidRequestError(f"-o: the folder {out.parent} does not exist")
    with _agent(args) as agent:
        if args.artifact:
            _version, data = agent.artifact(args.user, scope, args.artifact, args.version)
        else:
            data = agent.read_file(args.user, scope, args.path)
    if out is not None:
        _write_new_file(out, data)
        return EXIT_OK
    if sys.stdout.isatty() and looks_binary(data):
        what = args.artifact or args.path
        raise InvalidRequestError(
            f"cat: {printable_path(what)} is binary ({len(data)} bytes); write it to a file with -o FILE"
            " or pipe it (| less, > file)"
        )
    sys.stdout.buffer.write(data)
    sys.stdout.flush()
    return EXIT_OK


def _write_new_file(out: Path, data: bytes) -> None:
    """Write ``data`` to ``out`` whole or not at all: a temporary file in the same folder renamed
    over it, so an interrupted write never leaves half a file."""
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)  # the mode a plain `> FILE` gets, not mkstemp's private 0600
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _newest_first(items: Sequence[Any], args: argparse.Namespace, what: str) -> tuple[list[Any], list[str]]:
    """``items`` (as stored: oldest first) in the order every listing of past work uses, the newest
    first (``conversations``, ``turns``, ``history`` and the viewer), cut to ``--limit``; and the
    line that says, for people, how many older ones (``what``: ``turn``, ``run``) the limit left out."""
    return _limited(list(reversed(items)), args, what)


def _limited(newest: list[Any], args: argparse.Namespace, what: str) -> tuple[list[Any], list[str]]:
    """``newest`` (newest first) cut to ``--limit``, and the line saying how many it left out."""
    shown = newest if args.limit is None else newest[: args.limit]
    left = len(newest) - len(shown)
    return shown, [f"({_count(left, f'older {what}')} not shown: --limit {args.limit})"] if left else []


def _count(n: int, noun: str) -> str:
    """``1 older turn``, ``2 older turns``: what a line for people says of ``n`` things."""
    from alphaagent.wording import count

    return count(n, noun)


def cmd_history(args: argparse.Namespace) -> int:
    """A scope's runs (or one turn's, ``--turn``, which needs no scope), newest first, with their
    stored outputs."""
    from alphaagent.models.common import printable_path, scope_from_key
    from alphaagent.sandbox.render import state_line

    scope = _scope_from(args, required=args.turn is None)
    with _agent(args) as agent:
        if scope is None:
            # A turn id is unique across users (a global idempotency key): it names its scope.
            # Another user's turn answers exactly as a missing one (agent.turn checks ownership).
            try:
                scope = scope_from_key(agent.turn(args.user, args.turn).scope_key)
            except NotFoundError:
                # The nearest of the user's own turn ids, all scopes: never another user's.
                own = [
                    turn.turn_id
                    for summary in agent.conversations(args.user)
                    for turn in agent.turns(args.user, scope_from_key(summary.scope_key))
                ]
                near = did_you_mean_name(args.turn, own)
                raise NotFoundError(
                    f"--turn: no turn {printable_path(args.turn)!r}{near} (see turns)"
                ) from None
        runs = agent.history(args.user, scope)
        turns = agent.turns(args.user, scope)
    environments = {turn.turn_id: turn.environment_id for turn in turns}
    if args.turn is not None:
        if args.turn not in environments:  # the user's own turns of this scope: nobody else's ids
            near = did_you_mean_name(args.turn, environments)
            raise NotFoundError(
                f"--turn: no turn {printable_path(args.turn)!r} in this scope{near} (see turns)"
            )
        runs = [run for run in runs if run.turn_id == args.turn]
    runs, older = _newest_first(runs, args, "run")
    lines: list[str] = []
    starts: list[tuple[datetime, int]] = []  # where each run's lines begin, for the notes below
    for run in runs:
        starts.append((run.created_at, len(lines)))
        when = f"{run.created_at:%Y-%m-%d %H:%M:%S}"
        environment = environments.get(run.turn_id)
        env = f"  env {environment}" if environment else ""
        lines.append(f"run {run.run_id}  turn {run.turn_id}{env}  {run.status}  {run.duration_ms} ms  {when}")
        code_lines = run.code.splitlines()
        lines.extend(f"  | {line}" for line in code_lines[:3])
        if len(code_lines) > 3:
            lines.append(f"  | ... ({_count(len(code_lines) - 3, 'more line')}; --json for all)")
        out_lines = run.stdout.rstrip("\n").splitlines() if run.stdout else []
        if len(out_lines) > 5:
            lines.append(f"  > ... ({_count(len(out_lines) - 5, 'earlier line')}; --json for all)")
        lines.extend(f"  > {line}" for line in out_lines[-5:])
        for stream, text, printed, cut, spill in (
            ("stdout", run.stdout, run.stdout_bytes, run.stdout_truncated, run.stdout_path),
            ("stderr", run.stderr, run.stderr_bytes, run.stderr_truncated, run.stderr_path),
        ):
            if cut:  # the marker may sit above the lines shown: both sizes are said here too
                where = f"; full output in {spill}" if spill else ""
                lines.append(
                    f"  # {stream} truncated: history keeps {len(text.encode('utf-8'))} bytes;"
                    f" the code printed {printed} bytes{where}"
                )
        if run.error:
            lines.append(f"  ! {run.error.name}: {run.error.value}")
        if run.state is not None and (state := state_line(run.state)):
            lines.append(f"  # {state}")
    # A turn ended by Ctrl-C has no record of the run it cut short (killed before it had a result):
    # said where it happened, among the runs, rather than "no runs" (new-user review).
    oldest_shown = runs[-1].created_at if older and runs else None
    for turn in _interrupted(turns, args.turn):
        assert turn.finished_at is not None  # a turn with a result has ended
        if oldest_shown is not None and turn.finished_at < oldest_shown:
            continue  # older than what --limit shows
        at = next((i for when, i in starts if when <= turn.finished_at), len(lines))
        lines.insert(
            at,
            f"turn {turn.turn_id}  interrupted (Ctrl-C) {turn.finished_at:%Y-%m-%d %H:%M:%S}:"
            " a run it cut short is not recorded (see turns)",
        )
        starts = [(when, i + 1 if i >= at else i) for when, i in starts]
    data = [run.model_dump(mode="json") | {"environment_id": environments.get(run.turn_id)} for run in runs]
    _emit(args, data, [*lines, *older] or ["no runs"])
    return EXIT_OK


def _interrupted(turns: Sequence[Turn], only: str | None) -> list[Turn]:
    """The turns (of ``only``, when given) that Ctrl-C ended, oldest first (each note is then put
    above the runs before it, and a newer note above an older one at the same place)."""
    from alphaagent.domain.turns import TURN_CANCELLED

    ended = [
        t
        for t in turns
        if t.result is not None and t.result.error is not None and t.result.error.name == TURN_CANCELLED
    ]
    return [t for t in ended if only is None or t.turn_id == only]


def _turn_row(turn: Turn) -> dict[str, Any]:
    end = turn.finished_at
    duration_ms = None if end is None else int((end - turn.started_at).total_seconds() * 1000)
    error = turn.result.error if turn.result else None
    return turn.model_dump(mode="json") | {
        "duration_ms": duration_ms,
        "error": None if error is None else error.model_dump(mode="json"),
    }


def cmd_turns(args: argparse.Namespace) -> int:
    """A scope's turns, newest first: id, status, start, duration, environment, goal and error."""
    from alphaagent.models.common import printable_path

    scope = _required_scope(args)
    with _agent(args) as agent:
        turns = agent.turns(args.user, scope)
    turns, older = _newest_first(turns, args, "turn")
    lines: list[str] = []
    for turn in turns:
        row = _turn_row(turn)
        took = "running" if row["duration_ms"] is None else f"{row['duration_ms'] / 1000:.1f} s"
        env = f"env {turn.environment_id}  " if turn.environment_id else ""
        lines.append(
            f"{turn.turn_id}  {turn.status:9}  {turn.started_at:%Y-%m-%d %H:%M:%S}  {took:>9}  {env}"
            + printable_path(turn.goal)
        )
        if turn.result and turn.result.error:
            where = f"{turn.result.failed_step}: " if turn.result.failed_step else ""
            error = turn.result.error
            lines.append(f"  ! {printable_path(where + error.name + ': ' + error.value)}")
    _emit(args, [_turn_row(turn) for turn in turns], [*lines, *older] or ["no turns"])
    return EXIT_OK


def cmd_conversations(args: argparse.Namespace) -> int:
    """The user's conversations and workflow nodes, the newest turn first."""
    from alphaagent.models.common import ConversationScope, printable_path, scope_from_key

    with _agent(args) as agent:
        summaries = agent.conversations(args.user)  # the newest turn first
    summaries, older = _limited(list(summaries), args, "conversation")
    lines, data = [], []
    for summary in summaries:
        scope = scope_from_key(summary.scope_key)
        if isinstance(scope, ConversationScope):
            name = f"conversation {scope.conversation_id}"
        else:
            name = f"workflow {scope.workflow_execution_id} node {scope.node_id}"
        turns = _count(summary.turn_count, "turn")
        lines.append(
            f"{name}  {turns}  {summary.last_status}  {summary.last_started_at:%Y-%m-%d %H:%M:%S}  "
            + printable_path(summary.last_goal)
        )
        data.append({"scope": scope.model_dump(), **summary.model_dump(mode="json")})
    _emit(args, data, [*lines, *older] or ["no conversations"])
    return EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    """The read-only workspace viewer of one user's work (local backend, or a stack with --backend aws)."""
    try:
        from alphaagent.viewer.serve import aws_reader, local_reader, serve
    except ImportError:  # pragma: no cover - the viewer's modules import no extra at import time
        return _fail("serve needs the viewer extra (pip install 'alphaagent[viewer]')")
    try:
        import jinja2  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        return _fail("serve needs the viewer extra (pip install 'alphaagent[viewer]')")
    if args.backend == "aws":
        from alphaagent.aws.client import client_settings

        table = args.table or client_settings().state_table
        bucket = args.bucket or client_settings().workspaces_bucket
        if not table:
            raise InvalidRequestError(
                "--table: give the stack's StateTableName output, or set ALPHAAGENT_STATE_TABLE"
            )
        if not bucket:
            raise InvalidRequestError(
                "--bucket: give the stack's WorkspacesBucketName output, or set ALPHAAGENT_WORKSPACES_BUCKET"
            )
        reader = aws_reader(table, bucket, args.user, args.region)
    else:
        if args.table or args.bucket or args.region:
            raise InvalidRequestError("--table, --bucket and --region go with --backend aws")

        reader = local_reader(_home(args), args.user)
    try:
        serve(reader, host=args.host, port=args.port, open_browser=args.open)
    except OSError as exc:
        return _fail(f"--host/--port: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}")
    return EXIT_OK


def cmd_artifacts(args: argparse.Namespace) -> int:
    scope = _required_scope(args)
    with _agent(args) as agent:
        versions = agent.artifacts(args.user, scope)
        outcome = {t.turn_id: t.status for t in agent.turns(args.user, scope)}
    lines = []
    for v in versions:
        # A version registered by a turn that later failed stays (versions are immutable), but it
        # is not what that turn delivered: say so beside it.
        mark = "  (its turn failed)" if outcome.get(v.turn_id) == "failed" else ""
        lines.append(
            f"{v.kind:8} {v.name:24} v{v.version:<3} {v.size_bytes:>10} B  {v.sha256[:12]}  {v.path}{mark}"
        )
    data = [v.model_dump(mode="json") | {"turn_status": outcome.get(v.turn_id)} for v in versions]
    _emit(args, data, lines or ["no artifacts"])
    return EXIT_OK


def cmd_sessions(args: argparse.Namespace) -> int:
    scope = _required_scope(args)
    with _agent(args) as agent:
        sessions = agent.sessions(args.user, scope)
    lines = []
    for s in sessions:
        state = "active" if s.is_active() else "expired"
        created, used = f"{s.created_at:%Y-%m-%d %H:%M:%S}", f"{s.last_used_at:%H:%M:%S}"
        lines.append(f"{s.session_id}  {state:7}  created {created}  last used {used}")
    data = [s.model_dump(mode="json") | {"active": s.is_active()} for s in sessions]
    _emit(args, data, lines or ["no sessions"])
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    from alphaagent.models.common import printable_path

    scope = _required_scope(args)
    out = Path(args.output)
    if out.is_dir():
        raise InvalidRequestError(f"-o: {out} is a directory; give a file name ending in .zip")
    if not out.parent.is_dir():
        raise InvalidRequestError(f"-o: the folder {out.parent} does not exist")
    with _agent(args) as agent:
        report = agent.export(args.user, scope, out)
    lines = [f"wrote {report.path}: {len(report.included)} files, {report.total_bytes} bytes"]
    for omitted in report.omitted:
        why = (
            f"over the {report.max_file_bytes} byte ceiling"
            if omitted.reason == "too_large"
            else omitted.reason
        )
        lines.append(f"omitted {printable_path(omitted.path)} ({omitted.size_bytes} bytes): {why}")
    _emit(args, {"path": str(report.path), **report.manifest()}, lines)
    return EXIT_OK


# ----------------------------------------------------------------------------- environments

_ENV_FLAGS = {
    "environment_id": "ID",
    "python": "--python",
    "preload": "--preload",
    "description": "--description",
    "timeout_s": "--timeout",
    "memory_mb": "--memory-mb",
}
"""The argument of ``env add`` (and ``env remove``'s ``ID``) that sets each field an
``InvalidEnvironmentError`` may name: a refusal names what the user typed, not the model's field."""


def _environment_lines(environment: Environment, *, full: bool = False) -> list[str]:
    from alphaagent.environments import LocalStart

    start = environment.start
    where = start.python if isinstance(start, LocalStart) else start.function_name
    lines = [f"{environment.environment_id:24} {environment.status:8} {where}"]
    if environment.description:
        lines.append(f"  {environment.description}")
    if not full:
        return lines
    limits = environment.limits
    lines.append(f"  preload:  {', '.join(environment.preload) or '(none)'}")
    lines.append(
        f"  limits:   timeout <= {limits.timeout_s:g} s, memory <= {limits.memory_mb} MiB,"
        f" network {'on' if limits.network else 'off'}"
    )
    lines.append(f"  registered {environment.registered_at:%Y-%m-%d %H:%M:%S}")
    if environment.removed_at is not None:
        lines.append(f"  removed    {environment.removed_at:%Y-%m-%d %H:%M:%S}")
    lines.append(f"  packages ({len(environment.packages)}): {', '.join(environment.packages) or '(none)'}")
    return lines


def cmd_env_help(args: argparse.Namespace) -> int:
    """``env`` without a sub-command: its help on standard output (exit 0), as ``alphaagent``
    alone prints the overview; with ``--json`` that help as JSON, as ``help env --json`` prints."""
    command: argparse.ArgumentParser = args.parser
    if args.json:
        print(json.dumps(help_document(command, "env"), indent=2))
        return EXIT_OK
    command.print_help()
    return EXIT_OK


def cmd_env_add(args: argparse.Namespace) -> int:
    """Register a local environment after starting its zygote once; every refusal is one line
    naming the flag (exit 2) and registers nothing."""
    from pydantic import ValidationError

    from alphaagent.environments import EnvironmentLimits
    from alphaagent.errors import InvalidEnvironmentError

    preload = tuple(m.strip() for m in (args.preload or "").split(",") if m.strip())
    ceilings: dict[str, Any] = {"network": args.network == "on"}
    if args.timeout is not None:
        ceilings["timeout_s"] = args.timeout
    if args.memory_mb is not None:
        ceilings["memory_mb"] = args.memory_mb
    try:
        limits = EnvironmentLimits(**ceilings)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0])
        raise InvalidRequestError(f"{_ENV_FLAGS.get(field, field)}: {first['msg'].lower()}") from None
    with _agent(args, writes=True) as agent:
        try:
            environment = agent.add_environment(
                args.environment_id,
                args.python,
                preload=preload,
                description=args.description or "",
                limits=limits,
            )
        except InvalidEnvironmentError as exc:
            raise InvalidRequestError(f"{_ENV_FLAGS.get(exc.field, exc.field)}: {exc.detail}") from None
    packages = f"{len(environment.packages)} packages"
    _emit(args, environment, [f"registered environment {environment.environment_id} ({packages})"])
    return EXIT_OK


def cmd_env_list(args: argparse.Namespace) -> int:
    with _agent(args) as agent:
        environments = agent.environments.list()
    lines = [line for e in environments for line in _environment_lines(e)]
    _emit(args, _dump(environments), lines)
    return EXIT_OK


def cmd_env_show(args: argparse.Namespace) -> int:
    with _agent(args) as agent:
        environment = agent.environments.get(args.environment_id)
        known = [e.environment_id for e in agent.environments.list()] if environment is None else []
    if environment is None:
        near = did_you_mean_name(args.environment_id, known)
        raise NotFoundError(f"environment {args.environment_id!r} is not registered{near}")
    _emit(args, environment, _environment_lines(environment, full=True))
    return EXIT_OK


def cmd_env_remove(args: argparse.Namespace) -> int:
    from alphaagent.errors import InvalidEnvironmentError

    with _agent(args, writes=True) as agent:
        try:
            removed = agent.remove_environment(args.environment_id)
        except InvalidEnvironmentError as exc:
            raise InvalidRequestError(f"{_ENV_FLAGS.get(exc.field, exc.field)}: {exc.detail}") from None
        except NotFoundError as exc:
            known = [e.environment_id for e in agent.environments.list()]
            raise NotFoundError(f"{exc}{did_you_mean_name(args.environment_id, known)}") from None
    _emit(args, removed, [f"removed environment {removed.environment_id}; specs naming it are refused"])
    return EXIT_OK


# ----------------------------------------------------------------------------- help, version


def help_document(command: argparse.ArgumentParser, name: str) -> dict[str, Any]:
    """The help of ``command`` (called ``name``: ``env add``; empty for the program) as JSON, what
    ``help [COMMAND] --json`` prints, as every ``--json`` prints the command's answer as JSON:
    ``{"command", "summary", "usage", "commands": [{"name", "summary"}], "arguments": [{"name",
    "help"}], "options": [{"flags", "value", "required", "choices", "help"}]}``. ``commands`` are
    those directly under it (``env``'s sub-commands under ``env``); hidden options are left out."""
    commands, arguments, options = [], [], []
    for action in command._actions:
        if isinstance(action, argparse._SubParsersAction):
            commands = [
                {"name": f"{name} {choice.dest}".strip(), "summary": choice.help or ""}
                for choice in action._choices_actions
            ]
        elif action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
            continue
        elif not action.option_strings:
            arguments.append({"name": str(action.metavar or action.dest), "help": action.help or ""})
        else:
            takes = action.nargs != 0
            options.append(
                {
                    "flags": list(action.option_strings),
                    "value": str(action.metavar or action.dest.upper()) if takes else None,
                    "required": bool(action.required),
                    "choices": [str(c) for c in action.choices] if action.choices is not None else None,
                    "help": action.help or "",
                }
            )
    usage = " ".join(command.format_usage().removeprefix("usage:").split())
    summary = (command.description or "").split("\n\ndata directory:")[0]
    return {
        "command": name,
        "summary": summary,
        "usage": usage,
        "commands": commands,
        "arguments": arguments,
        "options": options,
    }


def cmd_help(args: argparse.Namespace) -> int:
    """Print the program's help (no COMMAND), or a command's (``help env add`` for a sub-command),
    on standard output: what ``--help`` prints, without the usage error of a missing command. With
    ``--json``, the same help as JSON (``help_document``: the commands, arguments and options)."""
    command: argparse.ArgumentParser = args.parser
    for depth, word in enumerate(args.topic):
        choices = next((a.choices for a in command._actions if isinstance(a, argparse._SubParsersAction)), {})
        if word not in choices:
            above = " ".join(args.topic[:depth])
            where = f"{above} has no command" if above else "no command"
            known = did_you_mean(word, choices) or f" (commands: {', '.join(choices) or 'none'})"
            raise InvalidRequestError(f"help: {where} {word!r}{known}")
        command = choices[word]
    if args.json:
        print(json.dumps(help_document(command, " ".join(args.topic)), indent=2))
        return EXIT_OK
    if isinstance(command, _Parser):
        command.home_given = args.home
    command.print_help()
    return EXIT_OK


def _version_line() -> str:
    return f"alphaagent {_version()}"


def cmd_version(args: argparse.Namespace) -> int:
    """Print ``alphaagent VERSION``; with ``--json``, ``{"name": "alphaagent", "version": ...}``.
    Also what ``--version`` runs: without pydantic (what ``_emit`` would import), as a usage error."""
    if args.json:
        print(json.dumps({"name": "alphaagent", "version": _version()}, indent=2))
    else:
        print(_version_line())
    return EXIT_OK


# ----------------------------------------------------------------------------- parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("alphaagent")
    except PackageNotFoundError:  # run from a checkout that was never installed
        from alphaagent import __version__

        return __version__


class _VersionAction(argparse.Action):
    """``--version``: the ``version`` command, under the same rule (``--json`` prints the JSON form,
    ``--home`` and ``--user`` are refused), not argparse's print-and-exit that ignored the options
    around it. It only notes the request (``version_asked``); ``main`` runs it."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", "print the version (what the version command prints)")
        super().__init__(option_strings, dest="version_asked", nargs=0, default=False, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, *rest: Any) -> None:
        namespace.version_asked = True


def _where_home(given: str | None = None) -> str:
    """Where the data directory is, and why (for ``--help``; ``given``: ``help --home DIR``). A
    malformed setting does not stop the help (which reads no other setting): it is named instead."""
    from alphaagent.local.settings import alphaagent_home, local_settings

    if given:
        return f"{alphaagent_home(given)} (from --home)"
    try:
        settings = local_settings()
    except InvalidSettingError as exc:
        return f"not known: {exc}"
    if settings.ALPHAAGENT_HOME:
        why = "from $ALPHAAGENT_HOME"
    elif settings.XDG_DATA_HOME.startswith("/"):
        why = "$XDG_DATA_HOME/alphaagent; set $ALPHAAGENT_HOME or give --home to move it"
    else:
        why = "the per-user default; set $ALPHAAGENT_HOME or give --home to move it"
    return f"{alphaagent_home()} ({why})"


_IDENTITY = f"--user, else ${USER_ENV}, else '{DEFAULT_USER}'"


def _add_home(command: argparse.ArgumentParser, default: Any) -> None:
    command.add_argument(
        "--home",
        metavar="DIR",
        default=default,
        help="the data directory (default: $ALPHAAGENT_HOME, else"
        " ${XDG_DATA_HOME:-~/.local/share}/alphaagent)",
    )


_EXAMPLES = {
    "exec": [
        "echo 'print(6 * 7)' | alphaagent exec -",
        "alphaagent exec job.py --workdir data --timeout 120 --json",
        "alphaagent exec job.py --env stats",
    ],
    "run": [
        "alphaagent run examples/penguins/turn1.json",
        "alphaagent run spec.json --conversation my-analysis --json",
    ],
    "submit": ["alphaagent submit spec.json --queue-url $QUEUE --wait --table $TABLE"],
    "demo": ["alphaagent demo", "alphaagent demo --json"],
    "files": ["alphaagent files --conversation penguins --prefix charts"],
    "cat": [
        "alphaagent cat reports/summary.md --conversation penguins",
        "alphaagent cat --artifact body_mass --conversation penguins -o chart.png",
    ],
    "history": [
        "alphaagent history --conversation penguins",
        "alphaagent history --conversation penguins --turn TURN_ID --limit 1",
    ],
    "artifacts": ["alphaagent artifacts --conversation penguins --json"],
    "sessions": ["alphaagent sessions --conversation penguins"],
    "turns": [
        "alphaagent turns --workflow wf-1 --node summarise",
        "alphaagent turns --conversation penguins --limit 5",
    ],
    "help": ["alphaagent help", "alphaagent help env add"],
    "version": ["alphaagent version --json"],
    "conversations": ["alphaagent conversations --json", "alphaagent conversations --limit 5"],
    "serve": ["alphaagent serve --open", "alphaagent serve --backend aws --table $TABLE --bucket $BUCKET"],
    "mcp": ["alphaagent mcp", "alphaagent mcp --http 8766"],
    "export": ["alphaagent export --conversation penguins -o penguins.zip"],
    "env": [
        "alphaagent env add stats --python ~/envs/stats/bin/python --preload statsmodels.api",
        "alphaagent env list --json",
    ],
}
"""What ``COMMAND --help`` shows under "examples"."""

_ENV_EXAMPLES = {
    "add": [
        "alphaagent env add stats --python ~/envs/stats/bin/python --preload statsmodels.api,scipy",
        "alphaagent env add web --python /usr/bin/python3.12 --network on --description 'fetches pages'",
    ],
    "list": ["alphaagent env list", "alphaagent env list --json"],
    "show": ["alphaagent env show builtin --json"],
    "remove": ["alphaagent env remove stats"],
}
"""What ``env SUBCOMMAND --help`` shows under "examples"."""

_EXIT_STATUS = """exit status:
  0    done
  1    the run or turn failed, or what was asked for was not found
  2    bad input, or the platform failed
  130  interrupted (Ctrl-C)
  141  the reader of standard output went away (| head): stopped quietly
with --json (before or after the command name), a failure of the command itself is also
  {"cli_error": {"message": ..., "exit_code": N}} on standard output; "error" is only ever the
  code's error in a result ({"name", "value", "traceback"})"""


def _as_started(example: str, prog: str) -> str:
    """An example command with the program named as it was started (``alphaagent.program``)."""
    import re

    return re.sub(r"(?<![\w/.$-])alphaagent(?= )", lambda _: prog, example)


def _describe_commands(
    sub: argparse._SubParsersAction[_Parser], prog: str, examples: dict[str, list[str]] = _EXAMPLES
) -> None:
    """Give every command a description (its one-line help), examples and the exit statuses."""
    helps = {action.dest: action.help for action in sub._choices_actions}
    for name, command in sub.choices.items():
        command.formatter_class = argparse.RawDescriptionHelpFormatter
        command.description = command.description or helps.get(name)
        lines = [f"  {_as_started(example, prog)}" for example in examples.get(name, [])]
        if any("--conversation penguins" in line for line in lines):
            lines.append(
                f"  (conversation penguins is what `{prog} run examples/penguins/turn1.json` makes,"
                " run from the checkout)"
            )
        command.epilog = ("examples:\n" + "\n".join(lines) + "\n\n" if lines else "") + _EXIT_STATUS


def build_parser(prog: str = DEFAULT_PROGRAM) -> argparse.ArgumentParser:
    """The whole command line; ``prog`` is how the program was started (``alphaagent.program``),
    which its usage lines and examples show so that they paste as is."""
    with _argparse_words_once():
        return _build_parser(prog)


@contextlib.contextmanager
def _argparse_words_once() -> Iterator[None]:
    """While the parsers are built, each of argparse's own words ("options", "show this help message
    and exit", ...) is translated once, not once per parser: gettext looks for a catalogue on disk
    (four ``stat`` calls) every time it finds none, ~66 times for the ~22 parsers, a third of
    building them (~3 ms of every command, bench/cli_start.py). The answers are gettext's own."""
    translate: Callable[[str], str] = argparse._  # type: ignore[attr-defined]
    words: dict[str, str] = {}

    def once(message: str) -> str:
        if message not in words:
            words[message] = translate(message)
        return words[message]

    argparse._ = once  # type: ignore[attr-defined]
    try:
        yield
    finally:
        argparse._ = translate  # type: ignore[attr-defined]


def _build_parser(prog: str) -> argparse.ArgumentParser:
    parser = _Parser(
        prog=prog,
        description=(
            "The code-execution plane for AI agents: the local backend, and `submit` to a deployed stack."
        ),
        epilog=f"See {prog} COMMAND --help.",
        # As written: a wrapped path could not be copied from the terminal.
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.describe_home = True
    parser.add_argument("--version", action=_VersionAction)
    _add_home(parser, None)
    parser.add_argument(
        "--json",
        action="store_true",
        help="print JSON, for a command that prints JSON (before or after the command name, the same)",
    )
    parser.add_argument(
        "--user",
        default=argparse.SUPPRESS,
        help="who is asking, for a command that takes --user (before or after the command name, the same)",
    )
    # Not required: --version alone is a command too (main says when neither was given).
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def scoped(name: str, help_text: str, *, prints_json: bool = True) -> argparse.ArgumentParser:
        command = sub.add_parser(name, help=help_text)
        command.add_argument(
            "--user", default=None, help=f"who is asking (default: ${USER_ENV}, else '{DEFAULT_USER}')"
        )
        command.add_argument("--conversation", type=_SCOPE_ID, metavar="ID", help="a conversation scope")
        command.add_argument(
            "--workflow", type=_SCOPE_ID, metavar="EXEC", help="a workflow execution (with --node)"
        )
        command.add_argument("--node", type=_SCOPE_ID, metavar="ID", help="a node of the workflow execution")
        if prints_json:
            command.add_argument("--json", action="store_true", help="print JSON")
        return command

    run = sub.add_parser("exec", help="run Python in the sandbox, exactly as run_in_env would")
    run.add_argument("file", metavar="FILE|-", help="the code to run ('-' reads standard input)")
    run.add_argument(
        "--workdir",
        metavar="DIR",
        help="working directory of the run, which the code may change (default: a new empty folder,"
        " removed afterwards)",
    )
    run.add_argument("--timeout", type=_RUN_SECONDS, metavar="SECONDS", help="wall-clock limit (default 60)")
    run.add_argument(
        "--memory-mb", type=_MEMORY_MB, metavar="N", help="address-space limit in MiB (default 2048)"
    )
    run.add_argument("--network", choices=("on", "off"), default="off", help="network access (default off)")
    run.add_argument(
        "--env",
        metavar="ID",
        help="run in this registered environment (see alphaagent env list; default builtin); its"
        " ceilings bound --timeout, --memory-mb and --network",
    )
    run.add_argument("--json", action="store_true", help="print the run result as JSON")
    run.set_defaults(handler=cmd_exec)

    def spec_command(name: str, help_text: str) -> argparse.ArgumentParser:
        command = scoped(name, help_text)
        command.add_argument("spec", metavar="SPEC.json", help="the spec ('-' reads standard input)")
        for action in command._actions:
            if action.dest == "user":
                action.help = (
                    f"who runs it (default: ${USER_ENV}, else '{DEFAULT_USER}'); supplies a missing"
                    " user_id; a spec with another user_id is refused"
                )
            elif action.dest in ("conversation", "workflow"):
                action.help = f"{action.help}; replaces (or supplies) the spec's scope"
        return command

    turn = spec_command("run", "run an analysis spec end to end (progress on stderr)")
    turn.set_defaults(handler=cmd_run)

    submit = spec_command("submit", "send a spec to a deployed stack's SpecQueue (needs boto3)")
    submit.add_argument(
        "--queue-url", metavar="URL", help="the stack's SpecQueueUrl (default: $ALPHAAGENT_SPEC_QUEUE_URL)"
    )
    submit.add_argument("--wait", action="store_true", help="wait for the turn's result (progress on stderr)")
    submit.add_argument(
        "--table",
        metavar="NAME",
        help="with --wait: the stack's StateTableName (default: $ALPHAAGENT_STATE_TABLE)",
    )
    submit.add_argument(
        "--timeout", type=_SECONDS, metavar="SECONDS", help="with --wait: how long to wait (default 3600)"
    )
    submit.set_defaults(handler=cmd_submit)

    demo = sub.add_parser("demo", help="run the demo analysis on the embedded default")
    demo.add_argument(
        "--user", default=None, help=f"who runs it (default: ${USER_ENV}, else '{DEFAULT_USER}')"
    )
    demo.add_argument("--json", action="store_true", help="print the results as JSON")
    demo.set_defaults(handler=cmd_demo)

    files = scoped("files", "list a scope's files")
    files.add_argument("--prefix", help="only under this folder (e.g. datasets)")
    files.set_defaults(handler=cmd_files)

    # cat prints a file's bytes, never JSON: --json is refused (_GLOBAL_OPTIONS).
    cat = scoped("cat", "print a file of a scope, or an artifact version's bytes", prints_json=False)
    cat.add_argument("path", nargs="?", metavar="PATH", help="workspace-relative path")
    cat.add_argument("--artifact", metavar="NAME", help="an artifact instead of a path")
    cat.add_argument("--version", type=_COUNT, metavar="N", help="artifact version (default: latest)")
    cat.add_argument(
        "-o", "--output", metavar="FILE", help="write the bytes to FILE (binary never goes to a terminal)"
    )
    cat.set_defaults(handler=cmd_cat)

    limit_help = "only the N newest (default: all)"
    history = scoped("history", "list a scope's runs with their stored outputs, newest first")
    history.add_argument(
        "--turn", metavar="TURN_ID", help="only this turn's runs (see turns); it names its scope"
    )
    history.add_argument("--limit", type=_COUNT, metavar="N", help=limit_help)
    history.set_defaults(handler=cmd_history)
    scoped("artifacts", "list a scope's artifacts and versions").set_defaults(handler=cmd_artifacts)
    scoped("sessions", "list your sessions in a scope").set_defaults(handler=cmd_sessions)
    turns = scoped(
        "turns", "list a scope's turns, newest first: id, status, start, duration, environment, goal, error"
    )
    turns.add_argument("--limit", type=_COUNT, metavar="N", help=limit_help)
    turns.set_defaults(handler=cmd_turns)

    conversations = sub.add_parser("conversations", help="list your conversations and workflow nodes")
    conversations.add_argument(
        "--user", default=None, help=f"who is asking (default: ${USER_ENV}, else '{DEFAULT_USER}')"
    )
    conversations.add_argument("--limit", type=_COUNT, metavar="N", help=limit_help)
    conversations.add_argument("--json", action="store_true", help="print JSON")
    conversations.set_defaults(handler=cmd_conversations)

    serve = sub.add_parser(
        "serve", help="the read-only workspace viewer in your browser (needs the viewer extra)"
    )
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)"
    )
    serve.add_argument("--port", type=_PORT, default=8765, help="port (default 8765; 0 picks a free one)")
    serve.add_argument(
        "--user", default=None, help=f"whose work to show (default: ${USER_ENV}, else '{DEFAULT_USER}')"
    )
    serve.add_argument("--open", action="store_true", help="open the URL in a browser")
    serve.add_argument(
        "--backend",
        choices=("local", "aws"),
        default="local",
        help="local data directory, or a deployed stack",
    )
    serve.add_argument(
        "--table", metavar="NAME", help="with --backend aws: StateTableName (default $ALPHAAGENT_STATE_TABLE)"
    )
    serve.add_argument(
        "--bucket",
        metavar="NAME",
        help="with --backend aws: WorkspacesBucketName (default $ALPHAAGENT_WORKSPACES_BUCKET)",
    )
    serve.add_argument("--region", help="with --backend aws: the stack's region (default: the environment's)")
    serve.set_defaults(handler=cmd_serve)

    mcp = sub.add_parser("mcp", help="serve run_analysis and the result readers to agents over MCP (stdio)")
    mcp.add_argument(
        "--user", default=None, help=f"the one user it acts for (default: ${USER_ENV}, else '{DEFAULT_USER}')"
    )
    mcp.add_argument(
        "--backend", choices=("local", "aws"), default="local", help="where turns run (default local)"
    )
    mcp.add_argument(
        "--http",
        type=_Number(int, low=1, high=65535),  # a TCP port to listen on: not 0
        metavar="PORT",
        help="streamable HTTP on 127.0.0.1:PORT/mcp with a bearer token"
        " ($ALPHAAGENT_MCP_TOKEN, else a new one printed on stderr) instead of stdio",
    )
    mcp.add_argument(
        "--queue-url", metavar="URL", help="aws: SpecQueueUrl (default $ALPHAAGENT_SPEC_QUEUE_URL)"
    )
    mcp.add_argument("--table", metavar="NAME", help="aws: StateTableName (default $ALPHAAGENT_STATE_TABLE)")
    mcp.add_argument(
        "--bucket", metavar="NAME", help="aws: WorkspacesBucketName (default $ALPHAAGENT_WORKSPACES_BUCKET)"
    )
    mcp.add_argument(
        "--timeout", type=_SECONDS, metavar="SECONDS", help="aws: how long a turn is waited for (3600)"
    )
    mcp.set_defaults(handler=cmd_mcp)

    export = scoped("export", "export a scope's files as a zip (per-file ceiling 25 MiB)")
    export.add_argument("-o", "--output", required=True, metavar="FILE.zip", help="where to write the zip")
    export.set_defaults(handler=cmd_export)
    help_command = sub.add_parser("help", help="print the help of the program, or of a command")
    help_command.add_argument(
        "topic", nargs="*", metavar="COMMAND", help="a command (env add: a sub-command) to explain"
    )
    help_command.add_argument(
        "--json", action="store_true", help="print the help as JSON (its commands and options)"
    )
    _add_home(help_command, None)  # the help says where that data directory is
    help_command.set_defaults(handler=cmd_help, parser=parser)
    version = sub.add_parser("version", help="print the version (what --version prints)")
    version.add_argument("--json", action="store_true", help='print {"name": ..., "version": ...}')
    version.set_defaults(handler=cmd_version)
    env = sub.add_parser("env", help="the local execution environments: add, list, show, remove")
    env.add_argument("--json", action="store_true", help="print JSON")
    # `env` alone is a request for its help, as `alphaagent` alone is (cmd_env_help), never the
    # usage error "required: env_command" naming an internal name.
    env.set_defaults(handler=cmd_env_help, parser=env)
    env_sub = env.add_subparsers(dest="env_command", metavar="SUBCOMMAND", parser_class=_Parser)
    env_add = env_sub.add_parser("add", help="register a Python interpreter as an environment")
    env_add.add_argument(
        "environment_id",
        type=_ENVIRONMENT_ID,
        metavar="ID",
        help="1-32 of a-z, 0-9, '-', starting with a letter",
    )
    env_add.add_argument("--python", required=True, metavar="PATH", help="its interpreter (Python >= 3.11)")
    env_add.add_argument(
        "--preload", metavar="MOD,...", help="modules its zygote imports once (each must import)"
    )
    env_add.add_argument("--description", metavar="TEXT", help="what it is for (at most 1000 characters)")
    env_add.add_argument(
        "--network", choices=("on", "off"), default="off", help="network access of its runs (default off)"
    )
    env_add.add_argument(
        "--timeout", type=_RUN_SECONDS, metavar="SECONDS", help="the most a run may ask for (default 900)"
    )
    env_add.add_argument(
        "--memory-mb", type=_MEMORY_MB, metavar="N", help="the most memory a run may ask for (default 2048)"
    )
    env_add.add_argument("--json", action="store_true", help="print the environment as JSON")
    env_add.set_defaults(handler=cmd_env_add)
    env_list = env_sub.add_parser("list", help="the ready environments (builtin first)")
    env_list.add_argument("--json", action="store_true", help="print JSON")
    env_list.set_defaults(handler=cmd_env_list)
    env_show = env_sub.add_parser("show", help="one environment: interpreter, preload, limits, packages")
    env_show.add_argument("environment_id", metavar="ID")
    env_show.add_argument("--json", action="store_true", help="print JSON")
    env_show.set_defaults(handler=cmd_env_show)
    env_remove = env_sub.add_parser("remove", help="remove an environment (its specs are refused)")
    env_remove.add_argument("environment_id", metavar="ID")
    env_remove.add_argument("--json", action="store_true", help="print JSON")
    env_remove.set_defaults(handler=cmd_env_remove)
    # The commands that read or write the data directory show --home in their help.
    for command in [*env_sub.choices.values(), *sub.choices.values()]:
        if command not in (submit, help_command, version):
            _add_home(command, argparse.SUPPRESS)
    _describe_commands(env_sub, prog, _ENV_EXAMPLES)
    _describe_commands(sub, prog)
    _globals_anywhere(sub, "")
    return parser


_GLOBAL_OPTIONS: Final = ("json", "home", "user")
"""The options every command accepts in every place: before the command name, after it, and
between ``env`` and its sub-command (``alphaagent --user bob turns``, ``alphaagent turns --user bob``
and ``alphaagent env --json list`` mean what they say). A command whose help lists the option
takes it; any other command refuses it, wherever it was given, in one line naming the command
(``main``). Nothing is ever silently ignored."""


def _globals_anywhere(sub: argparse._SubParsersAction[_Parser], prefix: str) -> None:
    """Apply the one rule of ``_GLOBAL_OPTIONS`` to every command under ``sub`` (``prefix`` is the
    name of the command above, ``env``). Each command's own copy of an option only ever sets it
    (argparse would otherwise copy the sub-command's default over a value given before its name);
    a command without the option gets it hidden, so that ``main`` refuses it with the same line;
    ``command_name`` and ``takes_options`` are the innermost command's (argparse copies a
    sub-command's values over its parent's)."""
    for name, command in sub.choices.items():
        full = f"{prefix} {name}".strip()
        takes = []
        for option in _GLOBAL_OPTIONS:
            own = [action for action in command._actions if action.dest == option]
            if own:
                takes.append(option)
            elif option == "json":
                own = [command.add_argument("--json", action="store_true", help=argparse.SUPPRESS)]
            else:
                own = [command.add_argument(f"--{option}", metavar=option.upper(), help=argparse.SUPPRESS)]
            for action in own:
                action.default = argparse.SUPPRESS
        if "json" not in takes:
            command.set_defaults(json_unsupported=full)
        command.set_defaults(command_name=full, takes_options=frozenset(takes))
        if isinstance(command, _Parser):
            command.command_path = full
            command.program = command.prog.removesuffix(f" {full}")
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                _globals_anywhere(action, full)


def _refused_option(args: argparse.Namespace, prog: str) -> str | None:
    """The one line refusing a global option given to a command that does not take it, or None.
    Sets the defaults of those it takes (``--json`` off, ``--home`` and ``--user`` unset)."""
    name, takes = args.command_name, args.takes_options
    for option in _GLOBAL_OPTIONS:
        value = getattr(args, option, None)
        if option in takes:
            setattr(args, option, value if value is not None else (False if option == "json" else None))
        elif value not in (None, False):
            if option == "json":
                return f"--json: {name} prints no JSON (see {prog} {name} --help)"
            return f"--{option}: {name} takes no --{option} (see {prog} {name} --help)"
    return None


def _given_twice() -> str | None:
    """The one line refusing an option given twice with different values (the same value twice
    is harmless and passes), or None: the first such option, in the order they were given."""
    for option, given_values in _GIVEN.items():
        if option == "--home":  # one directory, however it was written
            given_values = [(os.path.abspath(os.path.expanduser(v)), typed) for v, typed in given_values]
        values = [value for value, _ in given_values]
        # Compared as converted (`--limit 03` is `--limit 3`), shown as typed: `('5' and '6')`.
        different = [typed for i, (value, typed) in enumerate(given_values) if value not in values[:i]]
        if len(different) > 1:
            given = " and ".join(repr(typed) for typed in different[:2])
            return f"{option}: given twice with different values ({given}); give it once"
    return None


def _resolve_user(args: argparse.Namespace) -> str | None:
    """Apply the identity rule to a command that has ``--user``; an error message, or None.
    Sets ``args.user`` and ``args.user_source`` (``--user``, ``$ALPHAAGENT_USER`` or None for the
    default)."""
    from pydantic import TypeAdapter, ValidationError

    from alphaagent.local.settings import local_settings
    from alphaagent.models.common import UserId

    if args.user is not None:
        args.user_source = "--user"
    elif local_settings().ALPHAAGENT_USER:
        args.user, args.user_source = local_settings().ALPHAAGENT_USER, f"${USER_ENV}"
    else:
        args.user, args.user_source = DEFAULT_USER, None
    try:
        TypeAdapter(UserId).validate_python(args.user)
    except ValidationError:
        return f"{args.user_source or 'user'}: {id_refusal(USER_ID_RULE, shown_typed(args.user))}"
    return None


_READS_NO_SETTINGS: Final = frozenset({"help", "version"})
"""Commands that read no setting (nor files): a malformed one does not stop them (the help names it
where it would say where the data directory is)."""


def _check_model_settings() -> None:
    """Check the model's variables (``coder.settings``) when the coder's settings are installed, so
    that ``ALPHAAGENT_MAX_BUDGET_USD=abc`` is refused by every command, not first by a turn that uses
    the model. Raises ``ModelConfigError`` naming the variable."""
    try:
        from coder.settings import CoderSettings
    except ImportError:
        return
    CoderSettings.from_env(os.environ)


def main(argv: Sequence[str] | None = None, *, prog: str = DEFAULT_PROGRAM) -> int:
    """Entry point of the ``alphaagent`` console script; returns the exit code. ``prog`` is how
    the program was started (``alphaagent.program``), for the commands its help and demo print.

    A reader that went away (``| head -1``) ends the command quietly with 141, as a Unix tool
    killed by SIGPIPE, whenever it is noticed: while the command writes, or when what it wrote is
    flushed at its end (help and usage errors included, whose ``SystemExit`` it then replaces)."""
    try:
        try:
            return _main(argv, prog=prog)
        finally:
            if sys.stdout is not None:  # None when started with standard output closed (>&-)
                sys.stdout.flush()  # here, not at the interpreter's exit, where a closed pipe is a traceback
    except BrokenPipeError:
        # Later flushes (the interpreter's own at exit) must not meet the closed pipe again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def _main(argv: Sequence[str] | None, *, prog: str) -> int:
    _ARGV[:] = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser(prog)  # the help text shows where the data directory is
        if not _ARGV:
            # No command at all is a request for the overview (as gh does), not a mistake.
            parser.print_help()
            return EXIT_OK
        _GIVEN.clear()
        args = parser.parse_args(_ARGV)
        if args.command is None and not args.version_asked:
            parser.error("name a command")
        if args.command is not None and args.version_asked:
            # One rule for whatever follows --version: `--version extra` is refused, so is a command.
            name = getattr(args, "command_name", args.command)
            parser.error(
                f"--version: goes alone, not with a command; give {prog} --version, or {name} without it"
            )
        twice = _given_twice()
        if twice is not None:
            return _fail(twice, as_json=bool(getattr(args, "json", False)))
        if args.version_asked:  # before the settings, which --version never read
            args.handler, args.command_name, args.takes_options = cmd_version, "version", frozenset({"json"})
            refused = _refused_option(args, prog)
            if refused is not None:
                return _fail(refused, as_json=bool(args.json))
            return cmd_version(args)
        if args.command not in _READS_NO_SETTINGS:
            # A malformed setting is one line before any command starts, whether or not the
            # command uses it: every process-kind model the local CLI reads (settings.PROCESS_KINDS).
            from alphaagent.local.settings import local_settings

            local_settings()
            _check_model_settings()
    except InvalidSettingError as exc:
        return _fail(str(exc), as_json="--json" in _ARGV)
    except ModelConfigError as exc:  # one line naming the variable, as a local setting's
        return _fail(str(exc), as_json="--json" in _ARGV)
    args.prog = prog

    from pydantic import ValidationError  # already imported: the settings are a model

    def fail(message: str, code: int = EXIT_USAGE) -> int:
        return _fail(message, code, as_json=bool(getattr(args, "json", False)))

    refused = _refused_option(args, prog)
    if refused is not None:
        return fail(refused)

    if hasattr(args, "user"):
        problem = _resolve_user(args)
        if problem is not None:
            return fail(problem)

    try:
        code: int = args.handler(args)
    except NotFoundError as exc:
        return fail(str(exc), EXIT_FAILED)
    except InvalidRequestError as exc:
        return fail(str(exc))
    except AlphaAgentError as exc:
        return fail(f"{type(exc).__name__}: {exc}")
    except KeyboardInterrupt:
        # The run's processes are gone and the turn is recorded (the sandbox and the turn driver
        # saw the interrupt on its way here); the shell's convention for Ctrl-C is 128 + SIGINT.
        print("alphaagent: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (PathRuleError, ValidationError) as exc:
        return fail(str(exc).splitlines()[0])
    except BrokenPipeError:
        raise  # the reader went away (| head): main ends quietly with 141
    except (OSError, ValueError, RecursionError, OverflowError, UnicodeError) as exc:
        # Input this code did not foresee: one line, never a traceback (DESIGN: bad input gets a
        # clear error). Set ALPHAAGENT_DEBUG=1 to see the traceback.
        if os.environ.get("ALPHAAGENT_DEBUG"):  # not local_settings(): the error may be one of its own
            raise
        return fail(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no detail'}")
    return code


if __name__ == "__main__":
    from alphaagent.program import module_program

    sys.exit(main(prog=module_program()))
