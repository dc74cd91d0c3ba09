"""Document extraction for ``read_document``: the text of a txt, md, csv, json, html or pdf file,
and the page of it a tool call returns."""

from __future__ import annotations

import io
from html.parser import HTMLParser
from typing import Any

from pydantic import BaseModel

from alphaagent.errors import ToolError

TEXT_SUFFIXES = (
    ".txt",
    ".md",
    ".csv",
    ".json",
    ".html",
    ".htm",
    ".tsv",
    ".py",
    ".log",
    ".xml",
    ".yaml",
    ".yml",
)
DEFAULT_PAGE_CHARS = 20_000
MAX_PAGE_CHARS = 200_000
MAX_DOCUMENT_BYTES = 25 * 2**20
"""read_document reads documents up to the connector cap (25 MiB): larger files are for code."""
MAX_PDF_PAGES = 500
DECODED_IN_CHILD = (".pdf",)
"""Compressed document types: ``read_document`` extracts them in the bounded child process of
``alphaagent.domain.decoding`` (a pdf's deflated streams can inflate to gigabytes)."""


class DocumentPage(BaseModel):
    """A page of a document's text: ``text`` starts at character ``offset``; ``total_chars`` is the
    document's full length, so the caller can page on with ``offset + len(text)``."""

    path: str
    offset: int
    text: str
    total_chars: int
    metadata: dict[str, Any]


def document_text(data: bytes, suffix: str) -> tuple[str, dict[str, Any]]:
    """The text of a document and its metadata (``type``; a pdf's ``pages`` and ``pages_read``), by
    its lower-case ``suffix``. Raises ``ToolError`` for a type that has no text (or pdf without pypdf)."""
    if suffix == ".pdf":
        try:
            from pypdf import PdfReader  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            raise ToolError("PDF documents need the coder's dependencies (pypdf) installed") from None
        reader = PdfReader(io.BytesIO(data))
        total = len(reader.pages)
        pages = [page.extract_text() or "" for page in reader.pages[:MAX_PDF_PAGES]]
        return "\n\f".join(pages), {"type": "pdf", "pages": total, "pages_read": len(pages)}
    if suffix in (".html", ".htm"):
        parts: list[str] = []

        class _Text(HTMLParser):
            def handle_data(self, chunk: str) -> None:
                parts.append(chunk)

        _Text().feed(data.decode("utf-8", "replace"))
        return "".join(parts), {"type": "html"}
    if suffix in TEXT_SUFFIXES or not suffix:
        return data.decode("utf-8", "replace"), {"type": suffix.lstrip(".") or "text"}
    raise ToolError(f"cannot read {suffix} documents as text; read txt, md, csv, json, html or pdf")
