"""The given cases (output caps and noise, encodings, limits, process lifecycle, leakage between runs,
charts, credentials, symlinks) run end to end through a real ``Sandbox``: a warm zygote, a forked child,
the supervisor's capture and file-change report. Each test asserts what the coder would notice in the
run result (DESIGN §4.3, §4.4, §5).

Sandboxes are module-scoped (starting one costs about a second), the builtin ones shared by the
worker's modules (tests/conftest.py); every test gets a fresh scope root.
Exclusive mode (the env Lambda's) runs only in a supervisor subprocess inside its own user and pid
namespaces: after each run it kills every other process of its uid, which on a shared host would
reach processes that have nothing to do with the test.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from assertions import assert_status
from sandboxes import light

from alphaagent.models.run import RunLimits, RunResult
from alphaagent.sandbox.capture import STORED_HISTORY_CAP_BYTES, truncate_text
from alphaagent.sandbox.config import SandboxConfig
from alphaagent.sandbox.supervisor import Sandbox

MiB = 2**20
KiB = 2**10
RETURNED_CAP = 1 * MiB  # DESIGN §4.3: returned output per stream
SPILL_CAP = 64 * MiB  # DESIGN §4.3: full-output spill per stream
SMALL_CAP = 64 * KiB  # returned cap of the small-caps sandbox
SMALL_SPILL = 4 * MiB  # spill cap (and so the kill-on-output threshold) of the small-caps sandbox
SCOPE_FOLDERS = ("spec", "docs", "datasets", "charts", "reports", "work")
# The marker documented on CapturedStream.text: what the coder reads at the cut.
MARKER_RE = re.compile(r"\n\[\.\.\. truncated: (\d+) bytes omitted, kept (\d+) of (\d+) bytes \.\.\.\]\n")
C0_EXCEPT_TAB_NEWLINE = re.compile(r"[\x00-\x08\x0b-\x1f]")


# -- fixtures --------------------------------------------------------------------------------------


@contextlib.contextmanager
def started(config: SandboxConfig) -> Iterator[Sandbox]:
    sandbox = Sandbox(config)
    try:
        sandbox.start()
        yield sandbox
    finally:
        sandbox.close()


@pytest.fixture
def sandbox(builtin_sandbox: Sandbox) -> Sandbox:
    """The local default: builtin preloads, namespaces where the kernel allows them (the worker's
    warm one, tests/conftest.py)."""
    if builtin_sandbox.isolation != "namespaces":
        pytest.skip(f"namespaces unavailable here: {builtin_sandbox.info.get('isolation_detail')}")
    return builtin_sandbox


@pytest.fixture(scope="module")
def light_sandbox() -> Iterator[Sandbox]:
    """Namespaces, nothing preloaded: for what the supervisor does with a run's output (capture,
    caps, encodings, pipes), which the preload has no part in (tests/sandboxes.py)."""
    with started(light()) as box:
        if box.isolation != "namespaces":
            pytest.skip(f"namespaces unavailable here: {box.info.get('isolation_detail')}")
        yield box


@pytest.fixture(scope="module")
def process_sandbox() -> Iterator[Sandbox]:
    """The Lambda level of isolation (no namespaces), non-exclusive, nothing preloaded: the cases
    run there (output, limits, daemons, leakage between runs) do not depend on the preload."""
    with started(light(isolation="process")) as box:
        yield box


@pytest.fixture(params=["namespaces", "process"])
def any_sandbox(request: pytest.FixtureRequest) -> Sandbox:
    """Both isolation levels, nothing preloaded, for supervisor behaviour that must hold at each
    (output, limits, daemons, the scratch dirs, the file report): a fork of the builtin zygote
    copies the page tables of its scientific stack (~35 CPU-ms a run more, more again for each
    process a fork bomb makes), and the preload has no part in any of it (tests/sandboxes.py)."""
    return request.getfixturevalue("light_sandbox" if request.param == "namespaces" else "process_sandbox")


@pytest.fixture(scope="module")
def small_cap_sandbox() -> Iterator[Sandbox]:
    """Small caps so that cap boundaries and the kill-on-output path are cheap to reach."""
    with started(SandboxConfig(preload=(), returned_output_bytes=SMALL_CAP, spill_bytes=SMALL_SPILL)) as box:
        yield box


@pytest.fixture
def scope(tmp_path: Path) -> Path:
    """A fresh scope root with its six folders (DESIGN §4.2)."""
    return fresh_scope(tmp_path, "scope")


def fresh_scope(tmp_path: Path, name: str) -> Path:
    root = tmp_path / name
    for folder in SCOPE_FOLDERS:
        (root / folder).mkdir(parents=True)
    return root


def run(sandbox: Sandbox, code: str, cwd: Path, **limits: Any) -> RunResult:
    return sandbox.run(textwrap.dedent(code), cwd=cwd, limits=RunLimits(**{"timeout_s": 5, **limits}))


# -- assertion helpers -----------------------------------------------------------------------------


def split_at_marker(text: str) -> tuple[str, int, int, int, str]:
    """(head, omitted, kept, total, tail) of a truncated text; exactly one marker must be present."""
    markers = list(MARKER_RE.finditer(text))
    assert len(markers) == 1, f"expected one truncation marker, found {len(markers)}: {text[:200]!r}"
    marker = markers[0]
    omitted, kept, total = (int(group) for group in marker.groups())
    assert omitted + kept == total
    assert kept == len(text[: marker.start()].encode()) + len(text[marker.end() :].encode())
    return text[: marker.start()], omitted, kept, total, text[marker.end() :]


def assert_valid_json_payload(result: RunResult) -> None:
    """The result serialises to strict UTF-8 JSON with no raw or escaped NUL/C0 control in the output."""
    payload = result.model_dump_json()
    payload.encode("utf-8")  # strict: a lone surrogate would raise here
    assert "\\u0000" not in payload and "\x00" not in payload
    decoded = json.loads(payload)
    for stream in ("stdout", "stderr"):
        assert not C0_EXCEPT_TAB_NEWLINE.search(decoded[stream])


def live_processes_with(tag: str) -> list[str]:
    """Processes (not zombies) whose command line or name carries ``tag``, as readable descriptions."""
    import psutil

    found = []
    for proc in psutil.process_iter(["pid", "name", "cmdline", "status"]):
        info = proc.info
        if info["status"] == psutil.STATUS_ZOMBIE:
            continue
        cmdline = " ".join(info["cmdline"] or [])
        if tag in (info["name"] or "") or tag in cmdline:
            found.append(f"{info['pid']} {info['name']} {info['status']} {cmdline[:80]!r}")
    return found


class PeakRss:
    """Samples this process's RSS every few milliseconds; ``growth`` is peak minus the starting RSS."""

    def __init__(self) -> None:
        import psutil

        self._process = psutil.Process()
        self._stop = threading.Event()
        self.baseline = self.peak = self._process.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._process.memory_info().rss)
            time.sleep(0.005)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)

    @property
    def growth(self) -> int:
        return self.peak - self.baseline


def assert_next_run_works(sandbox: Sandbox, cwd: Path) -> None:
    result = run(sandbox, "print('next run')", cwd)
    assert (result.status, result.stdout) == ("ok", "next run\n")


# == OUT-01: endless printing ======================================================================

OUT_01 = 'import itertools\nfor n in itertools.count():\n    print(f"row {n}: still going")'
OUT_01_STDERR = (
    'import itertools, sys\nfor n in itertools.count():\n    sys.stderr.write(f"row {n}: still going\\n")'
)


@pytest.mark.parametrize(
    ("code", "stream"), [(OUT_01, "stdout"), (OUT_01_STDERR, "stderr")], ids=["stdout", "stderr"]
)
def test_out_01_endless_rows_end_at_the_limit_with_a_marked_head_and_tail(
    light_sandbox: Sandbox, scope: Path, code: str, stream: str
) -> None:
    # Given the case's never-ending row printer (and its stderr twin) and a 2 s limit
    # When it runs
    result = run(light_sandbox, code, scope, timeout_s=2)

    # Then it ends at the wall clock, or earlier at the output cap if the flood is fast enough
    assert_status(result, ("timeout", "killed"))
    expected_error = "TimeoutError" if result.status == "timeout" else "OutputLimitExceeded"
    assert result.error is not None and result.error.name == expected_error
    assert result.duration_ms <= 3000  # within 1 s of the limit
    # And the coder gets at most 1 MiB, marker included, saying how much was dropped
    text, total_bytes = getattr(result, stream), getattr(result, f"{stream}_bytes")
    assert getattr(result, f"{stream}_truncated")
    assert len(text.encode()) <= RETURNED_CAP
    head, _omitted, _kept, total, tail = split_at_marker(text)
    assert total == total_bytes > RETURNED_CAP  # plain ASCII: cleaned bytes are the raw bytes
    assert head.startswith("row 0: still going\nrow 1: still going\n")
    # And the tail holds the latest rows, consecutive
    rows = [int(m) for m in re.findall(r"^row (\d+): still going$", tail, flags=re.MULTILINE)]
    assert len(rows) > 1000 and rows == list(range(rows[0], rows[0] + len(rows)))
    # And the full output went to the spill, within its cap, not reported as the code's own file
    spill = scope / str(getattr(result, f"{stream}_path"))
    assert spill.is_file() and 0 < spill.stat().st_size <= SPILL_CAP
    assert spill.read_bytes()[:19] == b"row 0: still going\n"
    assert result.files_changed == []
    # And the next run in the same session works
    assert_next_run_works(light_sandbox, scope)


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_out_01_a_flood_past_the_spill_cap_is_killed_at_the_cap(
    small_cap_sandbox: Sandbox, scope: Path, stream: str
) -> None:
    # Given a sandbox whose spill cap is 4 MiB and a flood that would pass it in well under a second
    code = f"""
        import itertools, sys
        out = sys.{stream}
        for n in itertools.count():
            out.write(f"row {{n}}: still going\\n" * 100)
    """
    # When it runs with a generous wall clock
    result = run(small_cap_sandbox, code, scope, timeout_s=20)

    # Then it is killed for its output, long before the timeout, with a reason the coder can act on
    assert_status(result, "killed")
    assert result.error is not None and result.error.name == "OutputLimitExceeded"
    assert result.reason is not None and "output limit" in result.reason and "datasets/" in result.reason
    assert result.duration_ms < 10_000
    # And the byte count is true up to the kill decision (counting ends with the read, at most
    # 64 KiB, that crossed the cap), the returned text within the returned cap, marked
    total_bytes = getattr(result, f"{stream}_bytes")
    assert SMALL_SPILL < total_bytes <= SMALL_SPILL + 64 * 1024
    text = getattr(result, stream)
    assert len(text.encode()) <= SMALL_CAP
    split_at_marker(text)
    # And the spill file kept exactly the first spill-cap bytes
    spill = scope / str(getattr(result, f"{stream}_path"))
    assert spill.stat().st_size == SMALL_SPILL
    assert_next_run_works(small_cap_sandbox, scope)


