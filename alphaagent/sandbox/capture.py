"""Streaming, constant-memory capture of one output stream (stdout or stderr) of an untrusted child.

The supervisor reads a pipe in chunks (``os.read(fd, 65536)``) and hands every chunk to
:meth:`StreamCapture.feed`; at the end :meth:`StreamCapture.finish` returns a :class:`CapturedStream`.
Each chunk goes through one pipeline, with state carried across chunk boundaries so that a secret,
a multi-byte character, an escape sequence or a ``\\r\\n`` pair may be split anywhere:

1. redaction of configured secrets in the raw bytes;
2. the full-output spill (redacted raw bytes, capped);
3. incremental UTF-8 decoding, invalid bytes becoming U+FFFD;
4. cleaning for a reader: ANSI escape sequences stripped, carriage-return redraws collapsed, other
   C0 control characters replaced by U+FFFD;
5. head + tail kept on the cleaned text's UTF-8 encoding, the middle only counted.

Memory stays O(cap_bytes) whatever the child writes (DESIGN §4.3; cases OUT-01, OUT-04).
"""

from __future__ import annotations

import codecs
import re
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import BinaryIO, Final

OutputSink = Callable[[str, bytes], None]
"""A live view of a run's output: called as ``sink(stream, data)`` with ``stream`` ``"stdout"`` or
``"stderr"`` and the raw (redacted, untrusted) bytes as they arrive."""

__all__ = [
    "MIN_CAP_BYTES",
    "REDACTED",
    "REDACTION_MIN_SECRET_BYTES",
    "RETURNED_OUTPUT_CAP_BYTES",
    "SPILL_CAP_BYTES",
    "STORED_HISTORY_CAP_BYTES",
    "CapturedStream",
    "StreamCapture",
    "truncate_text",
]

RETURNED_OUTPUT_CAP_BYTES = 1 << 20
"""Returned output per stream, 1 MiB: the run result given to the coder (DESIGN §4.3)."""

STORED_HISTORY_CAP_BYTES = 16 << 10
"""Stored history per stream, 16 KiB: the run record persisted for the workspace UI (DESIGN §4.3)."""

SPILL_CAP_BYTES = 64 << 20
"""Full-output spill per stream, 64 MiB: ``work/runs/{run_id}/stdout.txt`` / ``stderr.txt`` (DESIGN §4.3)."""

MIN_CAP_BYTES = 256
"""Smallest ``cap_bytes`` a :class:`StreamCapture` accepts: room for the marker (117 bytes at 20 digits)."""

REDACTION_MIN_SECRET_BYTES = 8
"""Secrets shorter than this many UTF-8 bytes are ignored: redacting short strings mangles ordinary output."""

REDACTED = "[REDACTED]"
"""What every occurrence of a secret becomes, in the spill and in the text."""

_REDACTED_BYTES = REDACTED.encode("ascii")

# C0 control characters other than \t and \n (content) and \r (interpreted by the line assembly). ESC is
# included: one still present after the escape sequences are stripped is stray.
_C0_CONTROLS = tuple(chr(code) for code in range(0x20) if chr(code) not in "\t\n\r")

# A possibly incomplete escape sequence at a chunk end is held back until the next chunk, up to this many
# characters; a longer (unterminated OSC) one is dropped up to the chunk end instead, to bound memory.
_ESCAPE_HOLD_MAX_CHARS = 4096

# ECMA-48 / ECMA-35 escape sequences, each starting with a literal ESC so the regex engine skips to it:
# - CSI: ESC [ parameters 0x30-0x3F* intermediates 0x20-0x2F* final 0x40-0x7E;
# - OSC, DCS, SOS, PM, APC: ESC ] / P / X / ^ / _ up to BEL or ST (ESC \), abandoned at a newline so an
#   unterminated one cannot swallow the rest of the output;
# - otherwise ESC intermediates 0x20-0x2F* final 0x30-0x7E: two-char ESC x, and charset designations
#   such as ESC ( B that `tput sgr0` prints.
_ESCAPE_RE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|[\]PX^_][^\x07\x1b\n]*(?:\x07|\x1b\\)?|[ -/]*[0-~])")
_INCOMPLETE_ESCAPE_RE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*|[\]PX^_][^\x07\x1b\n]*|[ -/]*)\Z")


