"""Dataset profiling kept off the backend's hot path (issue 11, item 5).

``register_artifact`` describes a dataset (schema, row count, first rows). The backend's process
serves every conversation, so a large dataset is never parsed there:

- parquet is described from its footer: ``pyarrow.parquet.ParquetFile`` on a seekable file reads
  the last bytes (the footer) and, for the preview, the first row group when the footer says it is
  small; the rest of the file is never read;
- a csv is parsed from its first ``MAX_CSV_SAMPLE_BYTES`` only (cut at the last whole line); its
  ``row_count`` is then absent and ``sampled_bytes`` says how much was read;
- a dataset larger than ``IN_PROCESS_PROFILE_BYTES`` is profiled in a child interpreter
  (``python -m alphaagent.domain.profiling``) that reads the blob through an inherited descriptor,
  under ``PROFILE_MEMORY_BYTES`` of address space and ``PROFILE_TIMEOUT_S`` of wall time; a child
  that fails or runs out of either leaves the dataset registered without a profile, with the reason.

Example::

    with workspace.open_blob(sha256) as reader:
        metadata = profile_dataset(reader, size, ".parquet")
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from typing import Any, BinaryIO, Final

IN_PROCESS_PROFILE_BYTES: Final = 1 * 2**20
"""Datasets up to 1 MiB are profiled in the calling process: a child interpreter (~0.5 s to start
with pandas) would cost more than the parse."""

PROFILE_TIMEOUT_S: Final = 30.0
"""Wall time a profiling child may take before it is killed and the dataset registered unprofiled."""

PROFILE_MEMORY_BYTES: Final = 2 * 2**30
"""RLIMIT_AS of the profiling child: pandas and pyarrow map ~600 MiB of address space at import."""


def profile_dataset(reader: BinaryIO, size: int, suffix: str) -> dict[str, Any]:
    """The profile of the dataset ``reader`` holds (``size`` bytes, kind from ``suffix``), computed in
    this process when small or when ``reader`` has no descriptor, else in a bounded child process.

    Never raises for the dataset's content: a failure is ``{"profiled": False, "reason": ...}``."""
    from alphaagent.domain.artifacts import dataset_metadata

    try:
        fd = reader.fileno()
    except (AttributeError, OSError, ValueError):
        fd = -1
    if size <= IN_PROCESS_PROFILE_BYTES or fd < 0:
        return dataset_metadata(reader, suffix)
    os.lseek(fd, 0, os.SEEK_SET)
    try:
        # Isolated (-I: no PYTHON* variables, no user site, not the working directory on sys.path)
        # and with an environment of its own: the file comes from untrusted code, and the backend's
        # environment holds credentials and the model key.
        done = subprocess.run(
            [sys.executable, "-I", "-m", "alphaagent.domain.profiling", str(fd), suffix],
            pass_fds=(fd,),
            env={"PATH": os.defpath, "LANG": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},
            cwd="/",
            capture_output=True,
            timeout=PROFILE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"profiled": False, "reason": f"profiling took more than {PROFILE_TIMEOUT_S:g} s"}
    except OSError as exc:
        return {"profiled": False, "reason": f"profiling could not start: {exc}"[:500]}
    if done.returncode != 0:
        tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        return {"profiled": False, "reason": f"profiling failed: {tail[0]}"[:500]}
    try:
        result: dict[str, Any] = json.loads(done.stdout)
    except ValueError:
        return {"profiled": False, "reason": "profiling failed: unreadable answer"}
    return result


def _main(argv: list[str]) -> int:
    """Child side: profile the file open at descriptor ``argv[0]`` as ``argv[1]``; print JSON."""
    resource.setrlimit(resource.RLIMIT_AS, (PROFILE_MEMORY_BYTES, PROFILE_MEMORY_BYTES))
    from alphaagent.domain.artifacts import dataset_metadata

    with os.fdopen(int(argv[0]), "rb") as reader:
        print(json.dumps(dataset_metadata(reader, argv[1]), default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