# == OUT-04: 20 GB of NUL bytes ====================================================================

OUT_04 = (
    "import os\n"
    'chunk = b"\\0" * (1 << 20)\n'
    'out = os.fdopen(1, "wb", buffering=0)\n'
    "for _ in range(20_000):      # ~20 GB to stdout\n"
    "    out.write(chunk)"
)


@pytest.mark.parametrize(
    ("code", "stream"),
    [(OUT_04, "stdout"), (OUT_04.replace("os.fdopen(1,", "os.fdopen(2,"), "stderr")],
    ids=["stdout", "stderr"],
)
def test_out_04_nul_flood_is_cut_at_the_cap_with_flat_supervisor_memory(
    light_sandbox: Sandbox, scope: Path, code: str, stream: str
) -> None:
    # Given the case's 20 GB flood of NUL bytes (the default 64 MiB spill cap stops it, so the full
    # input runs as written)
    # When it runs while the supervisor's RSS is sampled
    with PeakRss() as rss:
        result = run(light_sandbox, code, scope, timeout_s=30)

    # Then the run is killed for its output, not by the wall clock
    assert_status(result, "killed")
    assert result.error is not None and result.error.name == "OutputLimitExceeded"
    assert result.reason is not None and "output limit" in result.reason
    # And it stopped at the cap: counting ends with the read (at most 64 KiB) that crossed it, and
    # the rest of the 20 GB was never produced
    total_bytes = getattr(result, f"{stream}_bytes")
    assert SPILL_CAP < total_bytes <= SPILL_CAP + 64 * 1024
    # And the supervisor kept a bounded amount of it: far less than the 64 MiB it read
    assert rss.growth < 32 * MiB, f"supervisor RSS grew by {rss.growth / MiB:.1f} MiB"
    # And the NULs come back replaced, never raw nor escaped as \u0000 in JSON, within the cap
    text = getattr(result, stream)
    assert getattr(result, f"{stream}_truncated") and result.non_utf8_output
    assert "\x00" not in text and set(split_at_marker(text)[0]) == {"\ufffd"}
    assert len(text.encode()) <= RETURNED_CAP
    assert_valid_json_payload(result)
    # And the supervisor survives: the next run works
    assert_next_run_works(light_sandbox, scope)


# == OUT-06: a large report printed instead of written =============================================

OUT_06 = (
    'rows = [f"id={i},value={i*i}" for i in range(120_000)]\nprint("\\n".join(rows))\nprint("END-OF-REPORT")'
)
OUT_06_STDERR = (
    "import sys\n"
    'rows = [f"id={i},value={i*i}" for i in range(120_000)]\n'
    'print("\\n".join(rows), file=sys.stderr)\n'
    'print("END-OF-REPORT", file=sys.stderr)'
)


def _out_06_expected() -> str:
    """What OUT_06 prints (~2.9 MB; built by the test that needs it, not by every worker's collection)."""
    return "\n".join(f"id={i},value={i * i}" for i in range(120_000)) + "\nEND-OF-REPORT\n"


@pytest.mark.parametrize(
    ("code", "stream"),
    [
        (OUT_06, "stdout"),
        (OUT_06_STDERR, "stderr"),
    ],
    ids=["stdout", "stderr"],
)
def test_out_06_large_report_keeps_head_and_tail_flags_the_size_and_spills_it_whole(
    light_sandbox: Sandbox, scope: Path, code: str, stream: str
) -> None:
    # Given the case's 120,000-row report (about 2.9 MB) printed in one go
    expected = _out_06_expected()
    # When it runs
    result = run(light_sandbox, code, scope)

    # Then it succeeds, flagged truncated with the true size
    assert_status(result, "ok")
    assert getattr(result, f"{stream}_truncated")
    assert getattr(result, f"{stream}_bytes") == len(expected)
    # And the text is head + marker + tail within 1 MiB, and the tail ('END-OF-REPORT') survives
    text = getattr(result, stream)
    assert len(text.encode()) <= RETURNED_CAP
    head, _omitted, _kept, total, tail = split_at_marker(text)
    assert total == len(expected)
    assert head.startswith("id=0,value=0\nid=1,value=1\n") and expected.startswith(head)
    assert tail.endswith("id=119999,value=14399760001\nEND-OF-REPORT\n") and expected.endswith(tail)
    # And the whole report is in the spill file the result points to (the coder's route to the rest;
    # being told to write datasets/ instead is the coder prompt's job, not this layer's)
    spill_path = getattr(result, f"{stream}_path")
    assert spill_path == f"work/runs/{result.run_id}/{stream}.txt"
    assert (scope / spill_path).read_text() == expected
    assert result.files_changed == []


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
@pytest.mark.parametrize(("size", "truncated"), [(SMALL_CAP, False), (SMALL_CAP + 1, True)])
def test_out_06_output_at_the_cap_is_whole_and_one_byte_more_is_truncated(
    small_cap_sandbox: Sandbox, scope: Path, stream: str, size: int, truncated: bool
) -> None:
    # Given output of exactly the returned cap (64 KiB here), or one byte more, ending with a marker line
    code = f"""
        import sys
        sys.{stream}.write("x" * ({size} - len("END-OF-REPORT\\n")) + "END-OF-REPORT\\n")
    """
    # When it runs
    result = run(small_cap_sandbox, code, scope)

    # Then at the cap the text is whole; one byte more is truncated within the cap, tail intact
    text = getattr(result, stream)
    assert_status(result, "ok")
    assert getattr(result, f"{stream}_bytes") == size
    assert getattr(result, f"{stream}_truncated") is truncated
    assert len(text.encode()) <= SMALL_CAP
    assert text.endswith("END-OF-REPORT\n")
    if truncated:
        assert split_at_marker(text)[3] == size
    else:
        assert MARKER_RE.search(text) is None and len(text) == size


def test_output_under_the_stored_history_cap_leaves_no_spill_file(
    light_sandbox: Sandbox, scope: Path
) -> None:
    # Given a run printing a few lines (well under the 16 KiB stored-history cap)
    # When it runs
    result = run(light_sandbox, "print('a few lines\\n' * 3)", scope)

    # Then the result is whole, names no spill file, and leaves nothing under work/runs
    assert (result.status, result.stdout_truncated) == ("ok", False)
    assert result.stdout_path is None and result.stderr_path is None
    assert not (scope / "work" / "runs").exists()


# == NOISE-01: progress-bar redraws ================================================================

NOISE_01 = (
    "import sys\n"
    "total = 300_000\n"
    "for i in range(total):\n"
    "    if i % 10 == 0:\n"
    "        sys.stderr.write(f\"\\rprocessing {i}/{total} [{'#' * (i * 30 // total):<30}]\")\n"
    'sys.stderr.write("\\n")\n'
    'print("finished")'
)


def _noise_01_raw() -> bytes:
    total = 300_000
    frames = (f"\rprocessing {i}/{total} [{'#' * (i * 30 // total):<30}]" for i in range(0, total, 10))
    return ("".join(frames) + "\n").encode()


def test_noise_01_progress_redraws_collapse_to_the_final_line_and_keep_the_raw_count(
    light_sandbox: Sandbox, scope: Path
) -> None:
    # Given the case's 30,000 carriage-return redraws of a progress bar on stderr (~1.9 MB)
    raw = _noise_01_raw()
    # When it runs
    result = run(light_sandbox, NOISE_01, scope)

    # Then the coder sees one line, the bar's final state, and 'finished'
    assert_status(result, "ok")
    assert result.stderr == f"processing 299990/300000 [{'#' * 29} ]\n"
    assert result.stdout == "finished\n"
    assert not result.stderr_truncated
    # And the raw size is recorded, and the raw redraws are kept in the spill
    assert result.stderr_bytes == len(raw) > RETURNED_CAP
    assert (scope / str(result.stderr_path)).read_bytes() == raw


def test_noise_01_the_child_is_told_it_has_no_terminal(any_sandbox: Sandbox, scope: Path) -> None:
    # Given code that asks what well-behaved progress bars ask
    code = """
        import os, sys
        print(os.environ.get("TERM"), os.environ.get("NO_COLOR"), sys.stdout.isatty(), sys.stderr.isatty())
    """
    # When it runs
    result = run(any_sandbox, code, scope)

    # Then TERM is dumb, NO_COLOR is set and neither stream is a TTY
    assert result.stdout == "dumb 1 False False\n"


@pytest.mark.parametrize(
    ("writes", "expected"),
    [
        pytest.param(
            [f"\r{pct:3d}% done" for pct in range(0, 101)] + ["\n"], "100% done\n", id="percent-redraws"
        ),
        pytest.param(
            [f"\x1b[2K\rstep {n}/500" for n in range(1, 501)] + ["\n"], "step 500/500\n", id="ansi-clear-line"
        ),
        pytest.param(
            ["\x1b[32mOK\x1b[0m passed\n", "\x1b[1;31mFAIL\x1b[0m failed\n"],
            "OK passed\nFAIL failed\n",
            id="colours",
        ),
        pytest.param(["line one\r\n", "line two\r\n"], "line one\nline two\n", id="crlf"),
        pytest.param(
            [f"\rdownload {n}" for n in range(300)]
            + ["\n"]
            + [f"\rextract {n}" for n in range(300)]
            + ["\n"],
            "download 299\nextract 299\n",
            id="two-bars",
        ),
        pytest.param(
            [f"\r\x1b[36m{'=' * n:<50}\x1b[0m {n * 2}%" for n in range(51)] + ["\n"],
            f"{'=' * 50} 100%\n",
            id="coloured-bar",
        ),
    ],
)
@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_noise_01_redraws_and_escapes_are_cleaned_on_either_stream(
    light_sandbox: Sandbox, scope: Path, writes: list[str], expected: str, stream: str
) -> None:
    # Given progress output written piece by piece, flushed after every piece
    code = f"""
        import sys
        for piece in {writes!r}:
            sys.{stream}.write(piece)
            sys.{stream}.flush()
    """
    # When it runs
    result = run(light_sandbox, code, scope)

    # Then the coder reads the final visible state, and the raw byte count is kept
    assert_status(result, "ok")
    assert getattr(result, stream) == expected
    assert getattr(result, f"{stream}_bytes") == len("".join(writes).encode())


