"""Sessions hold live execution state (issue 13, DESIGN §4.7).

Runs go through the real sandbox (one module-wide ``Sandbox``) or the real local backend (one
``AlphaAgent``); the assertions are what a user sees: what the next run prints, the result's
``state`` report and readable line, and the state folder's files.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sandboxes import light_agent

from alphaagent.api import AlphaAgent
from alphaagent.domain.backend import TurnSettings
from alphaagent.domain.tools import TurnContext, run_in_env
from alphaagent.ids import new_ulid
from alphaagent.models.common import ConversationScope
from alphaagent.models.run import RunLimits
from alphaagent.sandbox.session import MANIFEST, StateRequest, state_files, state_path
from alphaagent.sandbox.supervisor import Sandbox, iter_result_lines

USER = "analyst@example.com"
MiB = 2**20
STATE_PY = Path(__file__).resolve().parents[2] / "alphaagent" / "sandbox" / "state.py"


@pytest.fixture
def sandbox(builtin_sandbox: Sandbox) -> Sandbox:
    """The worker's builtin sandbox (numpy and pandas preloaded, as the state of frames and arrays
    needs): a zygote of this module's own cost ~2 CPU-s more. Each test's state lives in its own
    ``scope_root``, so sharing the zygote shares no state."""
    return builtin_sandbox


@pytest.fixture
def scope_root(tmp_path: Path) -> Path:
    (tmp_path / "work").mkdir()
    return tmp_path


def _session() -> StateRequest:
    return StateRequest(session_id="s-" + new_ulid().lower())


def test_a_variable_set_in_one_run_is_there_in_the_next(sandbox: Sandbox, scope_root: Path) -> None:
    # Given a run of a session that defines a number, a frame, a function and a class instance
    session = _session()
    first = sandbox.run(
        "import pandas as pd\n"
        "x = 41\n"
        "frame = pd.DataFrame({'k': ['a', 'b'], 'v': [1, 2]})\n"
        "def plus(n):\n    return x + n\n"
        "class Box:\n    def __init__(self, v):\n        self.v = v\n"
        "box = Box(7)\n",
        cwd=scope_root,
        state=session,
    )
    assert first.status == "ok", first.error
    assert first.state is not None and set(first.state.saved) == {"pd", "x", "frame", "plus", "Box", "box"}

    # When the next run of the session uses them (and rebinds x, which the function must see)
    second = sandbox.run(
        "print(x + 1, int(frame['v'].sum()), box.v, pd.__name__)\nx = 1\nprint(plus(1))",
        cwd=scope_root,
        state=session,
    )

    # Then it prints what the first run left, and the result says what was restored
    assert second.stdout == "42 3 7 pandas\n2\n", second.error
    assert second.state is not None and second.state.restored_count == 6
    assert "state: restored pd, x, frame, plus, Box, box" in list(iter_result_lines(second))
    # And the state lives in the session's folder, which is not reported as the run's files
    assert (scope_root / state_path(session.session_id) / MANIFEST).is_file()
    assert second.files_changed == [] and first.files_changed == []


def test_an_object_that_cannot_be_kept_is_skipped_by_name_and_the_rest_survives(
    sandbox: Sandbox, scope_root: Path
) -> None:
    # Given a run that leaves a generator, an open file and a lock beside a number
    session = _session()
    first = sandbox.run(
        "import threading\n"
        "n = 5\n"
        "gen = (i for i in range(3))\n"
        "fh = open('work/notes.txt', 'w')\n"
        "lock = threading.Lock()\n",
        cwd=scope_root,
        state=session,
    )

    # Then each is skipped by name with the reason, and the readable text says so once
    assert first.status == "ok", first.error
    assert first.state is not None
    assert set(first.state.skipped) == {"gen", "fh", "lock"}
    assert "generator" in first.state.skipped["gen"]
    lines = "\n".join(iter_result_lines(first))
    assert lines.count("gen (") == 1 and "not kept:" in lines
    # And the next run has the number (and the module) but not the skipped names
    second = sandbox.run("print(n, 'gen' in globals(), threading.__name__)", cwd=scope_root, state=session)
    assert second.stdout == "5 False threading\n", second.error


def test_what_is_kept_of_files_and_streams_is_said_precisely(sandbox: Sandbox, scope_root: Path) -> None:
    # Given a run that leaves in-memory streams, a text file open for reading, and open files of
    # the kinds that cannot travel: writing, binary, a socket
    (scope_root / "work" / "in.txt").write_text("abc\n")
    session = _session()
    first = sandbox.run(
        "import io, socket\n"
        "sio = io.StringIO('hello')\nsio.seek(2)\n"
        "bio = io.BytesIO(b'bytes')\n"
        "reading = open('work/in.txt')\n"
        "writing = open('work/out.txt', 'w')\n"
        "binary = open('work/in.txt', 'rb')\n"
        "sock = socket.socket()\n",
        cwd=scope_root,
        state=session,
    )
    assert first.status == "ok", first.error
    assert first.state is not None
    # Then the streams and the text file being read are kept, the others skipped saying what they are
    assert {"sio", "bio", "reading"} <= set(first.state.saved)
    assert set(first.state.skipped) == {"writing", "binary", "sock"}
    for name, kind in (
        ("writing", "an open file or stream"),
        ("binary", "an open file"),
        ("sock", "a socket"),
    ):
        assert first.state.skipped[name].startswith(kind), first.state.skipped[name]
        assert first.state.skipped[name].endswith("; recreate it in the next run")
    # And the next run gets the streams as they were, and the read file as a StringIO of its contents
    second = sandbox.run(
        "print(sio.read(), bio.getvalue(), type(reading).__name__, repr(reading.read()))",
        cwd=scope_root,
        state=session,
    )
    assert second.stdout == "llo b'bytes' StringIO 'abc\\n'\n", second.error


def test_a_failing_run_keeps_what_it_had(sandbox: Sandbox, scope_root: Path) -> None:
    # Given a session holding a frame
    session = _session()
    sandbox.run("import numpy as np\nframe = np.arange(10)", cwd=scope_root, state=session)

    # When a later run defines more and then fails with a KeyError
    failed = sandbox.run("total = int(frame.sum())\n{}['missing']", cwd=scope_root, state=session)

    # Then the failure is the run's result, and both the frame and what the run set are kept
    assert failed.status == "error" and failed.error is not None and failed.error.name == "KeyError"
    after = sandbox.run("print(total, len(frame))", cwd=scope_root, state=session)
    assert after.stdout == "45 10\n", after.error


def test_a_killed_run_leaves_the_previous_state_whole(sandbox: Sandbox, scope_root: Path) -> None:
    # Given a session holding x = 1
    session = _session()
    sandbox.run("x = 1", cwd=scope_root, state=session)
    manifest = scope_root / state_path(session.session_id) / MANIFEST
    before = manifest.read_bytes()

    # When a run changes x and is then killed at its timeout while running
    timed_out = sandbox.run(
        "x = 2\nwhile True:\n    pass", cwd=scope_root, state=session, limits=RunLimits(timeout_s=1)
    )
    # And another is killed while its state is being saved (an object whose pickling never ends)
    killed_in_save = sandbox.run(
        "import time\nx = 3\nclass Slow:\n    def __reduce__(self):\n        time.sleep(60)\nslow = Slow()\n",
        cwd=scope_root,
        state=session,
        limits=RunLimits(timeout_s=2),
    )

    # Then both are timeouts, the manifest is the one from before, and the next run has x = 1
    assert (timed_out.status, killed_in_save.status) == ("timeout", "timeout")
    assert manifest.read_bytes() == before
    after = sandbox.run("print(x)", cwd=scope_root, state=session)
    assert after.stdout == "1\n", after.error


def test_an_array_changed_in_place_is_saved_again(sandbox: Sandbox, scope_root: Path) -> None:
    # Given a session holding a 16 MB array (mapped from the state file when restored)
    session = _session()
    sandbox.run("import numpy as np\na = np.zeros(2_000_000)", cwd=scope_root, state=session)
    unchanged = sandbox.run("print(a.shape)", cwd=scope_root, state=session)
    # Then a run that only reads it writes nothing new
    assert unchanged.state is not None and unchanged.state.written_bytes == 0, unchanged.state

    # When a run changes one element in place, without rebinding the name
    changed = sandbox.run("a[1_999_999] = 7.0", cwd=scope_root, state=session)

    # Then the change is saved (the whole buffer written again) and the next run sees it
    assert changed.state is not None and changed.state.written_bytes >= 16_000_000, changed.state
    after = sandbox.run("print(a[1_999_999], a[0])", cwd=scope_root, state=session)
    assert after.stdout == "7.0 0.0\n", after.error


def test_past_the_size_cap_the_largest_objects_are_dropped_with_the_reason(
    sandbox: Sandbox, scope_root: Path
) -> None:
    # Given a session whose state is capped at 1 MiB
    session = StateRequest(session_id="s-" + new_ulid().lower(), max_bytes=1 * MiB)

    # When a run leaves a 4 MB array and a small number
    run = sandbox.run("import numpy as np\nbig = np.ones(500_000)\nsmall = 3", cwd=scope_root, state=session)

    # Then the run is fine, the array is dropped naming the cap, the number is kept
    assert run.status == "ok", run.error
    assert run.state is not None and "big" in run.state.skipped and "cap" in run.state.skipped["big"]
    after = sandbox.run("print(small, 'big' in globals())", cwd=scope_root, state=session)
    assert after.stdout == "3 False\n", after.error


def test_a_fresh_run_has_empty_globals_and_keeps_the_saved_state(sandbox: Sandbox, scope_root: Path) -> None:
    # Given a session holding x
    session = _session()
    sandbox.run("x = 'kept'", cwd=scope_root, state=session)

    # When a fresh run looks for x and sets its own
    fresh = sandbox.run(
        "print('x' in globals())\nx = 'fresh'",
        cwd=scope_root,
        state=StateRequest(session_id=session.session_id, fresh=True),
    )

    # Then it saw nothing, and the next ordinary run still has the saved x
    assert fresh.stdout == "False\n" and fresh.state is not None and fresh.state.fresh
    assert sandbox.run("print(x)", cwd=scope_root, state=session).stdout == "kept\n"


def test_a_run_outside_a_session_keeps_nothing(sandbox: Sandbox, scope_root: Path) -> None:
    # Given a run without a session (alphaagent exec)
    run = sandbox.run("x = 1", cwd=scope_root)
    # Then it reports no state and writes no state folder
    assert run.state is None
    assert not (scope_root / "work" / "sessions").exists()


def test_the_state_files_listed_for_upload_end_with_the_manifest(sandbox: Sandbox, scope_root: Path) -> None:
    # Given a session with a large and a small object, and a stray file a run left in its folder
    session = _session()
    sandbox.run("import numpy as np\na = np.ones(300_000)\nb = 2", cwd=scope_root, state=session)
    folder = scope_root / state_path(session.session_id)
    (folder / "planted.bin").write_bytes(b"x")

    # Then only what the manifest names is listed, manifest last
    listed = state_files(scope_root, session.session_id)
    manifest = json.loads((folder / MANIFEST).read_bytes())
    assert listed[-1].endswith(MANIFEST)
    assert {p.rsplit("/", 1)[1] for p in listed[:-1]} == {
        manifest["pickle"],
        *(ref["file"] for ref in manifest["buffers"]),
    }
    assert not any(p.endswith("planted.bin") for p in listed)


# ----------------------------------------------------------------------------- through turns


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AlphaAgent]:
    with AlphaAgent(tmp_path_factory.mktemp("home"), turns=TurnSettings(lock_wait_s=30)) as shared:
        yield shared


def _spec(conversation: str, *steps: str | dict[str, Any]) -> dict[str, Any]:
    return {
        "spec_version": 1,
        "user_id": USER,
        "scope": {"conversation_id": conversation},
        "goal": "test live state",
        "steps": [
            {"title": f"step {i}", **(step if isinstance(step, dict) else {"code": step})}
            for i, step in enumerate(steps, start=1)
        ],
    }


def _stdout(agent: AlphaAgent, conversation: str, run_id: str) -> str:
    runs = {run.run_id: run for run in agent.history(USER, ConversationScope(conversation_id=conversation))}
    return runs[run_id].stdout


def test_variables_live_across_steps_and_turns_of_one_session(agent: AlphaAgent) -> None:
    # Given a conversation whose first turn defines a frame in step 1 and uses it in step 2
    conversation = "c-" + new_ulid().lower()
    first = agent.run_analysis(
        _spec(
            conversation,
            "import pandas as pd\nframe = pd.DataFrame({'v': [1, 2, 3]})",
            "print(int(frame.v.sum()))",
        )
    )
    assert first.status == "completed", first.error
    assert _stdout(agent, conversation, first.run_ids[1]) == "6\n"

    # When a later turn of the same session uses the frame, and a fresh step looks for it
    second = agent.run_analysis(
        _spec(conversation, "print(len(frame))", {"code": "print('frame' in globals())", "fresh": True})
    )

    # Then the frame is there in the later turn, and the fresh step started empty
    assert second.status == "completed", second.error
    assert _stdout(agent, conversation, second.run_ids[0]) == "3\n"
    assert _stdout(agent, conversation, second.run_ids[1]) == "False\n"


def test_two_conversations_states_never_mix(agent: AlphaAgent) -> None:
    # Given two conversations that set the same name to different values
    one, two = "c-" + new_ulid().lower(), "c-" + new_ulid().lower()
    agent.run_analysis(_spec(one, "secret = 'one'"))
    agent.run_analysis(_spec(two, "secret = 'two'"))

    # When each reads it in a later turn
    read_one = agent.run_analysis(_spec(one, "print(secret)"))
    read_two = agent.run_analysis(_spec(two, "print(secret)"))

    # Then each sees its own value only
    assert _stdout(agent, one, read_one.run_ids[0]) == "one\n"
    assert _stdout(agent, two, read_two.run_ids[0]) == "two\n"


def test_a_coder_run_and_the_next_share_the_state_within_a_turn(agent: AlphaAgent) -> None:
    # Given a turn driven by a coder that calls run_in_env twice
    conversation = "c-" + new_ulid().lower()
    outputs: list[str] = []

    def script(ctx: TurnContext) -> str:
        run_in_env(ctx, "rows = [1, 2, 3]")
        outputs.append(run_in_env(ctx, "print(sum(rows))").stdout)
        return "done"

    agent.coder = script
    spec = _spec(conversation, "x = 1")
    del spec["steps"]
    try:
        result = agent.run_analysis(spec)
    finally:
        agent.coder = None
    # Then the second run saw the first run's variable
    assert result.status == "completed", result.error
    assert outputs == ["6\n"]


def test_after_the_session_expires_globals_are_empty_and_files_are_there(tmp_path: Path) -> None:
    # Given a backend whose sessions expire after 1 s idle, and a turn that leaves a variable and a file
    conversation = "c-" + new_ulid().lower()
    with light_agent(tmp_path / "home", turns=TurnSettings(session_idle_timeout_s=1)) as short:
        first = short.run_analysis(_spec(conversation, "x = 1\nopen('work/kept.txt', 'w').write('kept')"))
        assert first.status == "completed", first.error
        root = short.workspace.local_root(ConversationScope(conversation_id=conversation))
        sessions = root / "work" / "sessions"
        first_session = short.turn(USER, first.turn_id).session_id
        assert [p.name for p in sessions.iterdir()] == [first_session]

        # When the next turn comes after the session expired
        time.sleep(2.5)
        second = short.run_analysis(
            _spec(conversation, "print('x' in globals(), open('work/kept.txt').read())")
        )

        # Then it runs in a new session with empty globals, the file is there, the old state is gone
        assert second.status == "completed", second.error
        assert short.turn(USER, second.turn_id).session_id != first_session
        assert _stdout(short, conversation, second.run_ids[0]) == "False kept\n"
        assert first_session not in [p.name for p in sessions.iterdir()]


def test_a_run_near_its_timeout_skips_its_save_rather_than_time_out(
    sandbox: Sandbox, scope_root: Path
) -> None:
    # Given a session holding x = 1
    session = _session()
    sandbox.run("x = 1", cwd=scope_root, state=session)

    # When a run changes x and ends with less than the save margin left of its 3 s
    late = sandbox.run(
        "import time\nx = 2\ntime.sleep(2.2)", cwd=scope_root, state=session, limits=RunLimits(timeout_s=3)
    )

    # Then the run's result is its own (ok), the save is skipped with the reason, and x is still 1
    assert late.status == "ok", late.reason
    assert late.state is not None and late.state.save_error and "timeout" in late.state.save_error
    assert sandbox.run("print(x)", cwd=scope_root, state=session).stdout == "1\n"


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_a_process_that_is_not_dumpable_opens_its_pagemap_only_in_the_window() -> None:
    # Given a non-root process that is not dumpable (what a run on Lambda is)
    script = (
        "import ctypes, importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('_alphaagent_state', {str(STATE_PY)!r})\n"
        "st = importlib.util.module_from_spec(spec); spec.loader.exec_module(st)\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.prctl(4, 0, 0, 0, 0)\n"
        "direct = st.open_pagemap(None)\n"
        "window = st.open_pagemap(lambda on: libc.prctl(4, 1 if on else 0, 0, 0, 0))\n"
        "print(direct, window, libc.prctl(3, 0, 0, 0, 0))\n"
    )

    # When it opens its pagemap without, then with, the dumpable window
    probe = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    # Then only the window opens it, and the process is not dumpable afterwards
    assert probe.stdout.split() == ["False", "True", "0"], probe.stderr
