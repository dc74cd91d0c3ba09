"""Behaviour of the per-stream output capture (DESIGN §4.3; cases OUT-01/04/06, NOISE-01, ENC-01/04)."""

from __future__ import annotations

import errno
import io
import json
import random
import re
import time
import tracemalloc
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import BinaryIO

import pytest

from alphaagent.sandbox.capture import (
    MIN_CAP_BYTES,
    RETURNED_OUTPUT_CAP_BYTES,
    SPILL_CAP_BYTES,
    STORED_HISTORY_CAP_BYTES,
    CapturedStream,
    StreamCapture,
    truncate_text,
)

READ_SIZE = 65536  # what the supervisor passes to os.read
MARKER_RE = re.compile(r"\n\[\.\.\. truncated: (\d+) bytes omitted, kept (\d+) of (\d+) bytes \.\.\.\]\n")
C0_EXCEPT_TAB_NEWLINE = re.compile(r"[\x00-\x08\x0b-\x1f]")


def chunks(data: bytes, size: int) -> Iterable[bytes]:
    return (data[start : start + size] for start in range(0, len(data), size))


def capture(
    data: bytes,
    cap_bytes: int = RETURNED_OUTPUT_CAP_BYTES,
    size: int = READ_SIZE,
    redact: Sequence[str] = (),
) -> CapturedStream:
    stream = StreamCapture(cap_bytes, redact=redact)
    for chunk in chunks(data, size):
        stream.feed(chunk)
    return stream.finish()


def split_truncated(text: str) -> tuple[str, int, int, int, str]:
    """(head, omitted, kept, total, tail) of a truncated text; asserts there is exactly one marker."""
    markers = list(MARKER_RE.finditer(text))
    assert len(markers) == 1, text[:200]
    marker = markers[0]
    omitted, kept, total = (int(group) for group in marker.groups())
    return text[: marker.start()], omitted, kept, total, text[marker.end() :]


def assert_head_tail_of(text: str, original: str, cap_bytes: int) -> None:
    """The truncation contract: byte bound, consistent counts, head a prefix and tail a suffix."""
    assert len(text.encode("utf-8")) <= cap_bytes
    head, omitted, kept, total, tail = split_truncated(text)
    assert total == len(original.encode("utf-8"))
    assert kept == len(head.encode("utf-8")) + len(tail.encode("utf-8"))
    assert omitted == total - kept
    assert original.startswith(head)
    assert original.endswith(tail)


class RecordingOpener:
    """A spill opener that records how often it is called and keeps what was written."""

    def __init__(self) -> None:
        self.calls = 0
        self.files: list[KeptBytesIO] = []

    def __call__(self) -> BinaryIO:
        self.calls += 1
        self.files.append(KeptBytesIO())
        return self.files[-1]

    @property
    def written(self) -> bytes:
        return b"".join(file.kept for file in self.files)


class KeptBytesIO(io.BytesIO):
    """BytesIO whose content survives close(), so the test can read the spill afterwards."""

    kept = b""

    def close(self) -> None:
        self.kept = self.getvalue()
        super().close()


# -- the truncation marker and the byte bound ----------------------------------------------------


def test_output_within_the_cap_is_returned_whole() -> None:
    # Given a short output with a tab and a final line without newline
    data = b"col\tvalue\nlast line"

    # When it is captured
    result = capture(data, cap_bytes=1024)

    # Then it comes back unchanged, with true counts and no flags
    assert result == CapturedStream(
        text="col\tvalue\nlast line",
        total_bytes=len(data),
        clean_bytes=len(data),
        truncated=False,
        replaced=False,
        spill_bytes=0,
        spill_truncated=False,
        spill_error=None,
    )


