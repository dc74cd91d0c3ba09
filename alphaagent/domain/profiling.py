"""Dataset profiling kept off the backend's hot path (issue 11, item 5).

``register_artifact`` describes a dataset (schema, row count, first rows). The backend's process
serves every conversation, so a large or compressed dataset is never parsed there:

- parquet is described from its footer: ``pyarrow.parquet.ParquetFile`` on a seekable file reads
  the last bytes (the footer) and, for the preview, the first batch of the first row group; the
  rest of the file is never read;
- a csv is parsed from its first ``MAX_CSV_SAMPLE_BYTES`` only (cut at the last whole line); its
  ``row_count`` is then absent and ``sampled_bytes`` says how much was read;
- a parquet or xlsx dataset of any size, and any dataset larger than ``IN_PROCESS_PROFILE_BYTES``,
  is profiled in the bounded decoding child (``alphaagent.domain.decoding``: 2 GiB, 30 s of CPU and
  of wall time): a few KB of parquet can decode to gigabytes (one value repeated by a run-length
  code) and a small xlsx to millions of cells, whatever their footer or zip directory says. A child
  that fails or runs out of a bound leaves the dataset registered without a profile, with the reason.

Example::

    with workspace.open_blob(sha256) as reader:
        metadata = profile_dataset(reader, size, ".parquet")
"""

from __future__ import annotations

from typing import Any, BinaryIO, Final

from alphaagent.domain.decoding import CHILD_TIMEOUT_S, decode_in_child
from alphaagent.errors import DecodeRefusedError

IN_PROCESS_PROFILE_BYTES: Final = 1 * 2**20
"""csv and json datasets up to 1 MiB are profiled in the calling process: a child interpreter
(~0.5 s to start with pandas) would cost more than the parse, and text decodes to its own size."""

ALWAYS_IN_CHILD: Final = (".parquet", ".xlsx")
"""Compressed formats: profiled in the child whatever their size (see the module docstring)."""

PROFILE_TIMEOUT_S: Final = CHILD_TIMEOUT_S
"""Wall time a profiling child may take before it is killed and the dataset registered unprofiled."""


def profile_dataset(reader: BinaryIO, size: int, suffix: str) -> dict[str, Any]:
    """The profile of the dataset ``reader`` holds (``size`` bytes, kind from ``suffix``), computed in
    this process when it is small text, else in the bounded decoding child (a reader without a
    descriptor, as S3's body, is spooled to a temporary file for it).

    Never raises for the dataset's content: a failure is ``{"profiled": False, "reason": ...}``."""
    from alphaagent.domain.artifacts import (
        MAX_CSV_SAMPLE_BYTES,
        MAX_DATASET_PROFILE_BYTES,
        MAX_PARQUET_PROFILE_BYTES,
        dataset_metadata,
    )

    if size <= IN_PROCESS_PROFILE_BYTES and suffix not in ALWAYS_IN_CHILD:
        return dataset_metadata(reader, suffix)
    # What the child reads at most: a reader without a descriptor is copied only that far.
    if suffix == ".parquet" and size > MAX_PARQUET_PROFILE_BYTES:
        return {"profiled": False, "reason": f"larger than {MAX_PARQUET_PROFILE_BYTES // 2**20} MiB"}
    spool = {".csv": MAX_CSV_SAMPLE_BYTES + 1, ".parquet": None}.get(suffix, MAX_DATASET_PROFILE_BYTES + 1)
    try:
        return decode_in_child("profile", reader, {"suffix": suffix}, spool_bytes=spool)
    except DecodeRefusedError as exc:
        return {"profiled": False, "reason": f"profiling: {exc}"[:500]}
