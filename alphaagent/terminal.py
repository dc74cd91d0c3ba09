"""Showing untrusted bytes in a terminal: a run's live output, and whether a file is text.

Everything here treats its input as hostile (DESIGN §4.10: every byte of user content is untrusted):
escape sequences and other control characters are shown as escapes, never obeyed, and what is shown
is bounded.
"""

from __future__ import annotations

import codecs
from typing import TextIO

from alphaagent.models.common import printable_text

LIVE_OUTPUT_CAP_BYTES = 2**20
"""How much of each stream of a run ``run`` and ``exec`` show live: the returned-output cap of
DESIGN §4.3 (1 MiB), so the terminal never gets more than the caller of ``run_in_env`` would."""


class ReaderMayLeave:
    """A text stream whose reader may go away while a turn runs (``run 2>&1 | head``): a write
    after the reader left is dropped, not raised, so who was watching a turn never fails it (as
    MCP's progress is advisory). A new-user review found the turn recorded as a BrokenPipeError."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                self._out.write(text)
            except BrokenPipeError:
                self.gone = True
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._out.flush()
            except BrokenPipeError:
                self.gone = True


class LiveOutput:
    """The ``OutputSink`` of ``run`` and ``exec``: writes a run's output to a terminal as it arrives,
    made safe first (``printable_text``: escape sequences and other control characters shown as
    escapes, never obeyed). Each line is prefixed by its stream's prefix; ``\r\n`` counts as one
    line end and a lone ``\r`` as another, so a progress bar shows as lines. At most
    ``LIVE_OUTPUT_CAP_BYTES`` of each stream are shown, then one line says the rest is in the
    result: a run that floods its output cannot flood the terminal (the result and its caps are
    unchanged)."""

    def __init__(self, out: TextIO, *, stdout_prefix: str, stderr_prefix: str) -> None:
        self._out = out
        self._prefix = {"stdout": stdout_prefix, "stderr": stderr_prefix}
        self._decoders = {name: codecs.getincrementaldecoder("utf-8")("replace") for name in self._prefix}
        self._shown = dict.fromkeys(self._prefix, 0)
        self._at_line_start = dict.fromkeys(self._prefix, True)
        self._pending_cr = dict.fromkeys(self._prefix, False)
        self._last: str | None = None

    def __call__(self, stream: str, data: bytes) -> None:
        if stream not in self._prefix:
            return
        if self._shown[stream] >= LIVE_OUTPUT_CAP_BYTES:
            return
        room = LIVE_OUTPUT_CAP_BYTES - self._shown[stream]
        self._shown[stream] += len(data)
        text = self._decoders[stream].decode(data[:room])
        if self._shown[stream] >= LIVE_OUTPUT_CAP_BYTES:
            text += self._decoders[stream].decode(b"", final=True)
        self._write(stream, text)
        if self._shown[stream] >= LIVE_OUTPUT_CAP_BYTES:
            self._end_line(stream)
            self._out.write(
                f"{self._prefix[stream]}[live {stream} stops after {LIVE_OUTPUT_CAP_BYTES // 2**20} MiB;"
                " the run goes on and its result keeps the head and the tail]\n"
            )
            self._out.flush()

    def _write(self, stream: str, text: str) -> None:
        if self._pending_cr[stream]:
            text, self._pending_cr[stream] = "\r" + text, False
        if text.endswith("\r"):
            text, self._pending_cr[stream] = text[:-1], True  # the next chunk says if it is \r\n
        text = text.replace("\r\n", "\n").replace("\r", "\n")
        if not text:
            return
        if self._last is not None and self._last != stream:
            self._end_line(self._last)  # the other stream's unfinished line ends where this begins
        prefix = self._prefix[stream]
        lines = text.split("\n")
        parts = []
        for i, line in enumerate(lines):
            last = i == len(lines) - 1
            if last and not line:
                break
            if self._at_line_start[stream] and prefix:
                parts.append(prefix)
            parts.append(printable_text(line))
            if not last:
                parts.append("\n")
            self._at_line_start[stream] = not last
        self._out.write("".join(parts))
        self._out.flush()
        self._last = stream

    def _end_line(self, stream: str) -> None:
        if not self._at_line_start[stream]:
            self._out.write("\n")
            self._at_line_start[stream] = True

    def end_lines(self) -> None:
        """Show what the decoders still hold and end each stream's unfinished line (after a run,
        before the next progress line); the sink can go on being used."""
        for stream in self._prefix:
            if self._pending_cr[stream]:
                self._pending_cr[stream] = False
            tail = self._decoders[stream].decode(b"", final=True)
            if tail and self._shown[stream] < LIVE_OUTPUT_CAP_BYTES:
                self._write(stream, tail)
            self._end_line(stream)
        self._out.flush()


def looks_binary(data: bytes) -> bool:
    """Bytes a terminal cannot show as text: not UTF-8, or holding NUL or other control bytes than
    tab, line feed, carriage return and form feed (what ``file`` and ``git`` call binary)."""
    sample = data[: 64 * 1024]
    if any(byte < 0x20 and byte not in b"\t\n\r\f" for byte in sample) or b"\x7f" in sample:
        return True
    try:
        sample.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start < len(sample) - 3  # a character cut by the sample's end is still text
    return False