def test_truncation_keeps_head_and_tail_around_the_exact_marker() -> None:
    # Given 10,000 bytes of digits and a 1,000-byte cap
    data = b"0123456789" * 1000

    # When it is captured
    result = capture(data, cap_bytes=1000)

    # Then head + the exact marker + tail fit in the cap, the head getting about half
    marker = "\n[... truncated: 9069 bytes omitted, kept 931 of 10000 bytes ...]\n"
    assert result.text == data[:465].decode() + marker + data[-466:].decode()
    assert len(result.text.encode("utf-8")) == 997
    assert result.truncated
    assert (result.total_bytes, result.clean_bytes) == (10_000, 10_000)


def test_text_exactly_at_the_cap_is_not_truncated_and_one_byte_more_is() -> None:
    # Given outputs of exactly cap_bytes and cap_bytes + 1
    cap = 4096
    exact, over = b"y" * cap, b"y" * (cap + 1)

    # When each is captured
    at_cap, above_cap = capture(exact, cap), capture(over, cap)

    # Then only the longer one is truncated, and it still fits
    assert (at_cap.text, at_cap.truncated) == (exact.decode(), False)
    assert above_cap.truncated
    assert len(above_cap.text.encode("utf-8")) <= cap


def test_cap_below_the_minimum_is_rejected() -> None:
    # Given / When / Then: a cap that cannot hold the marker and some text is a configuration error
    with pytest.raises(ValueError, match="cap_bytes"):
        StreamCapture(MIN_CAP_BYTES - 1)
    StreamCapture(MIN_CAP_BYTES)


def test_default_caps_are_the_design_values() -> None:
    # Given / When / Then: DESIGN §4.3 defaults
    assert RETURNED_OUTPUT_CAP_BYTES == 1024 * 1024
    assert STORED_HISTORY_CAP_BYTES == 16 * 1024
    assert SPILL_CAP_BYTES == 64 * 1024 * 1024


def test_out_06_tail_with_end_of_report_survives_120000_rows() -> None:
    # Given the OUT-06 program's stdout: 120,000 rows then END-OF-REPORT (~2.4 MB)
    rows = "\n".join(f"id={i},value={i * i}" for i in range(120_000))
    output = rows + "\nEND-OF-REPORT\n"
    data = output.encode()

    # When it is captured with the 1 MiB returned-output cap
    result = capture(data)

    # Then the head and the tail survive around a marker that gives the original size
    assert result.truncated
    assert result.total_bytes == result.clean_bytes == len(data)
    assert result.text.startswith("id=0,value=0\nid=1,value=1\n")
    assert result.text.endswith("id=119999,value=14399760001\nEND-OF-REPORT\n")
    assert_head_tail_of(result.text, output, RETURNED_OUTPUT_CAP_BYTES)


def test_out_01_endless_rows_keep_the_latest_rows_and_count_everything() -> None:
    # Given 20 MB of OUT-01's endless "row n: still going"
    data = "".join(f"row {n}: still going\n" for n in range(900_000)).encode()

    # When it is captured
    result = capture(data)

    # Then the text is bounded and ends with the last row, and the counts are the true ones
    assert result.truncated
    assert result.total_bytes == len(data)
    assert len(result.text.encode("utf-8")) <= RETURNED_OUTPUT_CAP_BYTES
    assert result.text.endswith("row 899999: still going\n")


# -- carriage returns and progress bars ------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"10%\r50%\r100%\n", "100%\n"),
        (b"line one\r\nline two\r\n", "line one\nline two\n"),
        (b"abc\r\rdef\r\n", "def\n"),
        (b"keep\r\n\r\nnext\n", "keep\n\nnext\n"),
        (b"downloading 99%\r", "downloading 99%"),
        (b"long old status\rnew\n", "new\n"),
    ],
)
def test_carriage_return_redraws_collapse_to_the_final_line_state(data: bytes, expected: str) -> None:
    # Given output with \r redraws, split at every possible point
    for split in range(len(data) + 1):
        stream = StreamCapture(1024)
        stream.feed(data[:split])
        stream.feed(data[split:])

        # When it is finished
        result = stream.finish()

        # Then each line shows its final visible state and \r\n is a plain newline
        assert result.text == expected, split
        assert not result.replaced