@dataclass(frozen=True, slots=True)
class CapturedStream:
    """What was captured from one stream, as returned by :meth:`StreamCapture.finish`.

    Attributes:
        text: the cleaned text (valid UTF-8, no ANSI escapes, no C0 controls but ``\\t``/``\\n``), at
            most ``cap_bytes`` bytes once UTF-8 encoded, marker included. When truncated it is
            ``head + marker + tail`` with the marker
            ``"\\n[... truncated: {omitted} bytes omitted, kept {kept} of {clean_bytes} bytes ...]\\n"``.
        total_bytes: raw bytes the child wrote (before redaction and cleaning).
        clean_bytes: UTF-8 bytes of the whole cleaned text, before truncation.
        truncated: True when ``text`` is head + marker + tail rather than the whole cleaned text.
        replaced: True when any invalid UTF-8 byte or C0 control character became U+FFFD (case ENC-01).
        spill_bytes: bytes written to the spill file (0 without a spill).
        spill_truncated: True when the spill stopped at its cap with output left over.
        spill_error: the message of the OSError that stopped the spill, or None.
    """

    text: str
    total_bytes: int
    clean_bytes: int
    truncated: bool
    replaced: bool
    spill_bytes: int
    spill_truncated: bool
    spill_error: str | None


def truncate_text(text: str, cap_bytes: int, *, printed_bytes: int | None = None) -> tuple[str, bool]:
    """Fit an already-decoded text into ``cap_bytes`` UTF-8 bytes with the head + marker + tail rule.

    The same rule as :meth:`StreamCapture.finish`, for a second truncation such as the 16 KiB stored
    history (:data:`STORED_HISTORY_CAP_BYTES`, DESIGN §4.3): the result, marker included, encodes to at
    most ``cap_bytes`` bytes, both cuts fall on code-point boundaries and no U+FFFD is introduced
    (case ENC-04). Truncating an already-truncated text keeps both properties; its marker then counts the
    bytes of the text given, old marker included.

    Args:
        text: any str without lone surrogates (``CapturedStream.text`` never has any).
        cap_bytes: the budget in UTF-8 bytes, >= 0. When it cannot hold the marker (54 bytes plus three
            numbers' digits) only the start of the marker is returned.
        printed_bytes: the bytes the code printed in all (``RunResult.stdout_bytes``), when ``text`` is
            already a cut of them: the marker then names both sizes, ``... of {len(text)} bytes the
            agent saw; the code printed {printed_bytes} bytes``, so a history never hides the original.

    Returns:
        ``(text, False)`` unchanged when it fits, else ``(head + marker + tail, True)``.

    Raises:
        ValueError: ``cap_bytes`` is negative.
        UnicodeEncodeError: ``text`` contains a lone surrogate.
    """
    if cap_bytes < 0:
        raise ValueError(f"cap_bytes must be >= 0, got {cap_bytes}")
    data = text.encode("utf-8")
    if len(data) <= cap_bytes:
        return text, False
    printed = printed_bytes if printed_bytes is not None and printed_bytes != len(data) else None
    return _join_head_tail(data, data, len(data), cap_bytes, printed_bytes=printed), True


ENCODED_HINT: Final = (
    "; it looks like {kind} data printed as text: write it to a file instead (an image to charts/) and"
    " call register_artifact"
)
"""Added to the marker when the kept text is mostly base64 or hex (an image printed instead of saved)."""

_ENCODED_RUN = re.compile(r"[A-Za-z0-9+/=_-]{64,}")
_ENCODED_SAMPLE_CHARS = 8192
_ENCODED_MIN_SHARE = 0.6
"""Share of the sampled text that long runs of base64/hex characters must cover to count as encoded."""