# == ENC-01: bytes that are not UTF-8 ==============================================================

ENC_01 = (
    "import sys\n"
    "sys.stdout.buffer.write(bytes(range(256)))\n"
    'sys.stdout.buffer.write(b"\\nlatin-1 name: caf\\xe9\\n")\n'
    'sys.stderr.buffer.write(b"\\xff\\xfe legacy warning\\n")\n'
    'print("done")'
)


def test_enc_01_every_byte_value_comes_back_as_valid_text_and_the_run_succeeds(
    any_sandbox: Sandbox, scope: Path
) -> None:
    # Given the case's 256 byte values, a Latin-1 name and a UTF-16 BOM on stderr
    # When it runs
    result = run(any_sandbox, ENC_01, scope)

    # Then it succeeds, the output is flagged as not UTF-8, and 'done' is there
    assert (result.status, result.exit_code, result.error) == ("ok", 0, None)
    assert result.non_utf8_output
    assert result.stdout.endswith("latin-1 name: caf\ufffd\ndone\n")
    assert result.stderr == "\ufffd\ufffd legacy warning\n"
    # And printable ASCII survives in order, the true byte counts are kept
    assert "".join(chr(c) for c in range(0x20, 0x7F)) in result.stdout
    assert result.stdout_bytes == 256 + len(b"\nlatin-1 name: caf\xe9\n") + len(b"done\n")
    assert result.stderr_bytes == len(b"\xff\xfe legacy warning\n")
    # And the whole result is valid UTF-8 JSON without raw control characters
    assert_valid_json_payload(result)


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(b"\xff", id="never-valid-byte"),
        pytest.param(b"\x80\xbf", id="lone-continuation-bytes"),
        pytest.param(b"\xc0\xaf", id="overlong-slash"),
        pytest.param(b"\xed\xa0\x80", id="encoded-surrogate"),
        pytest.param(b"\xf4\x90\x80\x80", id="beyond-u10ffff"),
        pytest.param(b"\xe6\xb1", id="truncated-3-byte-char"),
        # ESC followed by a printable character is a complete (stripped) escape sequence: a stray
        # one is an ESC before a line end
        pytest.param(b"\x1b\n", id="stray-escape"),
        pytest.param(b"\x00\x07\x08", id="nul-bell-backspace"),
    ],
)
@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_enc_01_invalid_sequences_become_replacement_characters_on_either_stream(
    light_sandbox: Sandbox, scope: Path, bad: bytes, stream: str
) -> None:
    # Given bytes that are not valid text between two valid words
    code = f"import sys\nsys.{stream}.buffer.write(b'before ' + {bad!r} + b' after\\n')"
    # When it runs
    result = run(light_sandbox, code, scope)

    # Then the words survive around U+FFFD, the flag is set and the JSON is clean
    text = getattr(result, stream)
    assert_status(result, "ok")
    assert result.non_utf8_output
    assert text.startswith("before ") and text.endswith(" after\n") and "\ufffd" in text
    assert getattr(result, f"{stream}_bytes") == len(b"before " + bad + b" after\n")
    assert_valid_json_payload(result)


def test_enc_01_the_last_bytes_of_a_stream_being_an_incomplete_character_do_not_crash(
    light_sandbox: Sandbox, scope: Path
) -> None:
    # Given a stream that ends in the middle of a 4-byte character
    code = "import sys\nsys.stdout.buffer.write('done 🙂'.encode()[:-2])"
    # When it runs
    result = run(light_sandbox, code, scope)

    # Then it succeeds with the complete part and one U+FFFD
    assert (result.status, result.stdout, result.non_utf8_output) == ("ok", "done \ufffd", True)


@pytest.mark.parametrize(
    "code",
    [
        pytest.param(
            "import sys, time\nfor b in '汉字 🙂 é'.encode():\n"
            "    sys.stdout.buffer.write(bytes([b])); sys.stdout.flush(); time.sleep(0.002)\n",
            id="byte-by-byte-with-pauses",
        ),
        pytest.param("print('replacement char printed on purpose: \\ufffd')", id="literal-u-fffd"),
    ],
)
def test_enc_01_valid_text_is_never_flagged_nor_replaced(
    light_sandbox: Sandbox, scope: Path, code: str
) -> None:
    # Given valid UTF-8 split across writes, or a U+FFFD the code prints itself
    # When it runs
    result = run(light_sandbox, code, scope)

    # Then nothing is replaced and the flag stays off
    assert_status(result, "ok")
    assert not result.non_utf8_output
    assert result.stdout.count("\ufffd") == ("\\ufffd" in code)


# == ENC-04: truncation of multi-byte text =========================================================

ENC_04 = (
    'print("汉字" * 600_000)     # ~3.6 MB of 3-byte characters\n'
    'print("🙂" * 300_000)       # ~1.2 MB of 4-byte characters'
)
ENC_04_EXPECTED = "汉字" * 600_000 + "\n" + "🙂" * 300_000 + "\n"