def test_noise_01_progress_bar_flood_collapses_to_its_last_redraw() -> None:
    # Given NOISE-01's stderr with a redraw on every iteration (300,000 \r redraws, ~17 MB) then a
    # newline, and the same stream merged with stdout's "finished" (2>&1)
    total = 300_000
    bar = b"".join(f"\rprocessing {i}/{total} [{'#' * (i * 30 // total):<30}]".encode() for i in range(total))
    stderr = bar + b"\n"
    merged = stderr + b"finished\n"

    # When each is captured in 64 KiB reads
    stderr_result = capture(stderr)
    merged_result = capture(merged)

    # Then only the final state of the bar is left, 'finished' is present and the raw count is kept
    last = f"processing 299999/300000 [{'#' * 29:<30}]\n"
    assert stderr_result.text == last
    assert merged_result.text == last + "finished\n"
    assert merged_result.text.splitlines() == [last.rstrip("\n"), "finished"]
    assert stderr_result.total_bytes == len(stderr)
    assert merged_result.total_bytes == len(merged)
    assert not merged_result.truncated


# -- ANSI escape sequences ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"\x1b[1;31mERROR\x1b[0m: disk \x1b[4mfull\x1b[24m\n", "ERROR: disk full\n"),
        (b"\x1b]0;window title\x07\x1b]8;;https://example.com\x1b\\link\x1b]8;;\x1b\\ text\n", "link text\n"),
        (b"\x1b(B\x1b[mplain\x1b=\n", "plain\n"),
        (b"\x1b[2K\x1b[1Gredrawn\x1b[?25h\n", "redrawn\n"),
        (b"\x1b]0;never terminated\nnext line\n", "\nnext line\n"),
    ],
)
def test_ansi_escapes_are_stripped_even_when_split_across_chunks(data: bytes, expected: str) -> None:
    # Given coloured / titled output, split at every possible point
    for split in range(len(data) + 1):
        stream = StreamCapture(1024)
        stream.feed(data[:split])
        stream.feed(data[split:])

        # When it is finished
        result = stream.finish()

        # Then no escape sequence is left and the visible text is intact
        assert result.text == expected, split
        assert not result.replaced


def test_ansi_escapes_are_stripped_when_fed_byte_by_byte() -> None:
    # Given coloured output arriving one byte at a time
    data = b"\x1b[32mok\x1b[0m \x1b]2;t\x1b\\done\n" * 3

    # When it is captured in 1-byte chunks
    result = capture(data, cap_bytes=1024, size=1)

    # Then the text is the plain text
    assert result.text == "ok done\n" * 3


def test_incomplete_escape_at_the_end_of_the_stream_is_dropped() -> None:
    # Given a stream that ends in the middle of an escape sequence
    # When it is captured
    result = capture(b"done\x1b[3", cap_bytes=1024)

    # Then the partial sequence does not show
    assert result.text == "done"


# -- encodings and control characters --------------------------------------------------------------


def test_enc_01_every_byte_value_gives_valid_text_and_sets_replaced() -> None:
    # Given ENC-01's stdout (every byte value, a Latin-1 name) and stderr (a UTF-16 BOM)
    stdout = bytes(range(256)) + b"\nlatin-1 name: caf\xe9\n" + b"done\n"
    stderr = b"\xff\xfe legacy warning\n"

    # When both are captured
    out, err = capture(stdout, cap_bytes=1024), capture(stderr, cap_bytes=1024)

    # Then the text is valid UTF-8 JSON with no control character but \t and \n, 'done' is present,
    # invalid bytes and controls are U+FFFD and the flag says so
    for result in (out, err):
        assert result.replaced
        assert json.loads(json.dumps(result.text, ensure_ascii=False)) == result.text
        result.text.encode("utf-8")
        assert C0_EXCEPT_TAB_NEWLINE.search(result.text) is None
    assert "done\n" in out.text
    assert "latin-1 name: caf\ufffd\n" in out.text
    assert "\t" in out.text
    assert bytes(range(0x20, 0x7F)).decode() in out.text
    assert err.text == "\ufffd\ufffd legacy warning\n"
    assert out.total_bytes == len(stdout)