def _encoded_kind(head: bytes, tail: bytes) -> str | None:
    """``"base64"`` or ``"hex"`` when the text's start and end are mostly long unbroken runs of that
    alphabet (at least 60 % of up to 8,192 characters each side, in runs of 64 or more), else None.
    Encoded binary data uses most of its alphabet: base64 mixes upper and lower case and digits, hex
    mixes digits and letters a-f; a run of one repeated letter, or of digits, is neither."""
    sample = (
        head[:_ENCODED_SAMPLE_CHARS].decode("utf-8", "ignore")
        + "\n"
        + tail[-_ENCODED_SAMPLE_CHARS:].decode("utf-8", "ignore")
    )
    runs = _ENCODED_RUN.findall(sample)
    covered = sum(len(run) for run in runs)
    if covered < 256 or covered < _ENCODED_MIN_SHARE * len(sample):
        return None
    alphabet = set("".join(runs))
    hex_letters = alphabet & set("abcdefABCDEF")
    if alphabet <= set("0123456789abcdefABCDEF") and len(hex_letters) >= 4 and len(alphabet) >= 12:
        return "hex"  # digits alone are numbers, not hex-encoded bytes
    cases = (str.isupper, str.islower, str.isdigit)
    if len(alphabet) >= 40 and all(any(test(c) for c in alphabet) for test in cases):
        return "base64"
    return None


def _marker(omitted: int, kept: int, total: int, printed: int | None = None, hint: str = "") -> str:
    if printed is None:
        return f"\n[... truncated: {omitted} bytes omitted, kept {kept} of {total} bytes{hint} ...]\n"
    return (
        f"\n[... truncated: {omitted} bytes omitted, kept {kept} of {total} bytes the agent saw;"
        f" the code printed {printed} bytes{hint} ...]\n"
    )


