"""Decoding untrusted compressed formats in a bounded child process (parquet, xlsx, pdf).

A few KB of parquet can decode to gigabytes (one dictionary value repeated by a run-length code, or
one huge string compressed to nothing); an xlsx is a zip of XML whose cells openpyxl expands; a pdf's
content streams are deflated. What a file's own header or footer says about its decoded size is the
writer's word, and a decoder allocates on the word of the bytes it reads next. So no check before
decoding bounds it: every decode of these formats that the backend does for a run's file (the
coder's table pages, ``read_document`` of a pdf, dataset profiling, whatever the file's size) runs
in a child interpreter, and the limits are the kernel's:

- ``python -I`` (no ``PYTHON*`` variables, no user site, not the working directory on ``sys.path``),
  an environment of its own (the backend's holds credentials and the model key), ``cwd="/"``;
- ``RLIMIT_AS`` ``CHILD_MEMORY_BYTES``, ``RLIMIT_CPU`` ``CHILD_CPU_S``, a wall clock of
  ``CHILD_TIMEOUT_S``, ``RLIMIT_FSIZE`` ``CHILD_ANSWER_BYTES`` on its answer (a file, so a runaway
  answer is cut by the kernel, never read into the backend), no core dumps;
- at most ``MAX_CHILDREN`` at once per backend process;
- the file is passed as an inherited descriptor (spooled to a temporary file first when the reader
  has none, as S3's streaming body); the child imports the same ``alphaagent`` as the parent.

A child that fails or runs out of any of them raises ``DecodeRefusedError`` with the reason; the
child costs ~0.3-0.6 s to start (pyarrow or pandas imports), paid only for these formats.

Example::

    with workspace.open_file(scope, "datasets/x.parquet") as reader:
        page = decode_in_child("parquet_page", reader, {"offset": 0, "limit": 50})
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, Final

import alphaagent
from alphaagent.domain.decode_server import ServerUnavailableError, shared_server
from alphaagent.errors import DecodeRefusedError

CHILD_MEMORY_BYTES: Final = 2 * 2**30
"""RLIMIT_AS of the decoding child: pandas and pyarrow map ~600 MiB of address space at import, so
2 GiB leaves ~1.4 GiB for what the file decodes to."""

CHILD_CPU_S: Final = 30
"""RLIMIT_CPU of the decoding child (seconds of CPU): a run of a billion repeated values takes
minutes to decode a page at a time; past this it is killed (SIGXCPU) and the reason said."""

CHILD_TIMEOUT_S: Final = 30.0
"""Wall time the decoding child may take before it is killed (the CPU bound alone would let a
child blocked on a full machine wait for ever)."""

CHILD_ANSWER_BYTES: Final = 16 * 2**20
"""The child's answer (JSON on its stdout, a file) is cut by RLIMIT_FSIZE at 16 MiB: a page of 500
rows of 50 clipped cells, or 200,000 characters of text, are far below it."""

MAX_CHILDREN: Final = 2
"""Decoding children of one backend process at a time: each may hold up to 2 GiB, so twenty tool
calls at once must not ask the machine for 40. A call waits up to ``CHILD_TIMEOUT_S`` for a turn,
then is refused as busy."""

_TURNS: Final = threading.BoundedSemaphore(MAX_CHILDREN)

MAX_CELL_CHARS: Final = 200
"""A cell of a page is clipped to this many characters in the child, before it is serialised."""

# A spawned child ends with os._exit: no interpreter shutdown after the answer (see
# decode_server._child for why).
_BOOT: Final = (
    "import os, sys; sys.path.insert(0, sys.argv[1]); from alphaagent.domain.decoding import _main;"
    " os._exit(_main(sys.argv[2:]))"
)
# The parent's own package root, so the child runs this code and not whatever else is installed.
_PACKAGE_ROOT: Final = str(Path(alphaagent.__file__).resolve().parent.parent)


def decode_in_child(
    job: str, source: BinaryIO | bytes, args: dict[str, Any], *, spool_bytes: int | None = None
) -> dict[str, Any]:
    """Run ``job`` (``profile``, ``parquet_page``, ``xlsx_page``, ``document_page``,
    ``viewer_page``) on the file ``source`` holds, in a bounded child process; its JSON answer.
    A reader that is not a regular file is copied to a temporary file for the child first: at most
    ``spool_bytes`` of it when given (what the job reads at most), else all of it.

    Raises:
        DecodeRefusedError: the child ran out of a bound or failed, or every decoder stayed busy;
            the message says which.
    """
    if not _TURNS.acquire(timeout=CHILD_TIMEOUT_S):
        raise DecodeRefusedError(f"every decoder was busy for {CHILD_TIMEOUT_S:g} s; try again")
    try:
        return _decode(job, source, args, spool_bytes)
    finally:
        _TURNS.release()


_CHILD_ENV: Final = {
    "PATH": os.defpath,
    "LANG": "C.UTF-8",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
}
"""The whole environment of the decoding children (the backend's holds credentials and the model key)."""


def _decode(
    job: str, source: BinaryIO | bytes, args: dict[str, Any], spool_bytes: int | None
) -> dict[str, Any]:
    with (
        tempfile.TemporaryFile() as answer,
        tempfile.TemporaryFile() as errors,
        _descriptor(source, spool_bytes) as fd,
    ):
        os.lseek(fd, 0, os.SEEK_SET)
        timeout_s = CHILD_TIMEOUT_S
        try:
            code, timed_out = _run_forked(job, args, fd, answer.fileno(), errors.fileno(), timeout_s)
        except ServerUnavailableError:
            for output in (answer, errors):  # what a child of a server that died wrote is not the answer
                output.seek(0)
                output.truncate()
            os.lseek(fd, 0, os.SEEK_SET)
            code, timed_out = _run_spawned(job, args, fd, answer, errors, timeout_s)
        except OSError as exc:
            raise DecodeRefusedError(f"the decoding process could not start: {exc}"[:500]) from None
        if timed_out:
            raise DecodeRefusedError(f"decoding took more than {timeout_s:g} s")
        if code != 0:
            errors.seek(max(os.fstat(errors.fileno()).st_size - 4096, 0))
            raise DecodeRefusedError(_failure(code, errors.read().decode("utf-8", "replace")))
        answer.seek(0)
        try:
            result: dict[str, Any] = json.loads(answer.read(CHILD_ANSWER_BYTES))
        except ValueError:
            raise DecodeRefusedError("decoding failed: unreadable answer") from None
    return result


def _run_forked(
    job: str, args: dict[str, Any], fd: int, answer_fd: int, errors_fd: int, timeout_s: float
) -> tuple[int, bool]:
    """The job in a fresh child forked from this process's decoding server (started on first use,
    ``alphaagent.domain.decode_server``): its exit code and whether it ran out of wall time."""
    server = shared_server(_PACKAGE_ROOT, _CHILD_ENV)
    return server.run(job, args, fd, answer_fd, errors_fd, timeout_s)


def _run_spawned(
    job: str, args: dict[str, Any], fd: int, answer: BinaryIO, errors: BinaryIO, timeout_s: float
) -> tuple[int, bool]:
    """The job in a new interpreter of its own (when no decoding server can run here): its exit
    code and whether it ran out of wall time."""
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-c", _BOOT, _PACKAGE_ROOT, job, str(fd), json.dumps(args)],
            pass_fds=(fd,),
            env=_CHILD_ENV,
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=answer,
            stderr=errors,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return -signal.SIGKILL, True
    except OSError as exc:
        raise DecodeRefusedError(f"the decoding process could not start: {exc}"[:500]) from None
    return done.returncode, False


def _failure(code: int, stderr: str) -> str:
    """The reason of a child's failure, from how it ended and the last line it wrote."""
    last = (stderr.strip().splitlines() or [""])[-1]
    if code == -signal.SIGXCPU:
        return f"decoding needed more than {CHILD_CPU_S} s of CPU"
    if code == -signal.SIGXFSZ:
        return f"decoding answered more than {CHILD_ANSWER_BYTES // 2**20} MiB"
    if "MemoryError" in last or "bad_alloc" in last or code == -signal.SIGABRT:
        return f"decoding needed more than {CHILD_MEMORY_BYTES // 2**30} GiB of memory"
    return f"decoding failed: {last or f'exit {code}'}"[:500]


@contextlib.contextmanager
def _descriptor(source: BinaryIO | bytes, limit: int | None) -> Iterator[int]:
    """The descriptor of ``source`` if it is a regular file, else of a temporary copy of (at most
    ``limit`` of) its bytes (a socket's descriptor is never handed on)."""
    fd = -1
    if not isinstance(source, bytes):
        with contextlib.suppress(AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
            fd = source.fileno() if stat.S_ISREG(os.fstat(source.fileno()).st_mode) else -1
    if fd >= 0:
        yield fd
        return
    with tempfile.TemporaryFile() as spool:
        if isinstance(source, bytes):
            spool.write(source[:limit])
        else:
            left = limit if limit is not None else -1
            while left:
                block = source.read(2**20 if left < 0 else min(left, 2**20))
                if not block:
                    break
                spool.write(block)
                left = left - len(block) if left > 0 else left
        spool.flush()
        yield spool.fileno()


# ----------------------------------------------------------------------------- the child's side


def _main(argv: list[str]) -> int:
    """Child side of a spawned decode: job ``argv[0]`` on the file open at descriptor ``argv[1]``
    with the JSON arguments ``argv[2]``."""
    return run_job(argv[0], int(argv[1]), json.loads(argv[2]))


def run_job(job: str, fd: int, args: dict[str, Any]) -> int:
    """In a decoding child: set the limits, run ``job`` on the file open at descriptor ``fd``, write
    the JSON answer on descriptor 1; the exit code (0). The limits come first, before any import a
    spawned child makes (a forked one has the server's imports already)."""
    for limit, value in (
        (resource.RLIMIT_AS, CHILD_MEMORY_BYTES),
        (resource.RLIMIT_CPU, CHILD_CPU_S),
        (resource.RLIMIT_FSIZE, CHILD_ANSWER_BYTES),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(limit, (value, value))
    with os.fdopen(fd, "rb") as reader:
        answer = _JOBS[job](reader, args)
    data = json.dumps(answer, default=str).encode()
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]
    return 0


def _clip(value: Any) -> Any:
    """A cell as JSON can carry it, at most ``MAX_CELL_CHARS`` characters of text."""
    if value is None or isinstance(value, bool | int | float):
        return value
    text = value if isinstance(value, str) else repr(value) if isinstance(value, bytes) else str(value)
    return text if len(text) <= MAX_CELL_CHARS else text[:MAX_CELL_CHARS] + "…"


def _profile(reader: BinaryIO, args: dict[str, Any]) -> dict[str, Any]:
    from alphaagent.domain.artifacts import dataset_metadata

    return dataset_metadata(reader, str(args["suffix"]))


def _parquet_page(reader: BinaryIO, args: dict[str, Any]) -> dict[str, Any]:
    """Rows ``[offset, offset + limit]`` (one more than asked, to tell whether there are more) of
    the first ``max_columns`` columns. Whole row groups before ``offset`` are skipped by the
    footer's row counts (never decoded); within a group, a batch of at most ``limit + 1`` rows is
    decoded at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    offset, limit, max_columns = int(args["offset"]), int(args["limit"]), int(args["max_columns"])
    parquet = pq.ParquetFile(reader, pre_buffer=False)
    meta = parquet.metadata
    columns = parquet.schema_arrow.names[:max_columns]
    rows: list[list[Any]] = []
    start = 0
    for group in range(meta.num_row_groups):
        count = meta.row_group(group).num_rows
        if start + count <= offset:
            start += count
            continue
        for batch in parquet.iter_batches(batch_size=limit + 1, row_groups=[group], columns=columns):
            skip = max(offset - start, 0)
            start += batch.num_rows
            if skip >= batch.num_rows:
                continue
            for row in batch.slice(skip, limit + 1 - len(rows)).to_pylist():
                rows.append([_clip(row.get(name)) for name in columns])
            if len(rows) > limit:
                break
        if len(rows) > limit:
            break
    return {"columns": columns, "rows": rows, "total_rows": int(meta.num_rows)}


def _xlsx_page(reader: BinaryIO, args: dict[str, Any]) -> dict[str, Any]:
    """Rows ``[offset, offset + limit]`` of the first sheet, first ``max_columns`` columns."""
    import pandas as pd

    offset, limit, max_columns = int(args["offset"]), int(args["limit"]), int(args["max_columns"])
    frame = pd.read_excel(io.BytesIO(reader.read()), skiprows=range(1, offset + 1), nrows=limit + 1)
    frame = frame.iloc[:, :max_columns]
    split = json.loads(frame.to_json(orient="split", date_format="iso", index=False))
    rows = [[_clip(value) for value in row] for row in split["data"]]
    return {"columns": [_clip(str(c)) for c in split["columns"]], "rows": rows, "total_rows": None}


def _document_page(reader: BinaryIO, args: dict[str, Any]) -> dict[str, Any]:
    """Characters ``[offset, offset + limit)`` of a document's text, its length and metadata."""
    from alphaagent.domain.documents import document_text

    text, metadata = document_text(reader.read(), str(args["suffix"]))
    offset, limit = int(args["offset"]), int(args["limit"])
    return {"text": text[offset : offset + limit], "total_chars": len(text), "metadata": metadata}


def _viewer_page(reader: BinaryIO, args: dict[str, Any]) -> dict[str, Any]:
    """The viewer's page of a dataset (``alphaagent.viewer.preview.decoded_page``) as its fields."""
    import dataclasses

    from alphaagent.viewer.preview import decoded_page

    page = decoded_page(reader.read(), str(args["suffix"]), int(args["page"]), int(args["page_rows"]))
    return dataclasses.asdict(page)


_JOBS: Final = {
    "viewer_page": _viewer_page,
    "profile": _profile,
    "parquet_page": _parquet_page,
    "xlsx_page": _xlsx_page,
    "document_page": _document_page,
}