def test_utf8_split_across_chunks_is_not_replaced() -> None:
    # Given valid multi-byte text and a literal U+FFFD the child printed itself
    text = "naïve café — 汉字 🙂 \ufffd\n" * 10

    # When it arrives in 1-byte chunks
    result = capture(text.encode(), cap_bytes=1024, size=1)

    # Then it decodes whole and nothing counts as replaced
    assert result.text == text
    assert not result.replaced


def test_incomplete_utf8_at_the_end_of_the_stream_becomes_a_replacement_character() -> None:
    # Given a stream cut in the middle of a 3-byte character
    # When it is captured
    result = capture("ok 汉".encode()[:-1], cap_bytes=1024)

    # Then the partial character is U+FFFD and flagged
    assert result.text == "ok \ufffd"
    assert result.replaced


ENC_04_STREAMS = {
    "case": "汉字" * 600_000 + "\n" + "🙂" * 300_000 + "\n",
    "cjk": "汉字" * 600_000 + "\n",
    "emoji": "🙂" * 300_000 + "\n",
}


@pytest.mark.parametrize("cap", range(4096, 4100))
@pytest.mark.parametrize("name", sorted(ENC_04_STREAMS))
def test_enc_04_multibyte_floods_cut_on_code_points_within_the_cap(name: str, cap: int) -> None:
    # Given ENC-04's floods of 3- and 4-byte characters (~4.8 MB), at caps of every offset mod 4
    original = ENC_04_STREAMS[name]

    # When each is captured in 64 KiB reads
    result = capture(original.encode(), cap_bytes=cap)

    # Then both cuts land on code points, nothing is replaced, and marker included it fits the cap
    assert result.truncated
    assert not result.replaced
    assert "\ufffd" not in result.text
    assert len(result.text.encode("utf-8")) <= cap
    assert_head_tail_of(result.text, original, cap)


@pytest.mark.parametrize("cap", range(4096, 4100))
def test_enc_04_characters_split_by_odd_chunk_sizes_still_cut_cleanly(cap: int) -> None:
    # Given 3- and 4-byte characters arriving in 7-byte chunks, which split most characters
    original = "汉字" * 5_000 + "\n" + "🙂" * 3_000 + "\n"

    # When it is captured
    result = capture(original.encode(), cap_bytes=cap, size=7)

    # Then the result is the same clean head + tail as with whole characters
    assert "\ufffd" not in result.text
    assert not result.replaced
    assert_head_tail_of(result.text, original, cap)


@pytest.fixture(scope="module")
def enc_04_returned_text() -> str:
    """ENC-04's stdout as returned to the coder: truncated to the 1 MiB cap."""
    return capture(ENC_04_STREAMS["case"].encode()).text


@pytest.mark.parametrize(
    "second_cap",
    [*range(STORED_HISTORY_CAP_BYTES, STORED_HISTORY_CAP_BYTES + 4), 257, 1001, 4099],
)
def test_enc_04_second_truncation_for_stored_history_keeps_the_bound(
    enc_04_returned_text: str, second_cap: int
) -> None:
    # Given ENC-04's stdout already truncated to the 1 MiB returned-output cap
    first = enc_04_returned_text

    # When it is truncated again for stored history (and to odd caps), and then once more
    second, truncated = truncate_text(first, second_cap)
    third, _ = truncate_text(second, second_cap - 1)

    # Then each cut is within its cap, on code points, with no U+FFFD, from the text it was given
    assert truncated
    assert "\ufffd" not in second + third
    assert_head_tail_of(second, first, second_cap)
    assert len(third.encode("utf-8")) <= second_cap - 1
    assert second.startswith("汉字") and second.endswith("🙂\n")