def _join_head_tail(
    head: bytes, tail: bytes, total_bytes: int, cap_bytes: int, *, printed_bytes: int | None = None
) -> str:
    """Build head + marker + tail within ``cap_bytes`` from a prefix and a suffix of a longer text.

    ``head`` is a prefix and ``tail`` a suffix of one valid UTF-8 text of ``total_bytes`` bytes (>
    ``cap_bytes``); each is at least as long as the part of the budget it may get. The marker's length is
    reserved at its widest (every number as wide as the widest count), the head gets half of what is
    left and the tail the rest, so the real, shorter marker always fits. Decoding a cut with
    ``errors="ignore"`` drops only the partial character at the cut, since the text is otherwise valid.
    ``printed_bytes``: see ``truncate_text``. When the text looks encoded (``_encoded_kind``) and the
    budget allows, the marker says so and where such data belongs.
    """
    kind = _encoded_kind(head, tail)
    hint = ENCODED_HINT.format(kind=kind) if kind else ""
    widest = max(total_bytes, printed_bytes or 0)
    budget = cap_bytes - len(_marker(widest, widest, widest, printed_bytes and widest, hint))
    if hint and budget < cap_bytes // 2:
        hint = ""  # a small budget keeps text rather than advice
        budget = cap_bytes - len(_marker(widest, widest, widest, printed_bytes and widest))
    if budget < 0:
        return _marker(total_bytes, 0, total_bytes, printed_bytes)[:cap_bytes]
    head_text = head[: budget // 2].decode("utf-8", "ignore")
    head_bytes = len(head_text.encode("utf-8"))
    tail_room = budget - head_bytes
    tail_text = tail[max(0, len(tail) - tail_room) :].decode("utf-8", "ignore") if tail_room > 0 else ""
    kept = head_bytes + len(tail_text.encode("utf-8"))
    return head_text + _marker(total_bytes - kept, kept, total_bytes, printed_bytes, hint) + tail_text


class _Redactor:
    """Replaces every occurrence of each secret in a byte stream by ``[REDACTED]``, chunk by chunk.

    ``keep`` = len(longest secret) - 1 bytes are held back at the end of each chunk (an occurrence may
    start there) and the same number of already-emitted bytes is kept before them as context, so an
    occurrence overlapping one that was already redacted is still found: no byte of any occurrence is
    ever emitted. Overlapping occurrences become one ``[REDACTED]`` (two adjacent ones when the overlap
    straddles a chunk boundary). Memory: at most 2 * keep bytes between chunks.
    """

    def __init__(self, secrets: Sequence[bytes]) -> None:
        self._secrets = tuple(secrets)
        self._keep = max(len(secret) for secret in secrets) - 1
        self._buffer = b""
        self._emitted = 0  # leading bytes of _buffer already emitted (context only)

    def _spans(self, data: bytes, start: int) -> list[tuple[int, int]]:
        found: list[tuple[int, int]] = []
        for secret in self._secrets:
            at = data.find(secret)
            while at != -1:
                found.append((at, at + len(secret)))
                at = data.find(secret, at + 1)
        found.sort()
        merged: list[tuple[int, int]] = []
        for begin, end in found:
            if end <= start:
                continue
            begin = max(begin, start)
            if merged and begin < merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((begin, end))
        return merged

    def _emit(self, data: bytes, final: bool) -> bytes:
        start = self._emitted
        spans = self._spans(data, start)
        cut = len(data) if final else max(start, len(data) - self._keep)
        for begin, end in spans:
            if begin < cut < end:
                cut = end
        out: list[bytes] = []
        position = start
        for begin, end in spans:
            if begin >= cut:
                break
            out.append(data[position:begin])
            out.append(_REDACTED_BYTES)
            position = end
        out.append(data[position:cut])
        context = max(0, cut - self._keep)
        self._buffer = data[context:]
        self._emitted = cut - context
        return b"".join(out)

    def feed(self, chunk: bytes) -> bytes:
        return self._emit(self._buffer + chunk, final=False)

    def flush(self) -> bytes:
        return self._emit(self._buffer, final=True)


class StreamCapture:
    """Captures one output stream of an untrusted child in constant memory (DESIGN §4.3).

    Feed raw chunks of any size with :meth:`feed`, then call :meth:`finish` once for the
    :class:`CapturedStream`. The pipeline per chunk, with state carried across chunks:

    a) redaction: each secret (UTF-8 encoded, >= :data:`REDACTION_MIN_SECRET_BYTES` bytes, shorter ones
       ignored) becomes ``[REDACTED]`` everywhere downstream; ``total_bytes`` still counts raw bytes.
    b) spill: the redacted raw bytes (escapes and ``\\r`` kept) go to the file ``spill_opener()`` returns,
       opened on the first non-empty data (never for an empty stream), up to ``spill_cap_bytes``. An
       OSError from the opener, a write or the close stops the spill and is recorded, never raised.
    c) UTF-8 decoding with U+FFFD for invalid bytes (case ENC-01).
    d) cleaning (cases NOISE-01, OUT-04): ANSI escape sequences (CSI, OSC/DCS/..., ESC x) are stripped;
       within a line (text between ``\\n``) a lone ``\\r`` starts the line over and the line's final
       state is its last non-empty ``\\r``-separated segment, so ``\\r\\n`` is a plain newline; other C0
       control characters become U+FFFD. A line without ``\\n`` is held until it exceeds ``cap_bytes``
       bytes, then kept as plain content, so a never-ending line still uses bounded memory.
    e) head + tail: the first ``cap_bytes // 2`` and last ``cap_bytes`` bytes of the cleaned UTF-8 text
       are kept and the middle only counted (cases OUT-01, OUT-06).

    Memory is O(cap_bytes + chunk size) whatever the stream's length (case OUT-04).

    Args:
        cap_bytes: budget of ``CapturedStream.text`` in UTF-8 bytes, marker included, >= 256
            (:data:`RETURNED_OUTPUT_CAP_BYTES` for the run result).
        spill_opener: returns a binary file to receive the full output; the capture closes it in
            :meth:`finish`. None: no spill.
        spill_cap_bytes: most bytes written to the spill (:data:`SPILL_CAP_BYTES`), >= 0.
        redact: secrets to redact.
        on_data: called with each piece of redacted raw bytes as it arrives (the same bytes the
            spill gets, before any cap), for a live view of the run; it must not block for long. The
            bytes are untrusted: a terminal must neutralise them first. An exception it raises
            stops further calls and is otherwise ignored: a broken viewer never breaks a run.

    Raises:
        ValueError: ``cap_bytes`` < 256 or ``spill_cap_bytes`` < 0.

    Example:
        >>> capture = StreamCapture(1024)
        >>> capture.feed(b"\\x1b[32m10%\\r100%\\x1b[0m\\ndone\\n")
        >>> capture.finish().text
        '100%\\ndone\\n'
    """

    def __init__(
        self,
        cap_bytes: int,
        *,
        spill_opener: Callable[[], BinaryIO] | None = None,
        spill_cap_bytes: int = SPILL_CAP_BYTES,
        redact: Sequence[str] = (),
        on_data: Callable[[bytes], None] | None = None,
    ) -> None:
        if cap_bytes < MIN_CAP_BYTES:
            raise ValueError(f"cap_bytes must be >= {MIN_CAP_BYTES}, got {cap_bytes}")
        if spill_cap_bytes < 0:
            raise ValueError(f"spill_cap_bytes must be >= 0, got {spill_cap_bytes}")
        self._cap = cap_bytes
        self._total = 0
        self._result: CapturedStream | None = None
        self._on_data = on_data

        secrets = {secret.encode("utf-8") for secret in redact}
        kept_secrets = sorted(s for s in secrets if len(s) >= REDACTION_MIN_SECRET_BYTES)
        self._redactor = _Redactor(kept_secrets) if kept_secrets else None

        self._spill_opener = spill_opener
        self._spill_cap = spill_cap_bytes
        self._spill: BinaryIO | None = None
        self._spill_open = spill_opener is not None  # False once the spill has stopped
        self._spill_bytes = 0
        self._spill_truncated = False
        self._spill_error: str | None = None

        self._undecoded = b""
        self._replaced = False

        self._escape_hold = ""
        self._controls: tuple[str, ...] = ()  # C0 controls seen so far; replaced when text is kept
        self._line_parts: list[str] = []  # the line's current \r-segment, not yet complete
        self._line_bytes = 0
        self._line_last = ""  # the line's last non-empty complete \r-segment
        self._ready: list[str] = []  # cleaned text waiting to be kept

        self._head_keep = cap_bytes // 2
        self._tail_keep = cap_bytes
        self._head: list[str] = []
        self._head_bytes = 0
        self._tail: deque[tuple[str, int]] = deque()
        self._tail_bytes = 0
        self._clean_bytes = 0

    @property
    def total_bytes(self) -> int:
        """Raw bytes fed so far, before redaction; the supervisor kills a flooding child on it."""
        return self._total

    def feed(self, chunk: bytes) -> None:
        """Process one raw chunk of the stream, of any size (typically up to 65536 bytes).

        Never raises for anything the child wrote nor for a failing spill.

        Raises:
            RuntimeError: :meth:`finish` was already called (a supervisor bug, not child behaviour).
        """
        if self._result is not None:
            raise RuntimeError("feed() after finish()")
        if not chunk:
            return
        self._total += len(chunk)
        data = self._redactor.feed(chunk) if self._redactor is not None else chunk
        self._process(data, final=False)

    def finish(self) -> CapturedStream:
        """Flush the held-back state, close the spill and return the capture.

        Text still held at the end is flushed: the last line without ``\\n`` is kept as is, an
        incomplete escape sequence is dropped, an incomplete UTF-8 sequence becomes U+FFFD. Calling it
        again returns the same result.
        """
        if self._result is not None:
            return self._result
        rest = self._redactor.flush() if self._redactor is not None else b""
        self._process(rest, final=True)
        self._close_spill()
        self._result = CapturedStream(
            text=self._text(),
            total_bytes=self._total,
            clean_bytes=self._clean_bytes,
            truncated=self._clean_bytes > self._cap,
            replaced=self._replaced,
            spill_bytes=self._spill_bytes,
            spill_truncated=self._spill_truncated,
            spill_error=self._spill_error,
        )
        return self._result

    # -- pipeline -----------------------------------------------------------------------------------

    def _process(self, data: bytes, *, final: bool) -> None:
        if data:
            self._write_spill(data)
            self._tell(data)
        self._clean(self._decode(data, final=final), final=final)
        if self._ready:
            self._keep("".join(self._ready))
            self._ready.clear()

    def _tell(self, data: bytes) -> None:
        if self._on_data is None:
            return
        try:
            self._on_data(data)
        except Exception:
            self._on_data = None

    def _write_spill(self, data: bytes) -> None:
        if not self._spill_open or self._spill_opener is None:
            return
        room = self._spill_cap - self._spill_bytes
        if room <= 0:
            self._spill_truncated = True
            self._spill_open = False
            return
        piece = data if len(data) <= room else data[:room]
        try:
            if self._spill is None:
                self._spill = self._spill_opener()
            self._spill.write(piece)
        except OSError as exc:
            self._stop_spill(exc)
            return
        self._spill_bytes += len(piece)
        if len(piece) < len(data):
            self._spill_truncated = True
            self._spill_open = False

    def _stop_spill(self, exc: OSError) -> None:
        self._spill_open = False
        if self._spill_error is None:
            self._spill_error = str(exc) or type(exc).__name__

    def _close_spill(self) -> None:
        spill, self._spill = self._spill, None
        if spill is None:
            return
        try:
            spill.close()
        except OSError as exc:
            self._stop_spill(exc)

    def _decode(self, data: bytes, *, final: bool) -> str:
        # Strict first so `replaced` reports real decoding errors only (a U+FFFD the child printed itself
        # is not one); a failed strict call leaves nothing consumed, so the retry sees the same bytes.
        buffer = self._undecoded + data if self._undecoded else data
        if not buffer:
            return ""
        try:
            text, used = codecs.utf_8_decode(buffer, "strict", final)
        except UnicodeDecodeError:
            text, used = codecs.utf_8_decode(buffer, "replace", final)
            self._replaced = True
        self._undecoded = buffer[used:]
        return text

    def _clean(self, text: str, *, final: bool) -> None:
        if self._escape_hold:
            text = self._escape_hold + text
            self._escape_hold = ""
        if "\x1b" in text:
            text = self._strip_escapes(text, final=final)
        if text:
            self._note_controls(text)
            self._assemble_lines(text)
        if final:
            line = self._take_line()
            if line:
                self._ready.append(line)

    def _strip_escapes(self, text: str, *, final: bool) -> str:
        last_escape = text.rfind("\x1b")
        if _INCOMPLETE_ESCAPE_RE.match(text, last_escape):
            if not final and len(text) - last_escape <= _ESCAPE_HOLD_MAX_CHARS:
                self._escape_hold = text[last_escape:]
            text = text[:last_escape] if final or self._escape_hold else text
        return _ESCAPE_RE.sub("", text)

    def _note_controls(self, text: str) -> None:
        # Controls are replaced only in the text that is kept (see _keep); here they are just detected,
        # which keeps a flood of NULs cheap (case OUT-04).
        if len(self._controls) == len(_C0_CONTROLS):
            return
        new = [c for c in _C0_CONTROLS if c not in self._controls and c in text]
        if new:
            self._controls += tuple(new)
            self._replaced = True

    def _assemble_lines(self, text: str) -> None:
        if "\r" not in text and not self._line_last:
            # Fast path: no redraw to collapse, so every complete line is final as it stands.
            newline = text.rfind("\n")
            if newline < 0:
                self._extend_segment(text)
                return
            self._ready.extend(self._line_parts)
            self._line_parts = []
            self._line_bytes = 0
            self._ready.append(text if newline == len(text) - 1 else text[: newline + 1])
            if newline < len(text) - 1:
                self._extend_segment(text[newline + 1 :])
            return
        lines = text.split("\n")
        for line in lines[:-1]:
            self._extend_line(line)
            self._ready.append(self._take_line() + "\n")
        self._extend_line(lines[-1])

    def _extend_line(self, fragment: str) -> None:
        """Add text without ``\\n`` to the pending line, applying its ``\\r`` redraws."""
        if "\r" not in fragment:
            self._extend_segment(fragment)
            return
        segments = fragment.split("\r")
        self._extend_segment(segments[0])
        current = "".join(self._line_parts)
        if current:
            self._line_last = current
        self._line_parts = []
        self._line_bytes = 0
        for index in range(len(segments) - 2, 0, -1):
            if segments[index]:
                self._line_last = segments[index]
                break
        self._extend_segment(segments[-1])

    def _extend_segment(self, piece: str) -> None:
        if not piece:
            return
        self._line_parts.append(piece)
        self._line_bytes += len(piece) if piece.isascii() else len(piece.encode("utf-8"))
        if self._line_bytes > self._cap:
            # Bound the pending line: past cap_bytes bytes it is kept as plain content.
            self._ready.extend(self._line_parts)
            self._line_parts = []
            self._line_bytes = 0
            self._line_last = ""

    def _take_line(self) -> str:
        current = "".join(self._line_parts)
        line = current or self._line_last
        self._line_parts = []
        self._line_bytes = 0
        self._line_last = ""
        return line

    # -- head + tail --------------------------------------------------------------------------------

    def _replace_controls(self, text: str) -> str:
        for control in self._controls:
            text = text.replace(control, "\ufffd")
        return text

    def _utf8_len(self, text: str) -> int:
        """UTF-8 length of ``text`` once its controls are replaced (each 1 byte becomes 3)."""
        if text.isascii():
            return len(text) + 2 * sum(text.count(control) for control in self._controls)
        return len(self._replace_controls(text).encode("utf-8"))

    def _keep(self, text: str) -> None:
        """Account cleaned ``text`` (controls not yet replaced) into head, counted middle and tail."""
        if self._head_bytes < self._head_keep:
            need = self._head_keep - self._head_bytes
            # `need` characters are at least `need` bytes, so this fills the head when text is longer.
            part, text = (text, "") if len(text) <= need else (text[:need], text[need:])
            size = self._utf8_len(part)
            self._head.append(part)
            self._head_bytes += size
            self._clean_bytes += size
            if not text:
                return
        if len(text) > self._tail_keep:
            # Only the last tail_keep characters (>= tail_keep bytes) can end up in the tail.
            cut = len(text) - self._tail_keep
            self._clean_bytes += self._utf8_len(text[:cut])
            text = text[cut:]
            self._tail.clear()
            self._tail_bytes = 0
        size = self._utf8_len(text)
        self._clean_bytes += size
        self._tail.append((text, size))
        self._tail_bytes += size
        while self._tail_bytes - self._tail[0][1] >= self._tail_keep:
            self._tail_bytes -= self._tail.popleft()[1]

    def _text(self) -> str:
        head = self._replace_controls("".join(self._head)).encode("utf-8")
        tail = self._replace_controls("".join(text for text, _ in self._tail)).encode("utf-8")
        self._head.clear()
        self._tail.clear()
        if self._clean_bytes <= self._cap:
            return (head + tail).decode("utf-8")
        if len(head) + len(tail) == self._clean_bytes:
            # Nothing was dropped between them: cut from the whole text (the head may hold more than
            # head_keep bytes, and then the tail alone could be shorter than its share).
            whole = head + tail
            return _join_head_tail(whole, whole, self._clean_bytes, self._cap)
        return _join_head_tail(head, tail, self._clean_bytes, self._cap)
