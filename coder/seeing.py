"""What the coder sees of its own outputs (issue 17, items 1 and 2): charts as pictures, datasets as
data, and tables page by page.

Every byte here was written by untrusted code, so everything is bounded before it is decoded:

- **Pictures**: at most ``MAX_IMAGES`` per tool result, each downscaled to ``MAX_SIDE`` px on its
  longest side, all together at most ``MAX_IMAGE_BYTES`` of encoded image (base64 adds a third on
  the wire). A file over ``MAX_CHART_FILE_BYTES`` or a picture over ``MAX_DECODE_PIXELS`` is never
  decoded (a 10,000 x 10,000 PNG would need 400 MB of RAM): it is named with the reason instead. SVG
  is named, not rasterised (no well-kept rasteriser is a dependency of the coder).
- **Profiles**: the registered version's stored profile (``alphaagent.domain.artifacts``), rendered
  to at most ``MAX_PROFILE_CHARS`` characters whatever the width of the table.
- **Table pages**: csv, parquet and xlsx read ``limit`` rows from row ``offset``; a csv line (the
  header or a row) over ``MAX_HEADER_BYTES`` is refused before pandas sees it, a page parses at
  most ``MAX_CSV_PAGE_BYTES`` of rows, and the rows before ``offset`` are skipped by counting
  newlines a block at a time (an offset past the end answers after one pass, with the row count);
  parquet and xlsx are decoded in the bounded child of ``alphaagent.domain.decoding`` (2 GiB,
  30 s: a few KB of parquet can decode to gigabytes, and the footer's sizes are the writer's
  word), one page-sized batch at a time, whole row groups before the offset skipped by the
  footer's row counts; a file over ``MAX_TABLE_FILE_BYTES`` is refused.
"""

from __future__ import annotations

import base64
import io
import json
import warnings
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from alphaagent.domain.artifacts import MAX_XLSX_UNPACKED_BYTES
from alphaagent.domain.decoding import decode_in_child
from alphaagent.domain.tools import TurnContext
from alphaagent.errors import DecodeRefusedError, ToolError
from alphaagent.sandbox.session import is_session_state

MAX_IMAGES = 3
MAX_SIDE = 1024
MAX_IMAGE_BYTES = 1_100_000
"""Encoded bytes of all pictures of one result (~1.5 MB once base64-encoded): twenty runs with a
chart each stay within a fraction of the model's context."""
MAX_CHART_FILE_BYTES = 32 * 2**20
MAX_DECODE_PIXELS = 40_000_000
"""Pixels decoded at most (160 MB as RGBA): matplotlib at 300 dpi on a 20 x 20 inch figure is
36 Mpx; beyond that the picture is named, not decoded."""
PICTURE_SUFFIXES = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG"}

MAX_PROFILE_CHARS = 6_000
MAX_PROFILE_COLUMNS_SHOWN = 60
MAX_CELL_CHARS = 60

TABLE_SUFFIXES = (".csv", ".parquet", ".xlsx")
DEFAULT_TABLE_ROWS = 50
MAX_TABLE_ROWS = 500
MAX_HEADER_BYTES = 1 * 2**20
MAX_TABLE_FILE_BYTES = 512 * 2**20
MAX_XLSX_BYTES = 32 * 2**20
MAX_XLSX_ROWS = 1_048_576
"""Rows of an Excel sheet (the format's own limit)."""
MAX_TABLE_COLUMNS = 50
MAX_CSV_PAGE_BYTES = 4 * 2**20
"""Bytes of csv rows one page parses at most: 500 rows of 1 MiB each would be 500 MiB for pandas;
past the budget the page ends early and ``next_offset`` says where the next one starts."""
CSV_BLOCK_BYTES = 1 * 2**20
"""A csv is read in blocks of 1 MiB (rows before the page are skipped by counting newlines)."""


@dataclass(frozen=True)
class Pictures:
    """Image content blocks for the model, and one line per chart about what was shown or why not."""

    blocks: list[dict[str, Any]]
    notes: list[str]