def test_truncate_text_leaves_short_text_alone_and_rejects_negative_caps() -> None:
    # Given a short text
    # When / Then: it is returned unchanged, and a negative cap is an error
    assert truncate_text("short", 256) == ("short", False)
    with pytest.raises(ValueError, match="cap_bytes"):
        truncate_text("short", -1)


def test_truncate_text_below_the_marker_size_returns_part_of_the_marker() -> None:
    # Given a cap too small for the marker
    # When a long text is truncated to it
    text, truncated = truncate_text("x" * 1000, 40)

    # Then what fits is the start of the marker, and never more than the cap
    assert truncated
    assert text == "\n[... truncated: 1000 bytes omitted, kep"


# -- redaction -------------------------------------------------------------------------------------

SECRET = "sk-live-4f9a8b7c6d5e"


def test_secrets_are_redacted_across_every_chunk_boundary_in_text_and_spill() -> None:
    # Given output containing a secret twice, split at every possible point
    data = f"token={SECRET} and again {SECRET}\n".encode()
    for split in range(len(data) + 1):
        opener = RecordingOpener()
        stream = StreamCapture(1024, spill_opener=opener, redact=[SECRET])
        stream.feed(data[:split])
        stream.feed(data[split:])

        # When it is finished
        result = stream.finish()

        # Then neither the text nor the spill holds the secret, and total_bytes is the raw count
        assert result.text == "token=[REDACTED] and again [REDACTED]\n", split
        assert opener.written == b"token=[REDACTED] and again [REDACTED]\n", split
        assert result.total_bytes == len(data)


def test_redaction_handles_byte_by_byte_input_overlapping_and_non_ascii_secrets() -> None:
    # Given two secrets that overlap in the output, a non-ASCII secret and a too-short "secret"
    first, second, cyrillic = "ABCDEFGH12", "12345678XY", "пароль-секрет"
    data = f"a ABCDEFGH12345678XY b {cyrillic} c abc\n".encode()

    # When it arrives byte by byte
    stream = StreamCapture(1024, redact=[first, second, cyrillic, "abc"])
    for byte in chunks(data, 1):
        stream.feed(byte)
    result = stream.finish()

    # Then overlapping occurrences are redacted as one, with nothing of either left over, and secrets
    # shorter than 8 bytes are ignored
    assert result.text == "a [REDACTED] b [REDACTED] c abc\n"


@pytest.mark.parametrize("seed", range(5))
def test_what_survives_redaction_does_not_depend_on_chunking(seed: int) -> None:
    # Given outputs built from overlapping, adjacent and partial occurrences of three secrets
    secrets = ["ABCDEFGH12", "12345678XY", "aaaaaaaa"]
    pieces = [*(s.encode() for s in secrets), b"ABCDEFGH12345678XY", b"a", b"1", b"xy", b"ABCDE", b"45678XY"]
    rng = random.Random(seed)
    for _ in range(300):
        data = b"".join(rng.choice(pieces) for _ in range(rng.randint(1, 14)))

        # When each is captured in one chunk and in random small chunks
        one_chunk = capture(data, cap_bytes=1024, size=len(data), redact=secrets).text
        stream = StreamCapture(1024, redact=secrets)
        position = 0
        while position < len(data):
            size = rng.randint(1, 9)
            stream.feed(data[position : position + size])
            position += size
        chunked = stream.finish().text

        # Then no secret survives, and the text left unredacted is the same (adjacent markers aside)
        assert not any(secret in chunked for secret in secrets), data
        assert re.sub(r"(\[REDACTED\])+", "#", chunked) == re.sub(r"(\[REDACTED\])+", "#", one_chunk), data


# -- the spill -------------------------------------------------------------------------------------


