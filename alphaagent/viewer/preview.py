"""What the viewer shows of user content: dataset pages, rendered reports, image types.

Every byte here was written by untrusted code. Parquet and xlsx are decoded only in the bounded
child of ``alphaagent.domain.decoding`` (``DECODED_IN_CHILD``); what is read in the viewer's own
process is bounded the way artifact registration bounds its profile (``alphaagent.domain.artifacts``):
csv, json and xlsx are parsed only up to ``MAX_DATASET_PROFILE_BYTES``, an xlsx only if its zip
directory says it unpacks to at most ``MAX_XLSX_UNPACKED_BYTES``, a parquet row group is read only if
its footer says it decompresses to at most ``MAX_PARQUET_PREVIEW_GROUP_BYTES``. A table shows at most
``MAX_PROFILE_COLUMNS`` columns of cells clipped to ``MAX_CELL_CHARS``. A file that cannot be shown
gets a one-line reason instead of a table, never an error page.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import posixpath
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import quote, urlsplit

from alphaagent.domain.artifacts import (
    MAX_DATASET_PROFILE_BYTES,
    MAX_PARQUET_PREVIEW_GROUP_BYTES,
    MAX_PROFILE_COLUMNS,
    MAX_XLSX_UNPACKED_BYTES,
)

PAGE_ROWS: Final = 50
"""Rows of a dataset page."""

MAX_CELL_CHARS: Final = 500
"""A cell longer than this is shown cut, ending in an ellipsis."""

MAX_REPORT_BYTES: Final = 2 * 2**20
"""A Markdown or text report larger than this (UTF-8 bytes) is offered as a download only: rendering
is linear, but a page of megabytes is not a page anyone reads."""

RASTER_TYPES: Final = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)
"""Image types shown inline, recognised by their magic bytes (never by the file's name): formats
that carry no script. SVG is not one of them: it is XML that may hold script."""


@dataclass
class TablePage:
    """One page of a dataset: header, rows of display strings, and where the page is.

    ``total_rows`` is None when it is unknown; ``note`` explains a table that could not be read or
    was cut (more columns than shown)."""

    columns: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    page: int = 1
    page_rows: int = PAGE_ROWS
    total_rows: int | None = None
    note: str | None = None

    @property
    def pages(self) -> int | None:
        """How many pages there are, if the row count is known."""
        if self.total_rows is None:
            return None
        return max(1, -(-self.total_rows // self.page_rows))

    @property
    def has_next(self) -> bool:
        """True when a next page exists (or might, when the count is unknown and this page is full)."""
        if self.total_rows is None:
            return len(self.rows) == self.page_rows
        return self.page * self.page_rows < self.total_rows


def raster_type(data: bytes) -> str | None:
    """The MIME type of a PNG, JPEG or GIF image by its magic bytes, else None."""
    for magic, mime in RASTER_TYPES:
        if data.startswith(magic):
            return mime
    return None


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= MAX_CELL_CHARS else text[: MAX_CELL_CHARS - 1] + "…"


def _fit(columns: list[Any], rows: Iterable[Iterable[Any]], page: TablePage) -> TablePage:
    shown = min(len(columns), MAX_PROFILE_COLUMNS)
    page.columns = [_cell(c) for c in columns[:shown]]
    page.rows = [[_cell(v) for v in itertools.islice(row, shown)] for row in rows]
    if len(columns) > shown:
        page.note = f"showing the first {shown} of {len(columns)} columns"
    return page


DECODED_IN_CHILD: Final = (".parquet", ".xlsx")
"""Compressed datasets, paged in the bounded child of ``alphaagent.domain.decoding`` (2 GiB, 30 s):
742 bytes of parquet can decode to 4 GB whatever its footer says, and openpyxl pads every row of a
sparse sheet to its widest column (one cell at column XFD makes each row 16,384 cells)."""


def dataset_page(data: bytes, suffix: str, page: int = 1, page_rows: int = PAGE_ROWS) -> TablePage:
    """Page ``page`` (from 1) of a dataset file's rows, ``page_rows`` at a time.

    ``suffix`` is the file's lower-case suffix: ``.csv`` (UTF-8, invalid bytes shown as U+FFFD; the
    first row is the header), ``.json`` (a list of objects), ``.parquet`` or ``.xlsx`` (the first
    sheet; the first row is the header; both decoded in the bounded child, ``DECODED_IN_CHILD``).
    Anything else, or a file over a bound of the module docstring, is a page with a ``note`` and no
    rows.
    """
    if suffix not in DECODED_IN_CHILD:
        return decoded_page(data, suffix, page, page_rows)
    from alphaagent.domain.decoding import decode_in_child
    from alphaagent.errors import DecodeRefusedError

    try:
        answer = decode_in_child(
            "viewer_page", data, {"suffix": suffix, "page": page, "page_rows": page_rows}
        )
    except DecodeRefusedError as exc:
        return TablePage(page=max(1, page), page_rows=page_rows, note=f"not previewed: {exc}"[:300])
    return TablePage(**answer)


def decoded_page(data: bytes, suffix: str, page: int = 1, page_rows: int = PAGE_ROWS) -> TablePage:
    """``dataset_page`` decoded in this process: for text formats, and in the decoding child."""
    page = max(1, page)
    result = TablePage(page=page, page_rows=page_rows)
    start = (page - 1) * page_rows
    try:
        if suffix == ".parquet":
            return _parquet_page(data, start, result)
        if len(data) > MAX_DATASET_PROFILE_BYTES:
            result.note = f"not previewed: larger than {MAX_DATASET_PROFILE_BYTES // 2**20} MiB (download it)"
            return result
        if suffix == ".csv":
            return _csv_page(data, start, result)
        if suffix == ".json":
            return _json_page(data, start, result)
        if suffix == ".xlsx":
            return _xlsx_page(data, start, result)
    except MemoryError:  # in the decoding child: its address-space bound
        result.columns, result.rows = [], []
        result.note = "not previewed: decoding it needs more memory than allowed (download it)"
        return result
    except Exception as exc:  # untrusted bytes: any parser failure is a reason shown, not a crash
        result.columns, result.rows = [], []
        result.note = f"not previewed: {type(exc).__name__}: {exc}"[:300]
        return result
    result.note = f"no preview for {suffix or 'files without a suffix'}"
    return result


def _csv_page(data: bytes, start: int, page: TablePage) -> TablePage:
    reader = csv.reader(io.StringIO(data.decode("utf-8", "replace"), newline=""))
    header = next(reader, [])
    rows = list(itertools.islice(reader, start, start + page.page_rows))
    page.total_rows = start + len(rows) + sum(1 for _ in reader)
    return _fit(header, rows, page)


def _json_page(data: bytes, start: int, page: TablePage) -> TablePage:
    document = json.loads(data.decode("utf-8", "replace"))
    if not isinstance(document, list) or not all(isinstance(r, dict) for r in document):
        page.note = "not previewed: the JSON is not a list of objects"
        return page
    columns: dict[str, None] = {}
    for record in document:
        for key in record:
            columns.setdefault(str(key), None)
    names = list(columns)
    chunk = document[start : start + page.page_rows]
    page.total_rows = len(document)
    return _fit(names, ([record.get(name) for name in names] for record in chunk), page)


def _xlsx_page(data: bytes, start: int, page: TablePage) -> TablePage:
    unpacked = sum(entry.file_size for entry in zipfile.ZipFile(io.BytesIO(data)).infolist())
    if unpacked > MAX_XLSX_UNPACKED_BYTES:  # sizes from the zip's directory: nothing unpacked yet
        page.note = (
            f"not previewed: unpacks to more than {MAX_XLSX_UNPACKED_BYTES // 2**20} MiB (download it)"
        )
        return page
    import openpyxl

    book = openpyxl.load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    try:
        sheet = book.worksheets[0]
        values: Iterator[tuple[Any, ...]] = sheet.iter_rows(values_only=True)
        header = list(next(values, ()))
        rows = list(itertools.islice(values, start, start + page.page_rows))
        page.total_rows = start + len(rows) + sum(1 for _ in values)
        return _fit(header, rows, page)
    finally:
        book.close()


def _parquet_page(data: bytes, start: int, page: TablePage) -> TablePage:
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(io.BytesIO(data))
    meta = parquet.metadata
    page.total_rows = meta.num_rows
    names = parquet.schema_arrow.names
    columns = names[:MAX_PROFILE_COLUMNS]
    rows: list[list[Any]] = []
    first = 0
    for group in range(meta.num_row_groups):
        info = meta.row_group(group)
        end = first + info.num_rows
        if end > start and len(rows) < page.page_rows:
            if info.total_byte_size > MAX_PARQUET_PREVIEW_GROUP_BYTES:  # decompressed size, from the footer
                page.note = "not previewed: a row group decompresses to more than 256 MiB (download it)"
                return page
            table = parquet.read_row_group(group, columns=columns)
            offset = max(0, start - first)
            wanted = page.page_rows - len(rows)
            for record in table.slice(offset, wanted).to_pylist():
                rows.append([record.get(name) for name in columns])
        first = end
    return _fit(names, rows, page)


def render_markdown(text: str, resolve_image: Callable[[str], str | None]) -> str:
    """A Markdown report as sanitised HTML: markdown-it-py (CommonMark with tables) renders it, raw
    HTML included, and nh3 keeps only its safe tags and attributes (no script, no event handler, no
    style, no ``javascript:``). ``resolve_image`` maps an image's ``src`` as written to a URL of the
    viewer, or None to drop it (the page's CSP would refuse any other origin anyway)."""
    import nh3
    from markdown_it import MarkdownIt

    html = MarkdownIt("commonmark", {"html": True}).enable("table").render(text)

    def attribute(element: str, name: str, value: str) -> str | None:
        if element == "img" and name == "src":
            return resolve_image(value)
        return value

    return nh3.clean(html, attribute_filter=attribute, link_rel="noopener noreferrer nofollow")


IMAGE_SUFFIXES: Final = (".png", ".jpg", ".jpeg", ".gif")
"""What a report's image may name: a raster image file (the bytes are checked again when served)."""


def report_image_resolver(report_path: str, file_url: Callable[[str], str]) -> Callable[[str], str | None]:
    """How a report's relative image paths (``../charts/x.png``, from the report's folder) become
    viewer URLs of the same scope's files; absolute URLs, paths out of the scope and names that are
    not raster images are dropped."""
    folder = posixpath.dirname(report_path)

    def resolve(src: str) -> str | None:
        parts = urlsplit(src)
        if parts.scheme or parts.netloc or src.startswith("/") or not parts.path:
            return None
        path = posixpath.normpath(posixpath.join(folder, parts.path))
        if path.startswith("../") or path in ("..", ".") or not path.lower().endswith(IMAGE_SUFFIXES):
            return None
        return file_url(path)

    return resolve


def url_path(path: str) -> str:
    """A workspace path as a URL path, every character that means something in a URL escaped."""
    return quote(path, safe="/")