def _picture(data: bytes, fmt: str) -> tuple[bytes, str, str] | str:
    """``(encoded, mime type, size note)`` of ``data`` downscaled, or the reason it is not shown."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            # Pillow warns past 89 Mpx; the bound below is ours and smaller.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            opened = Image.open(io.BytesIO(data), formats=[fmt])  # reads the header only
        with opened as image:
            width, height = image.size
            if width * height > MAX_DECODE_PIXELS:
                return (
                    f"{width} x {height} px is over the {MAX_DECODE_PIXELS // 1_000_000} Mpx this tool"
                    " decodes; save it smaller (a lower dpi or figsize) to see it"
                )
            if image.format == "JPEG":
                image.draft("RGB", (MAX_SIDE, MAX_SIDE))  # decode at a reduced scale directly
            image.thumbnail((MAX_SIDE, MAX_SIDE))
            shown = image.convert("RGBA" if image.mode in ("RGBA", "LA", "P") else "RGB")
    except Image.DecompressionBombError:
        return f"over the {MAX_DECODE_PIXELS // 1_000_000} Mpx this tool decodes; save it smaller to see it"
    except Exception as exc:
        # Any failure to decode what a run wrote is the picture's, never the tool call's (Pillow
        # raises SyntaxError for a broken PNG chunk, struct.error for a short one...).
        return f"not a readable {fmt.lower()} ({type(exc).__name__})"
    out = io.BytesIO()
    shown.save(out, format="PNG", optimize=True)
    mime = "image/png"
    if out.tell() > MAX_IMAGE_BYTES // 2:  # a photo-like chart: JPEG is far smaller
        out = io.BytesIO()
        shown.convert("RGB").save(out, format="JPEG", quality=80)
        mime = "image/jpeg"
    note = f"{width} x {height} px" + (
        f", shown at {shown.width} x {shown.height}" if (shown.width, shown.height) != (width, height) else ""
    )
    return out.getvalue(), mime, note


def chart_pictures(ctx: TurnContext, paths: list[str]) -> Pictures:
    """The pictures of the charts among ``paths`` (workspace-relative), within the bounds above."""
    blocks: list[dict[str, Any]] = []
    notes: list[str] = []
    budget = MAX_IMAGE_BYTES
    for path in paths:
        suffix = PurePosixPath(path).suffix.lower()
        if not path.startswith("charts/") or suffix not in (*PICTURE_SUFFIXES, ".svg"):
            continue
        if suffix == ".svg":
            notes.append(f"{path}: an SVG, not shown as a picture (save a png beside it to see it)")
            continue
        if len(blocks) == MAX_IMAGES:
            notes.append(f"{path}: not shown (at most {MAX_IMAGES} pictures per result)")
            continue
        info = ctx.backend.workspace.stat(ctx.scope, path)
        if info is None:
            continue
        if info.size_bytes > MAX_CHART_FILE_BYTES:
            notes.append(
                f"{path}: {info.size_bytes:,} bytes, over {MAX_CHART_FILE_BYTES // 2**20} MiB; not shown"
            )
            continue
        shown = _picture(ctx.backend.workspace.read_bytes(ctx.scope, path), PICTURE_SUFFIXES[suffix])
        if isinstance(shown, str):
            notes.append(f"{path}: {shown}")
            continue
        encoded, mime, size = shown
        if len(encoded) > budget:
            notes.append(
                f"{path}: not shown (this result's {MAX_IMAGE_BYTES:,}-byte picture budget is spent)"
            )
            continue
        budget -= len(encoded)
        blocks.append({"type": "image", "data": base64.b64encode(encoded).decode(), "mimeType": mime})
        notes.append(f"{path}: shown below ({size})")
    return Pictures(blocks, notes)


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):  # None and NaN
        return "null"
    text = str(value).replace("\n", " ").replace("|", "/")
    return text if len(text) <= MAX_CELL_CHARS else text[: MAX_CELL_CHARS - 1] + "…"


def render_profile(metadata: dict[str, Any]) -> str:
    """A dataset's stored profile as text: row count, columns with types (and nulls where known),
    and the first rows; at most ``MAX_PROFILE_CHARS`` characters."""
    if not metadata.get("profiled"):
        return f"profile: not profiled ({metadata.get('reason', 'no reason recorded')})"
    schema: dict[str, str] = metadata.get("schema", {})
    nulls: dict[str, int] = metadata.get("nulls", {})
    columns = list(schema)[:MAX_PROFILE_COLUMNS_SHOWN]
    more = len(schema) - len(columns)
    lines = [
        f"profile: {metadata.get('row_count', '?')} rows, {len(schema)} columns"
        + (" (at least; the stored profile keeps the first 200)" if len(schema) >= 200 else "")
    ]
    described = [f"{_cell(c)}: {schema[c]}" + (f", {nulls[c]} null" if nulls.get(c) else "") for c in columns]
    lines.append("columns: " + "; ".join(described) + (f"; ... {more} more" if more else ""))
    preview = metadata.get("preview") or []
    if preview:
        lines.append("first rows:")
        lines.append("| " + " | ".join(_cell(c) for c in columns[:MAX_TABLE_COLUMNS]) + " |")
        for row in preview:
            lines.append("| " + " | ".join(_cell(row.get(c, "")) for c in columns[:MAX_TABLE_COLUMNS]) + " |")
    text = "\n".join(lines)
    if len(text) > MAX_PROFILE_CHARS:
        text = text[: MAX_PROFILE_CHARS - 40] + "\n[... profile cut at 6,000 characters]"
    return text


class _Lines:
    """Lines of a binary stream read a block at a time (any reader: a file, S3's body). ``skip``
    counts newlines with ``bytes.count`` (memory speed: 512 MiB in well under a second), never a
    Python call per line, so an offset of a billion costs one pass over the file at most."""

    def __init__(self, raw: Any) -> None:
        self.raw, self.buffer, self.eof = raw, b"", False

    def _fill(self) -> None:
        block: bytes = self.raw.read(CSV_BLOCK_BYTES)
        self.eof = not block
        self.buffer += block

    def readline(self, cap: int) -> bytes:
        """The next line with its newline, or its first ``cap`` bytes; b"" at the end."""
        while True:
            end = self.buffer.find(b"\n", 0, cap)
            if end >= 0 or len(self.buffer) >= cap or self.eof:
                cut = end + 1 if end >= 0 else cap
                line, self.buffer = self.buffer[:cut], self.buffer[cut:]
                return line
            self._fill()

    def skip(self, count: int) -> int:
        """Skip ``count`` lines; how many there were (fewer at the end of the stream)."""
        skipped = 0
        while skipped < count:
            newlines = self.buffer.count(b"\n")
            if skipped + newlines >= count:
                self.buffer = self.buffer.split(b"\n", count - skipped)[-1]
                return count
            skipped += newlines
            if self.eof:
                return skipped + (1 if self.buffer else 0)  # a last line without its newline
            self.buffer = self.buffer[self.buffer.rfind(b"\n") + 1 :]
            self._fill()
        return skipped


def _csv_page(ctx: TurnContext, path: str, offset: int, limit: int) -> tuple[Any, int | None, int]:
    import pandas as pd

    def line(lines: _Lines, what: str) -> bytes:
        # Every line is read with a cap: a row of a million fields must not reach pandas.
        text = lines.readline(MAX_HEADER_BYTES + 1)
        if len(text) > MAX_HEADER_BYTES and not text.endswith(b"\n"):
            raise ToolError(
                f"path {path!r}: {what} is over {MAX_HEADER_BYTES // 2**20} MiB; read it with code in"
                " run_in_env (e.g. pandas.read_csv(usecols=...))"
            )
        return text

    total: int | None = None
    shown = limit
    with ctx.backend.workspace.open_file(ctx.scope, path) as raw:
        lines = _Lines(raw)
        header = line(lines, "its header line")
        skipped = lines.skip(offset)  # rows before the page are counted, never parsed
        rows: list[bytes] = []
        size = 0
        if skipped < offset:
            total = skipped  # the file ended before the offset: its row count is known now
        for number in range(offset, offset + limit + 1) if total is None else ():
            text = line(lines, f"row {number}")
            if not text:
                total = number
                break
            rows.append(text)
            size += len(text)
            if size > MAX_CSV_PAGE_BYTES and len(rows) > 1:
                shown = len(rows) - 1  # the page ends before the row that passed the budget
                break
    columns = pd.read_csv(io.BytesIO(header)).columns[:MAX_TABLE_COLUMNS]
    body = b"".join(rows)
    if not body.strip():
        return pd.DataFrame(columns=list(columns)), total, shown
    frame = pd.read_csv(
        io.BytesIO(body),
        header=None,
        usecols=range(min(len(columns), body.split(b"\n", 1)[0].count(b",") + 1)),
    )
    frame.columns = list(columns)[: frame.shape[1]]
    return frame, total, shown


def _decoded_page(
    job: str, ctx: TurnContext, path: str, offset: int, limit: int
) -> tuple[Any, int | None, int]:
    """A page of a compressed table, decoded in the bounded child (``alphaagent.domain.decoding``):
    a few KB of parquet can decode to gigabytes (a dictionary value repeated by a run-length code, a
    huge string compressed to nothing) whatever its footer says, so no check here bounds it."""
    import pandas as pd

    with ctx.backend.workspace.open_file(ctx.scope, path) as raw:
        page = decode_in_child(job, raw, {"offset": offset, "limit": limit, "max_columns": MAX_TABLE_COLUMNS})
    frame = (
        pd.DataFrame(page["rows"], columns=page["columns"])
        if page["rows"]
        else pd.DataFrame(columns=page["columns"])
    )
    total = page.get("total_rows")
    return frame, None if total is None else int(total), limit


def _parquet_page(ctx: TurnContext, path: str, offset: int, limit: int) -> tuple[Any, int | None, int]:
    return _decoded_page("parquet_page", ctx, path, offset, limit)


def _xlsx_page(ctx: TurnContext, path: str, offset: int, limit: int) -> tuple[Any, int | None, int]:
    import zipfile

    info = ctx.backend.workspace.stat(ctx.scope, path)
    if info is not None and info.size_bytes > MAX_XLSX_BYTES:
        raise ToolError(f"path {path!r}: over {MAX_XLSX_BYTES // 2**20} MiB; read it with code in run_in_env")
    if offset > MAX_XLSX_ROWS:  # pandas turns skiprows into a set of that size
        raise ToolError(f"offset: an xlsx sheet has at most {MAX_XLSX_ROWS:,} rows")
    with ctx.backend.workspace.open_file(ctx.scope, path) as raw:
        # The zip's directory, read without unpacking: a quick, clear refusal of the obvious bomb
        # (the child's bounds hold whatever the directory says).
        unpacked = sum(entry.file_size for entry in zipfile.ZipFile(io.BytesIO(raw.read())).infolist())
    if unpacked > MAX_XLSX_UNPACKED_BYTES:
        raise ToolError(f"path {path!r}: unpacks to {unpacked:,} bytes; read it with code in run_in_env")
    return _decoded_page("xlsx_page", ctx, path, offset, limit)


def read_table(ctx: TurnContext, path: str, offset: int, limit: int) -> str:
    """One page of a csv, parquet or xlsx file of the scope as a table: a JSON line (path, offset,
    rows, next_offset, total_rows where the format says it cheaply), then the rows."""
    if not 0 < limit <= MAX_TABLE_ROWS:
        raise ToolError(f"limit: for a table, between 1 and {MAX_TABLE_ROWS} rows")
    suffix = PurePosixPath(path).suffix.lower()
    reader = {".csv": _csv_page, ".parquet": _parquet_page, ".xlsx": _xlsx_page}[suffix]
    info = None if is_session_state(path) else ctx.backend.workspace.stat(ctx.scope, path)
    if info is None:  # the sessions' state is platform-owned: answered as a missing file is
        raise ToolError(f"path {path!r}: no such document in this scope")
    if info.size_bytes > MAX_TABLE_FILE_BYTES:
        raise ToolError(
            f"path {path!r}: {info.size_bytes:,} bytes, over the {MAX_TABLE_FILE_BYTES // 2**20} MiB this"
            " tool pages through; read it with code in run_in_env"
        )
    try:
        frame, total, shown = reader(ctx, path, offset, limit)
    except DecodeRefusedError as exc:
        raise ToolError(
            f"path {path!r}: cannot be read as a table ({exc}); read it with code in run_in_env"
        ) from None
    except ToolError:
        raise
    except Exception as exc:  # a file the reader cannot parse is the model's to fix, with the reason
        raise ToolError(
            f"path {path!r}: cannot be read as a table ({type(exc).__name__}: {exc})"[:500]
        ) from None
    more = len(frame) > shown  # ``shown``: ``limit``, or fewer rows when a csv page's bytes ran out
    frame = frame.iloc[:shown]
    header = {
        "path": path,
        "offset": offset,
        "rows": len(frame),
        "next_offset": offset + shown if more else None,
        "total_rows": total,
        "columns": [str(c) for c in frame.columns],
    }
    lines = [json.dumps(header, ensure_ascii=False, default=str)]
    lines.append("| " + " | ".join(_cell(c) for c in frame.columns) + " |")
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    return "\n".join(lines)