def test_spill_keeps_raw_bytes_and_is_closed(tmp_path: Path) -> None:
    # Given a spill file and output with colours and redraws
    path = tmp_path / "stdout.txt"
    files: list[BinaryIO] = []

    def opener() -> BinaryIO:
        files.append(path.open("wb"))
        return files[-1]

    data = b"\x1b[31mred\x1b[0m 10%\r100%\r\n" * 1000

    # When it is captured
    stream = StreamCapture(1024, spill_opener=opener)
    for chunk in chunks(data, 1000):
        stream.feed(chunk)
    result = stream.finish()

    # Then the spill holds the raw bytes, escapes and \r included, and is closed
    assert path.read_bytes() == data
    assert files[0].closed
    assert (result.spill_bytes, result.spill_truncated, result.spill_error) == (len(data), False, None)
    assert result.text.startswith("100%\n100%\n")


def test_spill_is_opened_lazily_and_never_for_an_empty_stream() -> None:
    # Given a capture with a spill opener that receives nothing (empty reads included)
    opener = RecordingOpener()
    stream = StreamCapture(1024, spill_opener=opener)
    stream.feed(b"")

    # When it is finished
    result = stream.finish()

    # Then no spill file was created
    assert opener.calls == 0
    assert result == CapturedStream("", 0, 0, False, False, 0, False, None)


def test_spill_is_opened_once_on_the_first_data() -> None:
    # Given a capture with a spill opener
    opener = RecordingOpener()
    stream = StreamCapture(1024, spill_opener=opener)
    assert opener.calls == 0

    # When data arrives in several chunks
    for chunk in (b"a", b"b", b"c"):
        stream.feed(chunk)
    stream.finish()

    # Then the spill was opened once and got everything
    assert opener.calls == 1
    assert opener.written == b"abc"


def test_spill_stops_at_its_cap() -> None:
    # Given a 100-byte spill cap and 1,000 bytes of output
    opener = RecordingOpener()
    stream = StreamCapture(1024, spill_opener=opener, spill_cap_bytes=100)
    data = bytes(range(48, 58)) * 100

    # When it is captured in 64-byte reads
    for chunk in chunks(data, 64):
        stream.feed(chunk)
    result = stream.finish()

    # Then the spill holds exactly the first 100 bytes and says it was truncated; the text is whole
    assert opener.written == data[:100]
    assert (result.spill_bytes, result.spill_truncated) == (100, True)
    assert result.text == data.decode()


def test_feed_never_raises_when_the_spill_cannot_be_opened() -> None:
    # Given a spill opener that fails
    def opener() -> BinaryIO:
        raise PermissionError(errno.EACCES, "Permission denied", "/work/runs/r1/stdout.txt")

    stream = StreamCapture(1024, spill_opener=opener)

    # When output arrives
    stream.feed(b"still captured\n")
    stream.feed(b"and more\n")
    result = stream.finish()

    # Then the text is captured and the error recorded
    assert result.text == "still captured\nand more\n"
    assert result.spill_error == "[Errno 13] Permission denied: '/work/runs/r1/stdout.txt'"
    assert result.spill_bytes == 0


def test_feed_never_raises_when_a_spill_write_fails() -> None:
    # Given a spill whose disk fills up after the first write
    class FullDisk(KeptBytesIO):
        def write(self, data: bytes, /) -> int:  # type: ignore[override]
            if self.tell():
                raise OSError(errno.ENOSPC, "No space left on device")
            return super().write(data)

    spill = FullDisk()
    stream = StreamCapture(1024, spill_opener=lambda: spill)

    # When output keeps arriving
    for chunk in (b"first\n", b"second\n", b"third\n"):
        stream.feed(chunk)
    result = stream.finish()

    # Then capture goes on, the spill keeps what was written, and the error is recorded
    assert result.text == "first\nsecond\nthird\n"
    assert spill.kept == b"first\n"
    assert result.spill_bytes == len(b"first\n")
    assert result.spill_error == "[Errno 28] No space left on device"
    assert spill.closed


# -- constant memory -------------------------------------------------------------------------------