@pytest.fixture(scope="module", params=[0, 1, 2, 3], ids=lambda k: f"cap-1MiB+{k}")
def enc_sandbox(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    """The returned cap at every offset mod 4 (so both cuts land at every position in a character)."""
    with started(SandboxConfig(preload=(), returned_output_bytes=RETURNED_CAP + request.param)) as box:
        yield box


def assert_clean_code_point_cut(text: str, original: str, cap: int) -> None:
    assert len(text.encode()) <= cap
    assert "\ufffd" not in text
    head, _omitted, _kept, total, tail = split_at_marker(text)
    assert total == len(original.encode())
    assert original.startswith(head) and original.endswith(tail)


def test_enc_04_cuts_land_on_code_points_within_the_cap_for_both_truncations(
    enc_sandbox: Sandbox, scope: Path
) -> None:
    # Given the case's 3.6 MB of 3-byte and 1.2 MB of 4-byte characters, under a cap at offset k mod 4
    cap = enc_sandbox.config.returned_output_bytes
    # When it runs
    result = run(enc_sandbox, ENC_04, scope)

    # Then the returned text fits the cap, marker included, cut on code points, with no U+FFFD
    assert_status(result, "ok")
    assert result.stdout_truncated and not result.non_utf8_output
    assert result.stdout_bytes == len(ENC_04_EXPECTED.encode())
    assert_clean_code_point_cut(result.stdout, ENC_04_EXPECTED, cap)
    assert result.stdout.startswith("汉字汉字") and result.stdout.endswith("🙂🙂\n")
    # And the second truncation (the 16 KiB stored history) of this very text keeps the same
    # properties at every offset mod 4
    for k in range(4):
        stored, truncated = truncate_text(result.stdout, STORED_HISTORY_CAP_BYTES + k)
        assert truncated
        assert len(stored.encode()) <= STORED_HISTORY_CAP_BYTES + k
        assert "\ufffd" not in stored
        head, *_, tail = split_at_marker(stored)
        assert result.stdout.startswith(head) and result.stdout.endswith(tail)


@pytest.mark.parametrize(
    "unit",
    [
        pytest.param("é", id="2-byte"),
        pytest.param("aé汉🙂", id="mixed-widths"),
        pytest.param("🙂x", id="4+1"),
    ],
)
def test_enc_04_other_character_widths_are_cut_cleanly_too(
    enc_sandbox: Sandbox, scope: Path, unit: str
) -> None:
    # Given about 1.5 MB of text made of characters of other widths, on stderr this time
    repeat = (3 * RETURNED_CAP // 2) // len(unit.encode()) + 1
    expected = unit * repeat + "\n"
    code = f"import sys\nsys.stderr.write({unit!r} * {repeat} + '\\n')"
    # When it runs
    result = run(enc_sandbox, code, scope)

    # Then the stderr cut is clean and within the cap
    assert_status(result, "ok")
    assert result.stderr_truncated
    assert_clean_code_point_cut(result.stderr, expected, enc_sandbox.config.returned_output_bytes)


# == RES-02: fork bomb =============================================================================

FORK_BOMB = """
    import ctypes, os
    ctypes.CDLL(None).prctl(15, {tag!r}.encode(), 0, 0, 0)  # PR_SET_NAME: lets the test find survivors
    while True:
        try:
            os.fork()
        except OSError:
            pass
"""


def test_res_02_the_case_fork_bomb_ends_and_the_next_run_works(light_sandbox: Sandbox, scope: Path) -> None:
    # Given the case's fork bomb exactly as written
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    # When it runs under a 2 s limit and 32 processes
    result = run(light_sandbox, code, scope, timeout_s=2, processes=32)

    # Then it ends with a timeout or resource-limit error, and the environment still works
    assert_status(result, ("timeout", "killed"))
    assert result.error is not None
    assert_next_run_works(light_sandbox, scope)


def test_res_02_fork_bomb_is_bounded_killed_entirely_and_spares_a_concurrent_user(
    any_sandbox: Sandbox, tmp_path: Path
) -> None:
    # Given the case's fork bomb, its processes named with a tag, limited to 32 processes and 2 s
    tag = f"fb{secrets.token_hex(4)}"
    bomber, other = fresh_scope(tmp_path, "user-a"), fresh_scope(tmp_path, "user-b")
    # When it runs while another user's run starts on the same sandbox a moment later
    with ThreadPoolExecutor(max_workers=2) as pool:
        bomb = pool.submit(run, any_sandbox, FORK_BOMB.format(tag=tag), bomber, timeout_s=2, processes=32)
        time.sleep(0.7)
        concurrent = run(any_sandbox, "print('other user')", other)
        result = bomb.result()
    survivors = live_processes_with(tag)

    # Then the bomb ends with a timeout or resource-limit error that names the process limit
    assert_status(result, ("timeout", "killed"))
    assert result.error is not None
    assert result.reason is not None and "process limit (32)" in result.reason
    assert result.duration_ms < 2000 + 5000  # bounded by the limit plus the kill and drain
    # And no process of it survives the run
    assert survivors == []
    # And the other user's run was unaffected, and the next run works
    assert (concurrent.status, concurrent.stdout) == ("ok", "other user\n")
    assert_next_run_works(any_sandbox, bomber)


FORKS_THEN_WAITS = """
    import os, time
    kids = 0
    while True:
        try:
            pid = os.fork()
        except OSError:  # refused: the process limit
            break
        if pid == 0:
            time.sleep(600)
            os._exit(0)
        kids += 1
    print('refused after', kids, flush=True)
    time.sleep(600)
"""


def test_res_02_the_process_limit_is_named_when_the_run_exits_before_the_supervisor_kills_it(
    any_sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a root supervisor whose runs get a pids cgroup (as root, RLIMIT_NPROC binds nothing:
    # the cgroup's pids.max is the process limit), and a grace after the timeout's interrupt so long
    # that the run always exits by itself, and its cgroup is removed, before the supervisor would
    # kill it: the order a loaded machine can produce (the case's fork bomb at the process level)
    from alphaagent.sandbox import supervisor
    from alphaagent.sandbox.cgroup import RunCgroups

    cgroups = RunCgroups.detect(("pids",))
    if cgroups is None:
        pytest.skip("no writable pids controller here (not root): RLIMIT_NPROC is the limit then")
    cgroups.close()
    monkeypatch.setattr(supervisor, "_GRACE_AFTER_INTERRUPT_S", 60.0)
    # When code forks until a fork is refused, then waits past its 2 s timeout
    result = run(any_sandbox, FORKS_THEN_WAITS, fresh_scope(tmp_path, "s"), timeout_s=2, processes=8)

    # Then it ends on its own at the interrupt (no kill), and the reason still names the process limit
    assert_status(result, "timeout")
    assert result.stdout.startswith("refused after ")
    assert result.duration_ms < 30_000  # ended by the interrupt, not by the 60 s grace's kill
    assert result.reason is not None and "the process limit (8) was reached" in result.reason


# == RES-03: memory hog ============================================================================

RES_03 = "hog = []\nwhile True:\n    hog.append(bytearray(64 * 1024 * 1024))"


@pytest.mark.parametrize(
    "hog",
    [
        pytest.param(RES_03, id="case-bytearray-loop"),
        pytest.param("blob = bytearray(64 * 2**30)", id="one-giant-bytearray"),
        pytest.param("import numpy as np\narr = np.ones(2**33)", id="numpy-array"),
        pytest.param("parts = []\nwhile True:\n    parts.append('x' * 50_000_000)", id="growing-strings"),
        pytest.param("data = b'x' * 2**20\nwhile True:\n    data = data * 2", id="doubling-bytes"),
    ],
)
def test_res_03_memory_hog_reports_the_memory_limit_and_keeps_partial_output(
    sandbox: Sandbox, scope: Path, hog: str
) -> None:
    # Given code that prints progress, then allocates without bound, under a 1024 MB limit
    code = "print('loaded 3 rows', flush=True)\n" + hog
    # When it runs
    result = run(sandbox, code, scope, timeout_s=15, memory_mb=1024)

    # Then the coder reads 'memory limit exceeded (1024 MB)': not a timeout, not a bare MemoryError
    assert_status(result, "killed")
    assert result.error is not None and result.error.name == "MemoryLimitExceeded"
    assert result.reason == "memory limit exceeded (1024 MB)"
    assert "memory limit exceeded (1024 MB)" in result.error.value
    # And the output printed before is kept, and the supervisor reports well before the wall clock
    assert result.stdout == "loaded 3 rows\n"
    assert result.duration_ms < 15_000
    assert_next_run_works(sandbox, scope)


def test_res_03_memory_limit_holds_at_the_process_level(process_sandbox: Sandbox, scope: Path) -> None:
    # Given the case's hog at the Lambda level of isolation
    # When it runs
    result = run(
        process_sandbox, "print('start', flush=True)\n" + RES_03, scope, timeout_s=15, memory_mb=1024
    )

    # Then the same memory-limit result comes back
    assert result.isolation.level == "process"
    assert (result.status, result.reason) == ("killed", "memory limit exceeded (1024 MB)")
    assert result.stdout == "start\n"


# == PROC-01: background processes that outlive the run ============================================

PROC_01 = (
    "import subprocess, sys\n"
    'beacon = "import time, pathlib\\nwhile True:\\n'
    "    pathlib.Path('/tmp/beacon').write_text(str(time.time())); time.sleep(1)\\n\"\n"
    'subprocess.Popen([sys.executable, "-c", beacon], start_new_session=True,\n'
    "                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)\n"
    'print("spawned")'
)


def test_proc_01_the_case_daemon_is_gone_and_the_next_run_sees_no_beacon(
    light_sandbox: Sandbox, scope: Path
) -> None:
    # Given the case's beacon daemon, started in a new session
    # When it runs, and then the next execution looks for the beacon
    result = run(light_sandbox, PROC_01, scope, timeout_s=10)
    follow_up = run(light_sandbox, "import os; print(os.path.exists('/tmp/beacon'))", scope)

    # Then the run returns promptly with 'spawned', and the next execution prints False
    assert (result.status, result.stdout) == ("ok", "spawned\n")
    assert result.duration_ms < 5000
    assert result.isolation.level == "namespaces"
    assert follow_up.stdout == "False\n"


# How the daemon detaches. {launch} starts `beacon` (python source) so that it outlives the run.
DAEMON_LAUNCHES = {
    "popen-new-session": """
        subprocess.Popen([sys.executable, "-c", beacon], start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    """,
    "double-fork": """
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                os.execv(sys.executable, [sys.executable, "-c", beacon])
            os._exit(0)
        os.wait()
    """,
    "new-process-group-ignoring-signals": """
        subprocess.Popen([sys.executable, "-c", "import signal\\n"
                          "for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):\\n"
                          "    signal.signal(s, signal.SIG_IGN)\\n" + beacon],
                         process_group=0, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    """,
    "shell-nohup-background": """
        subprocess.run(f"nohup {sys.executable} -c {shlex.quote(beacon)} >/dev/null 2>&1 &", shell=True)
    """,
    "holding-the-stdout-pipe": """
        subprocess.Popen([sys.executable, "-c", beacon], start_new_session=True)
    """,
}


def daemon_code(launch: str, beacon_path: str, tag: str) -> str:
    """Start a beacon daemon the given way, wait until it has written once, then print 'spawned'."""
    return (
        textwrap.dedent(
            f"""
            import os, shlex, subprocess, sys, time
            BEACON = {beacon_path!r}
            beacon = (f"import time, pathlib\\nwhile True:\\n"
                      f"    pathlib.Path({{BEACON!r}}).write_text(str(time.time())); time.sleep(1)\\n"
                      f"# {tag}\\n")
            """
        )
        + textwrap.dedent(launch)
        + textwrap.dedent(
            """
            deadline = time.monotonic() + 5
            while not os.path.exists(BEACON) and time.monotonic() < deadline:
                time.sleep(0.01)
            print("spawned", os.path.exists(BEACON))
            """
        )
    )


@pytest.mark.parametrize("launch", list(DAEMON_LAUNCHES))
def test_proc_01_every_kind_of_daemon_is_killed_before_the_run_returns(
    light_sandbox: Sandbox, scope: Path, launch: str
) -> None:
    # Given a daemon started one of the usual ways, writing /tmp/beacon-<tag> every second
    tag = f"beacon{secrets.token_hex(4)}"
    beacon_path = f"/tmp/beacon-{tag}"
    # When the run starts it, waits until it is alive, and returns; then the next run looks for it
    result = run(light_sandbox, daemon_code(DAEMON_LAUNCHES[launch], beacon_path, tag), scope, timeout_s=10)
    survivors = live_processes_with(tag)
    follow_up = run(light_sandbox, f"import os; print(os.path.exists({beacon_path!r}))", scope)

    # Then the run returned promptly (the daemon was alive at its end), and nothing of it survives
    assert (result.status, result.stdout) == ("ok", "spawned True\n")
    assert result.duration_ms < 5000
    assert survivors == []
    # And the next execution sees no beacon
    assert follow_up.stdout == "False\n"


@pytest.mark.parametrize("launch", ["popen-new-session", "double-fork", "holding-the-stdout-pipe"])
def test_proc_01_daemons_are_killed_at_the_process_level_too(
    process_sandbox: Sandbox, scope: Path, launch: str
) -> None:
    # Given a daemon writing a beacon in the workspace (shared by both runs at the process level)
    tag = f"beacon{secrets.token_hex(4)}"
    beacon = scope / "work" / f"beacon-{tag}.txt"
    # When the run starts it and returns
    result = run(process_sandbox, daemon_code(DAEMON_LAUNCHES[launch], str(beacon), tag), scope, timeout_s=10)
    survivors = live_processes_with(tag)
    written = beacon.read_text()
    time.sleep(1.3)

    # Then no process of it survives, and the beacon is no longer refreshed
    assert (result.status, result.stdout, result.isolation.level) == ("ok", "spawned True\n", "process")
    assert result.duration_ms < 5000
    assert survivors == []
    assert beacon.read_text() == written


# == PROC-02: pipes and capture ====================================================================

PROC_02_A = (
    "import subprocess, sys\n"
    'p = subprocess.Popen([sys.executable, "-c", "print(\'x\' * 500_000)"], stdout=subprocess.PIPE)\n'
    "p.wait()\n"
    "print(len(p.stdout.read()))"
)
PROC_02_B = 'import sys\nsys.stderr.write("e" * 300_000)\nprint("done")'


@pytest.mark.parametrize(
    ("code", "partial"),
    [
        pytest.param(PROC_02_A, "", id="case"),
        pytest.param(
            "print('starting export', flush=True)\n" + PROC_02_A, "starting export\n", id="after-output"
        ),
        pytest.param(
            PROC_02_A.replace("print('x' * 500_000)", "import sys; sys.stderr.write('x' * 500_000)").replace(
                "stdout=subprocess.PIPE)", "stderr=subprocess.PIPE)"
            ),
            "",
            id="stderr-pipe",
        ),
    ],
)
def test_proc_02_a_child_blocked_on_a_full_pipe_times_out_with_a_hint(
    light_sandbox: Sandbox, scope: Path, code: str, partial: str
) -> None:
    # Given code that waits for a child which is blocked writing 500 kB into an unread pipe
    # When it runs under a 2 s limit
    result = run(light_sandbox, code, scope, timeout_s=2)

    # Then it times out within 1 s of the limit, keeping the output so far
    assert_status(result, "timeout")
    assert result.error is not None and result.error.name == "TimeoutError"
    assert result.duration_ms <= 3000
    assert result.stdout == partial
    # And the reason tells the coder what went wrong and what to use instead
    assert result.reason is not None and "full pipe" in result.reason and "communicate()" in result.reason
    assert_next_run_works(light_sandbox, scope)


def test_proc_02_b_a_large_stderr_write_before_stdout_finishes_normally(
    light_sandbox: Sandbox, scope: Path
) -> None:
    # Given the case's probe: 300 kB to stderr, then a line to stdout
    # When it runs
    result = run(light_sandbox, PROC_02_B, scope)

    # Then it finishes normally with both streams whole
    assert (result.status, result.stdout) == ("ok", "done\n")
    assert result.stderr == "e" * 300_000 and result.stderr_bytes == 300_000


@pytest.mark.parametrize(
    "code",
    [
        pytest.param(
            "import os\nos.write(1, b'o' * 3_000_000)\nos.write(2, b'e' * 3_000_000)\n"
            "os.write(1, b'\\nOUT-END\\n')\nos.write(2, b'\\nERR-END\\n')",
            id="stdout-first",
        ),
        pytest.param(
            "import os\nos.write(2, b'e' * 3_000_000)\nos.write(1, b'o' * 3_000_000)\n"
            "os.write(1, b'\\nOUT-END\\n')\nos.write(2, b'\\nERR-END\\n')",
            id="stderr-first",
        ),
        pytest.param(
            "import os\nfor _ in range(45):\n    os.write(1, b'o' * 65_536)\n    os.write(2, b'e' * 65_536)\n"
            "os.write(1, b'o' * (3_000_000 - 45 * 65_536))\nos.write(2, b'e' * (3_000_000 - 45 * 65_536))\n"
            "os.write(1, b'\\nOUT-END\\n')\nos.write(2, b'\\nERR-END\\n')",
            id="interleaved",
        ),
        pytest.param(
            "import subprocess, sys\n"
            "subprocess.run([sys.executable, '-c', 'import os, threading\\n"
            't = threading.Thread(target=os.write, args=(2, b"e" * 3_000_000)); t.start()\\n'
            'os.write(1, b"o" * 3_000_000); t.join()\'], check=True)\n'
            "print('\\nOUT-END'); print('\\nERR-END', file=sys.stderr)",
            id="grandchild-both-at-once",
        ),
    ],
)
def test_proc_02_b_both_streams_are_drained_concurrently(
    light_sandbox: Sandbox, scope: Path, code: str
) -> None:
    # Given 3 MB written to each stream, in an order that wedges a reader of one stream at a time
    # When it runs
    result = run(light_sandbox, code, scope, timeout_s=10)

    # Then it finishes normally with the exact byte counts and both ends intact
    assert_status(result, "ok", result.reason)
    assert result.stdout_bytes == 3_000_000 + len("\nOUT-END\n")
    assert result.stderr_bytes == 3_000_000 + len("\nERR-END\n")
    assert result.stdout.endswith("o\nOUT-END\n") and result.stderr.endswith("e\nERR-END\n")


# == ENV-01: what one run leaves for the next ======================================================

ENV_01_A = (
    "import os\n"
    'open("/tmp/handoff.txt", "w").write("acct=ACME-123 token=redacted")\n'
    'os.environ["LAST_CUSTOMER"] = "user-A"'
)
ENV_01_B = (
    "import os\n"
    'print(sorted(os.listdir("/tmp")))\n'
    'print(os.path.exists("/tmp/handoff.txt"), os.environ.get("LAST_CUSTOMER"))'
)


# Reading of "B sees none of A's files": a run's private /tmp and /dev/shm start empty except for the
# paths that lead to the run's own working directory, HOME and interpreter, which the sandbox binds
# back in when they live there (pytest's tmp_path is under /tmp; the default scratch root, holding HOME, is under
# /dev/shm). Everything else found under them is foreign.
FOREIGN_ENTRIES = """
def foreign_entries(top):
    import os, sys
    # the working directory, HOME, and where the interpreter and its modules live (a checkout under
    # /tmp is bound back in so the run can still import and exec its environment)
    own = [os.getcwd(), os.environ["HOME"], sys.prefix, sys.base_prefix, sys.exec_prefix]
    own += [p for p in sys.path if p and os.path.isdir(p)]
    own = [os.path.realpath(p) for p in own]
    found = []
    def leads_to_own(path):
        return any(p == path or p.startswith(path + "/") for p in own)

    def inside_own(path):
        return any(path.startswith(p + "/") for p in own)

    for root, dirs, files in os.walk(top):
        for name in dirs + files:
            path = os.path.join(root, name)
            if not leads_to_own(path) and not inside_own(path):
                found.append(path)
        # descend only along the way to an own path, never into one (its contents are the run's)
        dirs[:] = [d for d in dirs if leads_to_own(os.path.join(root, d)) and os.path.join(root, d) not in own]
    return found
"""


def test_env_01_user_b_sees_nothing_of_user_a_on_the_same_warm_sandbox(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    # Given user A's run on a warm sandbox, writing /tmp/handoff.txt and changing os.environ
    first = run(sandbox, ENV_01_A, fresh_scope(tmp_path, "user-a"))
    # When user B runs next on the same sandbox (the same zygote: a warm reuse), and then looks
    # through all of its /tmp and /dev/shm
    scope_b = fresh_scope(tmp_path, "user-b")
    second = run(sandbox, ENV_01_B, scope_b)
    walk = run(
        sandbox, FOREIGN_ENTRIES + "print(foreign_entries('/tmp'), foreign_entries('/dev/shm'))", scope_b
    )

    # Then B finds no handoff file and none of A's environment, and nothing foreign anywhere there
    assert_status(first, "ok")
    assert first.isolation.level == "namespaces"
    listing, rest = second.stdout.split("\n", 1)
    assert_status(second, "ok")
    assert "handoff" not in listing
    assert rest == "False None\n"
    assert walk.stdout == "[] []\n", walk.error


# (name, code user A runs, code user B runs -- "{left}" is A's last stdout line --, what B prints)
LEAKAGE_VECTORS = [
    (
        "environ",
        "import os\nos.environ['LAST_CUSTOMER'] = 'user-A'",
        "import os\nprint(os.environ.get('LAST_CUSTOMER'))",
        "None",
    ),
    (
        "putenv-seen-by-subprocesses",
        "import os\nos.putenv('LAST_CUSTOMER', 'user-A')",
        "import subprocess, sys\nprint(subprocess.run([sys.executable, '-c', "
        "'import os; print(os.environ.get(\"LAST_CUSTOMER\"))'], capture_output=True, text=True).stdout.strip())",
        "None",
    ),
    (
        "tmpdir",
        "import os, tempfile\np = os.path.join(tempfile.gettempdir(), 'handoff.txt')\n"
        "open(p, 'w').write('acct=ACME-123')\nprint(p)",
        FOREIGN_ENTRIES
        + "import os, tempfile\nprint(os.path.exists({left}), foreign_entries(tempfile.gettempdir()))",
        "False []",
    ),
    (
        "home",
        "import os\np = os.path.expanduser('~/.handoff')\nopen(p, 'w').write('acct=ACME-123')\nprint(p)",
        "import os\nprint(os.path.exists({left}), os.path.exists(os.path.expanduser('~/.handoff')))",
        "False False",
    ),
    (
        "module-state",
        "import json\njson.LAST_CUSTOMER = 'user-A'",
        "import json\nprint(getattr(json, 'LAST_CUSTOMER', None))",
        "None",
    ),
    (
        "builtins",
        "import builtins\nbuiltins.LAST_CUSTOMER = 'user-A'",
        "print('LAST_CUSTOMER' in dir(__builtins__) or 'LAST_CUSTOMER' in globals())",
        "False",
    ),
    (
        "sys-modules",
        "import sys, types\nsys.modules['handoff'] = types.ModuleType('handoff')",
        "import sys\nprint('handoff' in sys.modules)",
        "False",
    ),
    (
        "umask",
        "import os\nos.umask(0)",
        "import os\nprint(oct(os.umask(0o022)))",
        "0o22",
    ),
    (
        "rlimit",
        "import resource\nresource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))",
        "import resource\nprint(resource.getrlimit(resource.RLIMIT_NOFILE))",
        "(1024, 1024)",
    ),
    (
        "signal-handler",
        "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)",
        "import signal\nprint(signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)",
        "True",
    ),
]
NAMESPACE_ONLY_VECTORS = [
    (
        "literal-tmp",
        "open('/tmp/handoff.txt', 'w').write('acct=ACME-123')\nprint('/tmp/handoff.txt')",
        FOREIGN_ENTRIES + "import os\nprint(os.path.exists({left}), foreign_entries('/tmp'))",
        "False []",
    ),
    (
        "dev-shm",
        "open('/dev/shm/handoff', 'w').write('acct=ACME-123')\nprint('/dev/shm/handoff')",
        FOREIGN_ENTRIES + "import os\nprint(os.path.exists({left}), foreign_entries('/dev/shm'))",
        "False []",
    ),
]


def _leak_params() -> list[Any]:
    params = [
        pytest.param(level, *vector, id=f"{level}-{vector[0]}")
        for level in ("namespaces", "process")
        for vector in LEAKAGE_VECTORS
    ]
    params += [
        pytest.param("namespaces", *vector, id=f"namespaces-{vector[0]}") for vector in NAMESPACE_ONLY_VECTORS
    ]
    return params


@pytest.mark.parametrize(("level", "name", "leave", "probe", "expected"), _leak_params())
def test_env_01_no_kind_of_state_carries_over_to_the_next_run(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    level: str,
    name: str,
    leave: str,
    probe: str,
    expected: str,
) -> None:
    # Given user A's run leaving state behind in one way
    box: Sandbox = request.getfixturevalue("sandbox" if level == "namespaces" else "process_sandbox")
    first = run(box, leave, fresh_scope(tmp_path, "user-a"))
    assert_status(first, "ok")
    left = repr(first.stdout.strip().splitlines()[-1]) if first.stdout.strip() else "''"
    # When user B runs next on the same warm sandbox
    scope_b = fresh_scope(tmp_path, "user-b")
    second = run(box, probe.replace("{left}", left), scope_b)

    # Then B finds nothing of it
    assert second.isolation.level == level
    assert (second.status, second.stdout) == ("ok", expected + "\n"), second.error


@pytest.mark.parametrize("variable", ["HOME", "TMPDIR"])
def test_env_01_each_run_gets_a_fresh_writable_home_and_tmpdir(
    any_sandbox: Sandbox, scope: Path, variable: str
) -> None:
    # Given the private scratch directories a run is promised (DESIGN §5: HOME and TMPDIR in the
    # run's scratch area, wiped afterwards)
    code = FOREIGN_ENTRIES + textwrap.dedent(
        f"""
        import os
        path = os.environ[{variable!r}]
        print(os.path.isdir(path), os.access(path, os.W_OK), foreign_entries(path) if os.path.isdir(path) else None)
        open(os.path.join(path, "probe.txt"), "w").write("x")
        """
    )
    # When a run looks at it and writes a file there
    result = run(any_sandbox, code, scope)

    # Then it exists, is writable and empty (see FOREIGN_ENTRIES), and the write succeeds
    assert (result.status, result.stdout) == ("ok", "True True []\n"), result.error


# -- a supervisor in its own process ---------------------------------------------------------------

SUPERVISOR_SCRIPT = """
import json, os, sys
from pathlib import Path
from alphaagent.models.run import RunLimits
from alphaagent.sandbox.config import SandboxConfig
from alphaagent.sandbox.supervisor import Sandbox

spec = json.loads(sys.stdin.read())
if spec["config"].get("exclusive") and (os.getpid() != 1 or os.readlink("/proc/self") != "1"):
    # Exclusive mode kills every other process of its uid: only ever inside a private pid namespace.
    sys.exit("refusing to run exclusive mode outside a private pid namespace")
results = []
with Sandbox(SandboxConfig(**spec["config"])) as sandbox:
    for code, cwd in spec["runs"]:
        result = sandbox.run(code, cwd=Path(cwd), limits=RunLimits(timeout_s=spec["timeout_s"]))
        results.append(result.model_dump(mode="json"))
print(json.dumps({"supervisor_pid": os.getpid(), "results": results}))
"""
# A throwaway user + pid namespace with its own /proc: a non-root uid that owns nothing else, as the
# env Lambda's sbx_user does, so exclusive mode's sweep of the uid cannot reach any host process.
PRIVATE_UID_AND_PIDS = [
    "unshare",
    "--user",
    "--map-user=1000",
    "--map-group=1000",
    "--pid",
    "--fork",
    "--mount-proc",
]


def run_supervisor_subprocess(
    config: dict[str, Any],
    runs: list[tuple[str, Path]],
    *,
    env: dict[str, str] | None = None,
    prefix: list[str] | None = None,
    timeout_s: float = 10,
) -> dict[str, Any]:
    """Run a Sandbox in a separate supervisor process (with its own exec-time environment, maybe
    behind ``prefix``) and return ``{"supervisor_pid", "results"}``."""
    spec = {"config": config, "runs": [(textwrap.dedent(c), str(p)) for c, p in runs], "timeout_s": timeout_s}
    base_env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    completed = subprocess.run(
        [*(prefix or []), sys.executable, "-c", SUPERVISOR_SCRIPT],
        input=json.dumps(spec),  # not argv: the code (tags, fake secrets) stays off the command line
        env={**base_env, "HOME": str(runs[0][1]), **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout)


@pytest.fixture
def private_uid_and_pids() -> list[str]:
    if shutil.which("unshare") is None:
        pytest.skip("util-linux unshare is not installed")
    probe = subprocess.run([*PRIVATE_UID_AND_PIDS, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"user and pid namespaces unavailable: {probe.stderr.strip()}")
    return PRIVATE_UID_AND_PIDS


def test_env_01_and_proc_01_exclusive_mode_wipes_the_shared_tmp_and_kills_leftovers(
    private_uid_and_pids: list[str], tmp_path: Path
) -> None:
    # Given the env Lambda's configuration: process isolation, exclusive, the shared /tmp wiped after
    # each run -- a temporary directory stands in for /tmp, so the case's "/tmp" is replaced by it
    shared = tmp_path / "lambda-tmp"
    shared.mkdir()
    scope_a, scope_b = fresh_scope(tmp_path, "user-a"), fresh_scope(tmp_path, "user-b")
    tag = f"beacon{secrets.token_hex(4)}"
    user_a = (
        ENV_01_A.replace("/tmp", str(shared))
        + "\n"
        + daemon_code(DAEMON_LAUNCHES["popen-new-session"], str(shared / "beacon"), tag)
    )
    user_b = ENV_01_B.replace("/tmp", str(shared)) + textwrap.dedent(
        f"""
        print(os.path.exists({str(shared / "beacon")!r}))
        alive = 0
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                alive += {tag!r}.encode() in open(f"/proc/{{pid}}/cmdline", "rb").read()
            except OSError:
                pass
        print(alive)
        """
    )
    config = {
        "isolation": "process",
        "exclusive": True,
        "wipe_paths": [str(shared)],
        "preload": [],
        "pool_size": 1,
        "use_cgroup": False,
        "scratch_dir": str(tmp_path),
    }
    # When user A runs (leaving a file, an env change and a daemon), then user B on the same sandbox
    out = run_supervisor_subprocess(
        config, [(user_a, scope_a), (user_b, scope_b)], prefix=private_uid_and_pids
    )
    first, second = (RunResult.model_validate(r) for r in out["results"])

    # Then A ran with its daemon alive at the end, and B sees an empty shared /tmp, no env change,
    # no beacon and no process of A's
    assert (first.status, first.stdout, first.isolation.level) == ("ok", "spawned True\n", "process")
    assert (second.status, second.stdout) == ("ok", "[]\nFalse None\nFalse\n0\n"), second.error
    assert live_processes_with(tag) == []


# == ART-01: charts ================================================================================

ART_01 = 'import matplotlib\nmatplotlib.use("TkAgg")\nimport matplotlib.pyplot as plt\nplt.plot([3, 1, 2]); plt.show()'


@pytest.mark.parametrize(
    "backend", ["TkAgg", "TkCairo", "QtAgg", "Qt5Agg", "GTK4Agg", "GTK3Cairo", "WXAgg", "MacOSX"]
)
def test_art_01_asking_for_a_gui_backend_fails_fast_with_a_traceback(
    sandbox: Sandbox, scope: Path, backend: str
) -> None:
    # Given the case's code, asking for an interactive backend (TkAgg, and the other GUI toolkits)
    code = ART_01.replace("TkAgg", backend)
    # When it runs with a 10 s limit
    result = run(sandbox, code, scope, timeout_s=10)

    # Then it returns quickly with the import error's traceback; it never hangs on a display
    assert_status(result, "error")
    assert result.error is not None and result.error.name in ("ImportError", "ModuleNotFoundError")
    assert result.error.traceback.rstrip().splitlines()[-1].startswith(result.error.name)
    assert 'matplotlib.use("' in result.error.traceback
    assert result.duration_ms < 5000


@pytest.fixture(params=["namespaces", "process"])
def builtin_at_any_level(request: pytest.FixtureRequest) -> Sandbox:
    """The builtin preload at both isolation levels, for charts (matplotlib and pandas imported in
    the run would cost it seconds on a loaded machine)."""
    return request.getfixturevalue("sandbox" if request.param == "namespaces" else "builtin_process_sandbox")


def test_art_01_code_that_picks_no_backend_renders_headless_and_show_is_a_no_op(
    builtin_at_any_level: Sandbox, scope: Path
) -> None:
    # Given plotting code that picks no backend, shows (blocking, too), pauses and saves into charts/
    code = """
        import os
        import matplotlib
        import matplotlib.pyplot as plt
        import pandas as pd
        print(os.environ["MPLBACKEND"], matplotlib.get_backend().lower())
        plt.plot([3, 1, 2])
        plt.show()
        plt.show(block=True)
        plt.ion(); plt.pause(0.1)
        plt.savefig("charts/trend.png")
        pd.DataFrame({"x": [1, 2, 3]}).plot()
        plt.savefig("charts/frame.png")
        print("saved")
    """
    # When it runs
    result = run(builtin_at_any_level, code, scope, timeout_s=10)

    # Then it just works: Agg is the backend, show() returns, both charts exist and are reported
    assert (result.status, result.stdout) == ("ok", "Agg agg\nsaved\n"), result.error
    assert result.files.created == ["charts/frame.png", "charts/trend.png"]
    for chart in result.files.created:
        assert (scope / chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# == ISO-03: credentials of the platform ===========================================================

AWS_NAMES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def fake_platform_env() -> dict[str, str]:
    """Lambda-shaped variables with unique fake values (the test searches for the values)."""
    token = secrets.token_hex(8).upper()
    return {
        "AWS_ACCESS_KEY_ID": f"ASIA{token}",
        "AWS_SECRET_ACCESS_KEY": f"fakeSecret{secrets.token_hex(16)}",
        "AWS_SESSION_TOKEN": f"FakeSessionToken{secrets.token_hex(24)}",
        "AWS_LAMBDA_RUNTIME_API": f"127.0.0.1:9001-{token}",
        "_HANDLER": f"handler_{token}.lambda_handler",
        "AWS_LAMBDA_FUNCTION_NAME": f"alphaagent-env-{token}",
        "_X_AMZN_TRACE_ID": f"Root=1-{token}",
    }


ISO_03 = """
import os, json
interesting = [k for k in os.environ if k.startswith(("AWS_", "_X_AMZN", "_HANDLER", "LAMBDA_"))]
print(json.dumps({k: os.environ[k][:4] + "..." for k in interesting}, indent=1))
try:
    import boto3
    print(boto3.client("sts").get_caller_identity()["Arn"])
    print(boto3.client("s3").list_objects_v2(Bucket="alphaagent-workspaces-ACCOUNT-REGION", Prefix="conversations/")["KeyCount"])
except Exception as e:
    print("denied:", type(e).__name__)
"""


def environ_probe(values: list[str]) -> str:
    """Code that looks for the values in its env and in every /proc/<pid>/environ it can read, and
    prints only names, pids and booleans (never a value)."""
    return f"""
        import json, os
        VALUES = {values!r}
        NEEDLES = [v.encode() for v in VALUES]
        report = {{
            "names": sorted(k for k in os.environ if k.startswith(("AWS_", "_X_AMZN", "_HANDLER", "LAMBDA_"))),
            "values_in_env": sorted(k for k, v in os.environ.items() if any(x in v for x in VALUES)),
            "ppid": os.getppid(), "listed": [], "readable": [], "leaks": [], "self_readable": False,
        }}
        for name in sorted(set(filter(str.isdigit, os.listdir("/proc"))) | {{str(os.getppid()), "1"}}):
            report["listed"].append(int(name))
            try:
                with open(f"/proc/{{name}}/environ", "rb") as fh:
                    data = fh.read()
            except OSError:
                continue
            report["readable"].append(int(name))
            if any(n in data for n in NEEDLES):
                report["leaks"].append(int(name))
        report["self_readable"] = b"PATH=" in open("/proc/self/environ", "rb").read()
        print(json.dumps(report))
    """


@pytest.fixture(scope="class", params=["auto", "process"], ids=["namespaces", "process"])
def secret_sandbox(request: pytest.FixtureRequest) -> Iterator[tuple[Sandbox, dict[str, str]]]:
    """A sandbox started after fake platform credentials were put into this (the supervisor's) env;
    class-scoped so that the variables leave os.environ once the class is done."""
    fake = fake_platform_env()
    with pytest.MonkeyPatch.context() as mp:
        for name, value in fake.items():
            mp.setenv(name, value)
        with started(SandboxConfig(isolation=request.param, preload=())) as box:
            yield box, fake


class TestIso03PlatformCredentials:
    def test_the_case_code_finds_no_platform_variable_and_is_denied(
        self, secret_sandbox: tuple[Sandbox, dict[str, str]], scope: Path
    ) -> None:
        # Given fake AWS credentials and Lambda runtime variables in the supervisor's environment
        box, _fake = secret_sandbox
        # When the case's code runs (with the network on, boto3 would try the host's instance
        # metadata service, so at the process level only the environment half of the case runs)
        code = ISO_03 if box.isolation == "namespaces" else ISO_03.split("try:")[0]
        result = run(box, code, scope, timeout_s=20)

        # Then it sees no platform variable, and (with the network off) boto3 is denied: the case's
        # single try block prints 'denied' once, at the first call
        assert_status(result, "ok")
        assert result.stdout.startswith("{}\n")
        if box.isolation == "namespaces":
            assert result.network == "off"
            assert "denied: " in result.stdout and "arn:" not in result.stdout

    def test_no_credential_is_reachable_in_the_env_or_any_proc_environ(
        self, secret_sandbox: tuple[Sandbox, dict[str, str]], scope: Path
    ) -> None:
        # Given fake platform variables in the supervisor's environment
        box, fake = secret_sandbox
        # When the child looks for their values in its env and every /proc/<pid>/environ it can list
        result = run(box, environ_probe(list(fake.values())), scope)
        report = json.loads(result.stdout)

        # Then it finds none (the probe itself works: it can read its own environ)
        assert_status(result, "ok")
        assert report["self_readable"]
        assert (report["names"], report["values_in_env"], report["leaks"]) == ([], [], [])
        assert 1 in report["listed"] and report["ppid"] in report["listed"]

    def test_the_container_credentials_and_metadata_endpoints_are_unreachable(
        self, secret_sandbox: tuple[Sandbox, dict[str, str]], scope: Path
    ) -> None:
        # Given a run without network access
        box, _fake = secret_sandbox
        if box.isolation != "namespaces":
            pytest.skip("the process level cannot take the network away (the result says network=on)")
        code = """
            import socket
            for host in ("169.254.170.2", "169.254.169.254"):
                try:
                    socket.create_connection((host, 80), timeout=2).close()
                    print(host, "reachable")
                except OSError as exc:
                    print(host, "unreachable", type(exc).__name__)
        """
        # When it tries the ECS/Lambda container credentials endpoint and the instance metadata service
        result = run(box, code, scope)

        # Then neither can be reached
        assert result.network == "off"
        assert result.stdout.count("unreachable") == 2, (result.stdout, result.error)

    @pytest.mark.parametrize("name", AWS_NAMES)
    @pytest.mark.parametrize(
        "template",
        [
            pytest.param("print('key:', {secret!r})", id="stdout"),
            pytest.param("import sys\nsys.stderr.write('key: ' + {secret!r} + '\\n')", id="stderr"),
            pytest.param(
                "import sys, time\ns = {secret!r}\nprint(s[:5], end='', flush=True)\ntime.sleep(0.05)\n"
                "print(s[5:], flush=True)",
                id="split-across-writes",
            ),
            pytest.param("print('x' * 40_000)\nprint({secret!r})\nprint('y' * 40_000)", id="spilled"),
        ],
    )
    def test_a_printed_credential_comes_back_redacted(
        self,
        secret_sandbox: tuple[Sandbox, dict[str, str]],
        scope: Path,
        name: str,
        template: str,
    ) -> None:
        # Given code that has the credential's value (passed in literally) and prints it
        box, fake = secret_sandbox
        secret = fake[name]
        # When it runs
        result = run(box, template.format(secret=secret), scope)

        # Then the value comes back as [REDACTED] everywhere: the result and the spill files
        assert_status(result, "ok")
        assert secret not in result.model_dump_json()
        assert "[REDACTED]" in result.stdout + result.stderr
        for spill in (result.stdout_path, result.stderr_path):
            if spill is not None:
                assert secret.encode() not in (scope / spill).read_bytes()

    @pytest.mark.parametrize("name", AWS_NAMES)
    def test_a_credential_in_an_exception_comes_back_redacted(
        self, secret_sandbox: tuple[Sandbox, dict[str, str]], scope: Path, name: str
    ) -> None:
        # Given code that fails with the credential in its exception message
        box, fake = secret_sandbox
        secret = fake[name]
        code = f"raise RuntimeError('could not sign with ' + {secret!r})"
        # When it runs
        result = run(box, code, scope)

        # Then the error the coder reads (value and traceback) carries [REDACTED], not the value
        assert_status(result, "error")
        assert result.error is not None
        assert secret not in result.model_dump_json()
        assert "[REDACTED]" in result.error.value


@pytest.mark.parametrize("isolation", ["auto", "process"])
def test_iso_03_credentials_in_the_supervisors_exec_environment_are_unreadable(
    tmp_path: Path, isolation: str
) -> None:
    # Given a supervisor process started (as on Lambda) with credentials in its exec-time environment,
    # which /proc/<pid>/environ shows
    fake = fake_platform_env()
    scope = fresh_scope(tmp_path, "scope")
    # When its child looks through every /proc/<pid>/environ it can list
    out = run_supervisor_subprocess(
        {"isolation": isolation, "preload": []}, [(environ_probe(list(fake.values())), scope)], env=fake
    )
    result = RunResult.model_validate(out["results"][0])
    report = json.loads(result.stdout)

    # Then no value is found anywhere, and at the process level, where the supervisor is visible,
    # its environ cannot be read
    assert_status(result, "ok")
    assert (report["names"], report["values_in_env"], report["leaks"]) == ([], [], [])
    if result.isolation.level == "process":
        assert out["supervisor_pid"] in report["listed"]
        assert out["supervisor_pid"] not in report["readable"]
    else:
        assert out["supervisor_pid"] not in report["listed"]


# == PATH-01: symlinks in the working tree =========================================================

PATH_01 = (
    "import os\n"
    'os.makedirs("reports", exist_ok=True)\n'
    'os.symlink("/proc/self/environ", "reports/env.txt")\n'
    'os.symlink("/var/task", "work/runner_src")\n'
    'os.symlink("/etc/passwd", "datasets/users.csv")\n'
    'print("linked")'
)
SYMLINK_REASONS = ("symlink", "symlink to directory (not followed)")


def test_path_01_planted_symlinks_are_listed_as_skipped_never_as_files(
    any_sandbox: Sandbox, scope: Path
) -> None:
    # Given the case's code planting links to the environ, the runner's source and /etc/passwd
    # When it runs
    result = run(any_sandbox, PATH_01, scope)

    # Then the file-change report lists no file, and each link as skipped, without its target
    assert (result.status, result.stdout) == ("ok", "linked\n")
    assert result.files_changed == [] and result.files.created == []
    skipped = {s.path: s.reason for s in result.files.skipped}
    assert set(skipped) == {"reports/env.txt", "work/runner_src", "datasets/users.csv"}
    assert all(reason in SYMLINK_REASONS for reason in skipped.values())
    assert not any(word in result.files.model_dump_json() for word in ("passwd", "environ", "/var/task"))


@pytest.mark.parametrize("level", ["namespaces", "process"])
def test_path_01_symlinked_directories_are_never_walked_and_special_files_never_opened(
    request: pytest.FixtureRequest, tmp_path: Path, level: str
) -> None:
    # Given a directory outside the scope holding a file, and code planting every kind of link to it
    box: Sandbox = request.getfixturevalue("sandbox" if level == "namespaces" else "process_sandbox")
    scope = fresh_scope(tmp_path, "scope")
    outside = tmp_path / "outside"
    (outside / "nested").mkdir(parents=True)
    (outside / "secret.txt").write_text("not yours")
    (outside / "nested" / "deep.txt").write_text("not yours either")
    code = f"""
        import os, socket
        open("datasets/real.csv", "w").write("a,b\\n1,2\\n")
        os.symlink({str(outside)!r}, "work/outside_dir")
        os.symlink({str(outside / "secret.txt")!r}, "reports/secret.md")
        os.symlink("../datasets", "reports/data_dir")
        os.symlink("real.csv", "datasets/alias.csv")
        os.symlink("loop_b", "work/loop_a")
        os.symlink("loop_a", "work/loop_b")
        os.symlink("/nonexistent/target", "work/dangling")
        os.mkfifo("datasets/pipe.csv")
        os.mknod("work/listener.sock", 0o600 | 0o140000)  # S_IFSOCK: no AF_UNIX socket without network
        print("planted")
    """
    # When it runs
    result = run(box, code, scope)

    # Then only the regular file is reported; the rest is skipped with its kind, nothing beneath a
    # linked directory is listed, and nothing outside the scope was touched
    assert (result.status, result.stdout) == ("ok", "planted\n"), result.error
    assert result.files.created == ["datasets/real.csv"] and result.files_changed == ["datasets/real.csv"]
    skipped = {s.path: s.reason for s in result.files.skipped}
    assert skipped == {
        "work/outside_dir": skipped["work/outside_dir"],
        "reports/secret.md": "symlink",
        "reports/data_dir": "symlink to directory (not followed)",
        "datasets/alias.csv": "symlink",
        "work/loop_a": "symlink",
        "work/loop_b": "symlink",
        "work/dangling": "symlink",
        "datasets/pipe.csv": "fifo",
        "work/listener.sock": "socket",
    }
    assert skipped["work/outside_dir"] in SYMLINK_REASONS
    assert sorted(p.relative_to(outside).as_posix() for p in outside.rglob("*")) == [
        "nested",
        "nested/deep.txt",
        "secret.txt",
    ]


@pytest.mark.parametrize("when", ["planted-by-an-earlier-run", "created-during-the-run"])
def test_path_01_the_output_spill_never_writes_through_a_symlinked_work_runs(
    light_sandbox: Sandbox, tmp_path: Path, when: str
) -> None:
    # Given work/runs (where the supervisor spills full output) replaced by a link to outside the scope
    scope = fresh_scope(tmp_path, "scope")
    outside = tmp_path / "outside"
    outside.mkdir()
    plant = f"import os\nos.symlink({str(outside)!r}, 'work/runs')\n"
    if when == "planted-by-an-earlier-run":
        assert_status(run(light_sandbox, plant, scope), "ok")
        code = "print('x' * 100_000)"
    else:
        code = plant + "print('x' * 100_000)"
    # When a run prints more than the stored-history cap, so the supervisor spills it
    result = run(light_sandbox, code, scope)

    # Then the run still succeeds, and nothing was written outside the scope
    assert_status(result, "ok")
    assert result.stdout_bytes == 100001
    assert list(outside.iterdir()) == []
    assert result.stdout_path is None or not (scope / result.stdout_path).is_symlink()
    # And the link itself never shows up as a file
    assert "work/runs" not in result.files_changed


# == ENV-01 in exclusive mode: the sandbox's own scratch root ======================================

# What a run sees of the scratch root that holds every run's TMPDIR/HOME ($TMPDIR/../..), leaving out
# its own run directory: each path, with a digest of each regular file's content.
SCRATCH_LISTING = """
import hashlib, json, os
tmp = os.environ["TMPDIR"]                    # <scratch root>/<run id>/tmp
own, root = os.path.dirname(tmp), os.path.dirname(os.path.dirname(tmp))

def listing():
    found = []
    for current, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if os.path.join(current, d) != own]
        for name in dirs + files:
            path = os.path.join(current, name)
            rel = os.path.relpath(path, root)
            if os.path.isfile(path) and not os.path.islink(path) and name != "zygote.log":
                rel += " " + hashlib.sha256(open(path, "rb").read()).hexdigest()[:12]
            found.append(rel)
    return sorted(found)
"""
SCRATCH_LEAVE = (
    SCRATCH_LISTING
    + """
print(json.dumps({"before": listing(), "root": root, "zygote": os.getppid()}))
written = []
def leave(path, text="acct=ACME-123"):
    with open(path, "w") as fh:
        fh.write(text)
    written.append(os.path.relpath(path, root))
leave(os.path.join(tmp, "handoff.txt"))
leave(os.path.join(tmp, "..", "handoff.txt"))
leave(os.path.join(root, "handoff.txt"))
os.makedirs(os.path.join(root, ".cache", "deep"))
leave(os.path.join(root, ".cache", "deep", "handoff.txt"))
leave(os.path.join(root, "mplconfig", "matplotlibrc"), "backend: TkAgg\\n")
for name in os.listdir(os.path.join(root, "mplconfig")):
    if name.startswith("fontlist"):
        leave(os.path.join(root, "mplconfig", name), '{"acct": "ACME-123"}')
os.mkdir(os.path.join(root, "locked"))
leave(os.path.join(root, "locked", "handoff.txt"))
os.chmod(os.path.join(root, "locked"), 0o500)   # its owner cannot delete what is inside any more
os.symlink("/", os.path.join(root, "acct=ACME-123"))   # the name is the message
with open(os.path.join(root, "zygote.log"), "a") as fh:
    fh.write("acct=ACME-123\\n")
os.chmod(tmp, 0o500)
os.chmod(own, 0o500)                          # and the run's own directory, likewise
print(json.dumps(written))
"""
)
SCRATCH_PROBE = (
    SCRATCH_LISTING
    + """
print(json.dumps({"after": listing(), "root": root, "zygote": os.getppid()}))
print("acct" in open(os.path.join(root, "zygote.log")).read())
"""
)
SCRATCH_AGAIN = """
import os
open(os.path.join(os.environ["TMPDIR"], "scratch.txt"), "w").write("x")
print(os.getppid())
"""


def scratch_config(shared: Path, **overrides: Any) -> dict[str, Any]:
    """The env Lambda's configuration, with a temporary directory standing in for /tmp (which holds
    the scratch root there too), and matplotlib preloaded so that the zygote leaves its cache."""
    return {
        "isolation": "process",
        "exclusive": True,
        "wipe_paths": [str(shared)],
        "scratch_dir": str(shared),
        "preload": ["matplotlib.pyplot"],
        "warmup": "",
        "pool_size": 2,
        "use_cgroup": False,
        **overrides,
    }


def test_env_01_exclusive_mode_resets_the_scratch_root_between_runs(
    private_uid_and_pids: list[str], tmp_path: Path
) -> None:
    # Given the env Lambda's exclusive mode, and user A's run leaving files in its $TMPDIR, in
    # $TMPDIR/.. and $TMPDIR/../.. (the scratch root: a new file, a hidden tree, matplotlib's config
    # and font cache overwritten, a directory its owner can no longer empty, a symlink whose name is
    # the message, a line in the zygote's log) and taking write access to its own directories away
    shared = tmp_path / "lambda-tmp"
    shared.mkdir()
    scopes = [fresh_scope(tmp_path, f"user-{n}") for n in "abcd"]
    # When user B runs next on the same sandbox, then two more runs
    out = run_supervisor_subprocess(
        scratch_config(shared),
        list(zip([SCRATCH_LEAVE, SCRATCH_PROBE, SCRATCH_AGAIN, SCRATCH_AGAIN], scopes, strict=True)),
        prefix=private_uid_and_pids,
    )
    first, second, third, fourth = (RunResult.model_validate(r) for r in out["results"])

    # Then A left all of it, and B finds the scratch root exactly as A found it at its start (the
    # zygote's log, matplotlib's config dir and cache as the zygote built them), nothing of A's
    assert_status(first, "ok")
    a_state, written = (json.loads(line) for line in first.stdout.splitlines())
    assert len(written) == 7 and any(w.startswith("mplconfig/fontlist") for w in written)
    assert_status(second, "ok")
    b_state, log_has_it = second.stdout.splitlines()
    b = json.loads(b_state)
    assert b["after"] == a_state["before"]
    assert "zygote.log" in b["after"] and any(e.startswith("mplconfig/fontlist") for e in b["after"])
    assert log_has_it == "False"
    # And the same zygote served every run (it and its spares survived the reset): runs keep working
    assert (b["root"], b["zygote"]) == (a_state["root"], a_state["zygote"])
    for later in (third, fourth):
        assert (later.status, later.stdout) == ("ok", f"{a_state['zygote']}\n"), later.error


def test_env_01_exclusive_mode_replaces_the_zygote_when_its_log_gets_a_second_name(
    private_uid_and_pids: list[str], tmp_path: Path
) -> None:
    # Given user A's run giving the zygote's log (its stderr, which it keeps open) a second name in
    # A's own scope, where emptying the scratch root cannot reach it
    shared = tmp_path / "lambda-tmp"
    shared.mkdir()
    scopes = [fresh_scope(tmp_path, f"user-{n}") for n in "abc"]
    leave = SCRATCH_LISTING + (
        'os.link(os.path.join(root, "zygote.log"), "work/log")\n'
        'print(json.dumps({"root": root, "zygote": os.getppid()}))'
    )
    probe = (
        SCRATCH_LISTING
        + 'print(json.dumps({"root": root, "zygote": os.getppid(), "siblings": os.listdir(os.path.dirname(root))}))'
    )
    # When user B runs next, then one more run
    out = run_supervisor_subprocess(
        scratch_config(shared, preload=[]),
        list(zip([leave, probe, SCRATCH_AGAIN], scopes, strict=True)),
        prefix=private_uid_and_pids,
    )
    first, second, third = (RunResult.model_validate(r) for r in out["results"])

    # Then B ran on a new zygote in a new scratch root, the old one is gone, and runs keep working
    assert_status(first, "ok", (first.error, second.error))
    assert_status(second, "ok", (first.error, second.error))
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert b["zygote"] != a["zygote"] and b["root"] != a["root"]
    assert b["siblings"] == [Path(b["root"]).name]
    assert (third.status, third.stdout) == ("ok", f"{b['zygote']}\n"), third.error
