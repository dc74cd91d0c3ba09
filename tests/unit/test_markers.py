"""The truncation marker tells what was lost: the stored history names both sizes (what the agent
saw, what the code printed), and output that is binary in disguise (base64, hex) is called so, with
where such data belongs."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from assertions import assert_status
from sandboxes import light, light_agent

from alphaagent.cli import main
from alphaagent.domain.recorder import history_view, run_record_from
from alphaagent.ids import new_ulid
from alphaagent.local.executor import SandboxExecutor
from alphaagent.models.common import ConversationScope
from alphaagent.models.events import RunCompleted
from alphaagent.models.run import FileChangeReport, RunLimits, RunOrigin, RunResult
from alphaagent.sandbox.capture import RETURNED_OUTPUT_CAP_BYTES, STORED_HISTORY_CAP_BYTES, truncate_text

SCOPE = ConversationScope(conversation_id="c-markers")
HINT = "data printed as text: write it to a file instead (an image to charts/) and call register_artifact"


def _result(stdout: str, printed: int) -> RunResult:
    return RunResult(
        run_id=new_ulid(),
        status="ok",
        exit_code=0,
        stdout=stdout,
        stderr="",
        stdout_bytes=printed,
        stderr_bytes=0,
        stdout_truncated=printed > len(stdout.encode()),
        stderr_truncated=False,
        error=None,
        duration_ms=1,
        files_changed=[],
        files=FileChangeReport(),
        limits={"timeout_s": 60},
        isolation="process",
        network="off",
    )


def test_the_stored_history_marker_names_what_the_agent_saw_and_what_the_code_printed() -> None:
    # Given a run whose code printed 5,000,001 bytes, cut to the 1 MiB returned-output cap
    seen, _ = truncate_text("r" * 5_000_001, RETURNED_OUTPUT_CAP_BYTES)
    result = _result(seen, 5_000_001)
    # When it is cut again for the stored history (the event's view and the record)
    view = history_view(result)
    detail = RunCompleted(
        turn_id=new_ulid(),
        scope=SCOPE,
        run_id=result.run_id,
        session_id="s" * 32,
        user_id="u",
        status="ok",
        result=view.model_dump(mode="json"),
    )
    record = run_record_from(detail, "print('r' * 5_000_001)")
    # Then the marker gives both numbers, within the 16 KiB cap
    for text in (view.stdout, record.stdout):
        assert len(text.encode()) <= STORED_HISTORY_CAP_BYTES
        marker = re.search(r"\[\.\.\. truncated: .* \.\.\.\]", text)
        assert marker, text[-300:]
        assert f"of {len(seen.encode())} bytes the agent saw; the code printed 5000001 bytes" in marker[0]


def test_a_first_cut_marker_is_unchanged_when_nothing_was_cut_before() -> None:
    # Given a text that is the whole output; When it is cut; Then the marker has the single count
    text, cut = truncate_text("a" * 100_000, 4096, printed_bytes=100_000)
    assert cut and "the agent saw" not in text and "of 100000 bytes ..." in text


def _b64(n: int) -> str:
    import base64
    import random

    return base64.b64encode(random.Random(7).randbytes(n)).decode()


@pytest.mark.parametrize("cap", [4096, STORED_HISTORY_CAP_BYTES, RETURNED_OUTPUT_CAP_BYTES])
def test_base64_and_hex_output_is_called_so_and_pointed_to_charts_and_register_artifact(cap: int) -> None:
    # Given megabytes of base64 (an image printed instead of saved), and of hex
    for data, kind in ((_b64(3 << 20), "base64"), (_b64(3 << 20).encode().hex()[: 4 << 20], "hex")):
        # When it is cut; Then the marker says what it looks like and where it belongs, within the cap
        text, cut = truncate_text(data, cap)
        assert cut and len(text.encode()) <= cap
        assert f"looks like {kind} {HINT}" in text, text[cap // 2 - 200 : cap // 2 + 400]


ORDINARY_TEXTS: dict[str, Callable[[], str]] = {
    "one-letter": lambda: "x" * 3_000_000,  # one letter repeated: base64's alphabet, not base64
    "rows": lambda: "".join(f"id={i},value={i * i}\n" for i in range(200_000)),  # OUT-06's rows
    "lorem": lambda: "Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 50_000,
}
"""Megabytes of text that is not binary, each made by the test that needs it (not at collection)."""


@pytest.mark.parametrize("kind", ORDINARY_TEXTS)
def test_ordinary_text_gets_the_plain_marker(kind: str) -> None:
    data = ORDINARY_TEXTS[kind]()
    text, cut = truncate_text(data, STORED_HISTORY_CAP_BYTES)
    assert cut and "looks like" not in text


def test_a_run_printing_an_image_as_base64_is_told_so_in_its_result(tmp_path: Path) -> None:
    # Given code that prints 2 MiB of random bytes as base64, as code that shows an image might
    root = tmp_path / SCOPE.key
    root.mkdir(parents=True)
    code = "import base64, os\nprint(base64.b64encode(os.urandom(2 << 20)).decode())\n"
    origin = RunOrigin(turn_id=new_ulid(), session_id="s" * 32, user_id="u", scope=SCOPE)
    executor = SandboxExecutor(light())  # the marker and the label, not the preload, are the subject
    try:
        result = executor.run(root, code, limits=RunLimits(timeout_s=60), run_id=new_ulid(), origin=origin)
    finally:
        executor.close()
    # When the result comes back; Then its stdout marker says base64 and names charts/ + register_artifact
    assert result.stdout_truncated and f"looks like base64 {HINT}" in result.stdout
    # And the result says whether the environment was started for it
    assert result.environment_start == "cold" and (result.environment_start_ms or 0) > 0


def test_alphaagent_history_shows_both_sizes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a turn whose step printed 3,000,000 bytes
    home = tmp_path / "home"
    spec = {
        "spec_version": 1,
        "user_id": "u",
        "scope": {"conversation_id": "c-hist"},
        "goal": "print",
        "steps": [{"title": "print", "code": "print('z' * 2_999_999)"}],
    }
    with light_agent(home) as agent:
        assert_status(agent.run_analysis(spec), "completed")
    # When the history is shown
    monkeypatch.setenv("ALPHAAGENT_HOME", str(home))
    assert main(["history", "--user", "u", "--conversation", "c-hist"]) == 0
    # Then it says what the history keeps and what the code printed
    out = capsys.readouterr().out
    assert "# stdout truncated: history keeps" in out and "the code printed 3000000 bytes" in out, out


def test_a_long_run_of_digits_is_not_called_hex() -> None:
    text, cut = truncate_text("0123456789" * 100_000, 4096)
    assert cut and "looks like" not in text


def test_an_environment_that_cannot_start_is_labelled_not_blamed_on_the_code(tmp_path: Path) -> None:
    # Given an environment whose interpreter does not exist
    from alphaagent.errors import EnvStartError, SandboxError
    from alphaagent.sandbox.config import SandboxConfig
    from alphaagent.sandbox.supervisor import Sandbox

    sandbox = Sandbox(SandboxConfig(python=str(tmp_path / "no-python")))
    # When code is run there; Then the failure says the environment did not start (a platform error)
    try:
        with pytest.raises(EnvStartError, match="the environment did not start: cannot start the zygote"):
            sandbox.run("print(1)", cwd=tmp_path)
    finally:
        sandbox.close()
    assert issubclass(EnvStartError, SandboxError)


def test_the_second_run_of_an_environment_is_labelled_warm(tmp_path: Path) -> None:
    executor = SandboxExecutor(light())  # the marker and the label, not the preload, are the subject
    try:
        first, second = (
            executor.run(tmp_path, "print(1)", limits=RunLimits(timeout_s=30), run_id=new_ulid())
            for _ in range(2)
        )
    finally:
        executor.close()
    assert (first.environment_start, second.environment_start) == ("cold", "warm")
    assert second.environment_start_ms == 0