@pytest.mark.slow
def test_out_04_two_gigabytes_of_nul_keep_memory_flat_and_come_back_replaced() -> None:
    # Given OUT-04's flood: 2 GiB of NUL bytes in 1 MiB writes
    chunk = b"\0" * (1 << 20)
    stream = StreamCapture(RETURNED_OUTPUT_CAP_BYTES)
    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        started = time.perf_counter()

        # When it is all fed and finished
        for _ in range(2048):
            stream.feed(chunk)
        result = stream.finish()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    # Then memory grew by well under 16 MiB, every NUL is U+FFFD, and the counts are true
    assert peak - baseline < 16 * 2**20
    assert time.perf_counter() - started < 30
    assert "\x00" not in result.text
    assert result.replaced and result.truncated
    assert result.total_bytes == 2 * 2**30
    assert result.clean_bytes == 3 * 2 * 2**30  # U+FFFD is 3 bytes
    assert len(result.text.encode("utf-8")) <= RETURNED_OUTPUT_CAP_BYTES
    assert set(split_truncated(result.text)[0]) == {"\ufffd"}


def test_a_50_megabyte_line_without_newline_keeps_memory_bounded() -> None:
    # Given 50 MB of output that never contains a newline
    chunk = b"x" * READ_SIZE
    stream = StreamCapture(RETURNED_OUTPUT_CAP_BYTES)
    reads = 50_000_000 // READ_SIZE
    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()

        # When it is fed and finished
        for _ in range(reads):
            stream.feed(chunk)
        result = stream.finish()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    # Then the line is kept as plain content, head and tail, in bounded memory
    assert peak - baseline < 16 * 2**20
    assert result.truncated
    assert result.clean_bytes == result.total_bytes == reads * READ_SIZE
    head, _, kept, _, tail = split_truncated(result.text)
    assert set(head) == set(tail) == {"x"}
    assert kept > RETURNED_OUTPUT_CAP_BYTES - 200


# -- chunking never changes the result -------------------------------------------------------------

FUZZ_TOKENS = [
    b"plain text ",
    b"\n",
    b"\r",
    b"\r\n",
    b"\x1b[1;31m",
    b"\x1b[0m",
    b"\x1b]0;title\x07",
    b"\x1b]8;;https://example.com\x1b\\",
    b"\x1b(B",
    "汉字🙂é".encode(),
    b"\xff\xfe",
    "汉".encode()[:2],
    b"\x00\x07\x08",
    b"\t",
    SECRET.encode(),
    SECRET.encode()[:9],
]


@pytest.mark.parametrize("seed", range(20))
def test_any_chunking_gives_the_same_result_as_one_chunk(seed: int) -> None:
    # Given a random mix of text, redraws, escapes, multi-byte and invalid bytes, controls and secrets
    rng = random.Random(seed)
    data = b"".join(rng.choice(FUZZ_TOKENS) for _ in range(400))

    def run(sizes: Iterable[int]) -> tuple[CapturedStream, bytes]:
        opener = RecordingOpener()
        stream = StreamCapture(4096, spill_opener=opener, redact=[SECRET])
        position = 0
        for size in sizes:
            stream.feed(data[position : position + size])
            position += size
            if position >= len(data):
                break
        return stream.finish(), opener.written

    # When it is fed whole, and in random small chunks
    whole = run([len(data)])
    pieces = run(iter(lambda: rng.randint(1, 9), 0))

    # Then text, flags, counts and spill are identical, and the text is clean
    assert pieces == whole
    result = whole[0]
    assert SECRET not in result.text and SECRET.encode() not in whole[1]
    assert C0_EXCEPT_TAB_NEWLINE.search(result.text) is None
    assert "\x1b" not in result.text and "\r" not in result.text


# -- lifecycle -------------------------------------------------------------------------------------


def test_finish_returns_the_same_result_and_feed_after_finish_is_an_error() -> None:
    # Given a finished capture
    stream = StreamCapture(1024)
    stream.feed(b"once\n")
    result = stream.finish()

    # When / Then: finishing again gives the same result; feeding again is a supervisor bug
    assert stream.finish() is result
    assert stream.total_bytes == 5
    with pytest.raises(RuntimeError):
        stream.feed(b"late\n")
