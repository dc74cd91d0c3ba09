"""Artifact registration (issue 3 §9): a regular file inside the scope that fits its kind becomes an
immutable, content-addressed version."""

from __future__ import annotations

import difflib
import io
import json
import zipfile
from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import Any, BinaryIO, Final
from urllib.parse import unquote

from alphaagent.domain.profiling import profile_dataset
from alphaagent.errors import ArtifactError, InvalidSpecError, PathRuleError
from alphaagent.ids import new_ulid
from alphaagent.models.common import ARTIFACT_FOLDERS as ARTIFACT_FOLDERS  # re-exported, as before
from alphaagent.models.common import KIND_SUFFIXES as KIND_SUFFIXES  # re-exported, as before
from alphaagent.models.common import (
    ArtifactKind,
    Scope,
    check_workspace_path,
    utcnow,
)
from alphaagent.models.records import ArtifactVersion
from alphaagent.models.spec import SpecOutput
from alphaagent.ports import Store, Workspace
from alphaagent.sandbox.session import is_session_state
from alphaagent.wording import shown_json

KIND_FOLDERS: dict[str, str] = {"dataset": "datasets", "chart": "charts", "report": "reports"}
PREVIEW_ROWS = 5
MAX_DATASET_PROFILE_BYTES = 32 * 2**20
"""csv/json/xlsx datasets larger than this are registered without schema, row count or preview:
parsing them whole in the backend's process would cost it ~10x their size in memory."""
MAX_XLSX_UNPACKED_BYTES = 4 * 2**20
"""An xlsx (a zip of XML) whose entries unpack to more than this is registered without a profile:
a 50 KB file can hold 200,000 rows, which took openpyxl 15 s and 190 MiB in the backend's process
(a decompression bomb by another name). 4 MiB of sheet XML is some tens of thousands of cells."""
MAX_PARQUET_PROFILE_BYTES = 256 * 2**20
"""Parquet is described from its footer, but the blob is still read into memory to find it."""
MAX_PARQUET_PREVIEW_GROUP_BYTES = 256 * 2**20
"""A parquet preview decompresses the first row group: only when its footer says it is this small."""
MAX_CSV_SAMPLE_BYTES = 4 * 2**20
"""A csv is parsed from its first 4 MiB only (cut at the last whole line): enough for the schema
and the preview, bounded whatever the file's size; the row count is then not known."""
MAX_PROFILE_COLUMNS = 200
MAX_PREVIEW_CELL_CHARS = 200


def artifact_name_for(path: str) -> str:
    """A default artifact name from a file name: lower case, other characters as '-'."""
    stem = PurePosixPath(path).stem.lower()
    cleaned = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in stem).strip("._-")
    return (cleaned or "artifact")[:64]


MAX_MATCH_CANDIDATES: Final = 10_000
"""Files compared when suggesting a closest match (the first ones, in path order): bounded work."""


def closest_file(path: str, existing: list[str]) -> str | None:
    """The existing file ``path`` most likely meant, for a "missing file" error, or None: only a
    file that is really close is offered (new-user review: a whole-path similarity offered an
    unrelated file of the same folder). Close means, in this order of preference:

    - the same file name in another folder (``work/out/report.pdf`` for ``reports/report.pdf``;
      the nearest path among several);
    - a file of the same suffix whose stem is a few edits away (``nearest_name``:
      ``charts/revenu.png`` for ``charts/revenue.png``; not ``charts/b.png`` for ``charts/a.png``),
      or the same stem with another suffix (``reports/summary.txt`` for ``reports/summary.md``);
      the fewest edits first, then the same folder.

    Both backends answer with this one function (``check_artifact_path``)."""
    from alphaagent.suggest import edit_distance, nearest_name

    candidates = existing[:MAX_MATCH_CANDIDATES]
    wanted = PurePosixPath(path)
    same_name = [p for p in candidates if PurePosixPath(p).name == wanted.name]
    if same_name:
        return (difflib.get_close_matches(path, same_name, n=1, cutoff=0.0) or same_name)[0]
    # Stems are compared (the suffix would make any two short names look alike: a.png, b.png).
    by_stem: dict[str, list[str]] = {}
    for p in candidates:
        if PurePosixPath(p).suffix == wanted.suffix:
            by_stem.setdefault(PurePosixPath(p).stem, []).append(p)
    near = nearest_name(wanted.stem, by_stem)
    same_stem = [p for p in candidates if PurePosixPath(p).stem == wanted.stem]
    close = (by_stem[near] if near is not None else []) + same_stem
    if not close:
        return None
    # The fewest edits of the file name first, then a file of the same folder, then path order.
    return min(
        close,
        key=lambda p: (
            edit_distance(wanted.name, PurePosixPath(p).name),
            PurePosixPath(p).parent != wanted.parent,
        ),
    )


_INSIDE: Final = "path must stay inside this scope's datasets/, charts/, reports/ or work/"


def check_path_words(scope: Scope, path: str) -> str:
    """The rules of an artifact's path that need no file, only its words and the scope (the key's
    length): no percent-encoding, the §4.2 path rules, inside an artifact folder. Returns the path
    normalised; raises ``ArtifactError`` naming it. ``check_artifact_path`` applies them when a file
    is registered, and ``check_output_paths`` to a spec's outputs before any code runs."""
    if unquote(path) != path:
        raise ArtifactError(f"path {path!r}: percent-encoding is not decoded in paths; {_INSIDE}")
    try:
        normal = check_workspace_path(path, prefix=scope.key + "/")
    except PathRuleError as exc:
        raise ArtifactError(f"path {path!r}: {exc}; {_INSIDE}") from None
    if normal.split("/", 1)[0] not in ARTIFACT_FOLDERS or "/" not in normal:
        raise ArtifactError(f"path {normal!r}: {_INSIDE}")
    return normal


def check_output_paths(scope: Scope, outputs: Sequence[SpecOutput]) -> None:
    """Refuse, before any code runs, a spec output whose ``path`` could never be registered, whatever
    the code writes: a rule of ``check_path_words`` or the sessions' platform-owned folder (the
    suffix of each kind: ``check_spec_rules``). Raises ``InvalidSpecError`` naming ``outputs[i].path``."""
    for i, output in enumerate(outputs):
        if output.path is None:
            continue
        try:
            normal = check_path_words(scope, output.path)
        except ArtifactError as exc:
            raise InvalidSpecError(f"outputs[{i}].{exc}") from None
        if is_session_state(normal):
            raise InvalidSpecError(
                f"outputs[{i}].path: {shown_json(normal)} is in work/sessions/, the platform's folder of the"
                " sessions' live state; choose another folder"
            )


def check_artifact_path(workspace: Workspace, scope: Scope, kind: ArtifactKind, path: str) -> str:
    """Validate a path handed to ``register_artifact``; return it normalised.

    Raises ``ArtifactError`` naming the path: breaks a §4.2 rule, is missing, is a directory, a
    symlink or another non-regular file, or its type does not fit ``kind``.
    """
    normal = check_path_words(scope, path)
    # The sessions' state (platform-owned) is answered as a missing file, and never offered.
    if is_session_state(normal) or workspace.stat(scope, normal) is None:
        listed = [f.path for f in workspace.list_files(scope) if not is_session_state(f.path)]
        near = closest_file(normal, listed)
        hint = f"; the closest existing file is {near!r}" if near else ""  # no guess when none is close
        raise ArtifactError(
            f"path {normal!r}: no regular file there (missing, a directory or a symlink){hint}"
        )
    suffix = PurePosixPath(normal).suffix.lower()
    if suffix not in KIND_SUFFIXES[kind]:
        allowed = ", ".join(KIND_SUFFIXES[kind])
        raise ArtifactError(f"path {normal!r}: a {kind} must be one of {allowed}")
    return normal


def _clip(value: Any) -> Any:
    if isinstance(value, str) and len(value) > MAX_PREVIEW_CELL_CHARS:
        return value[:MAX_PREVIEW_CELL_CHARS] + "…"
    return value


def dataset_metadata(source: bytes | BinaryIO, suffix: str) -> dict[str, Any]:
    """Schema (column -> dtype), row count and the first rows of a dataset, bounded in size.

    ``source`` is the dataset's bytes or a binary reader of them (a seekable file is best: a parquet
    footer is then read without reading the file). The file comes from untrusted code, so: parquet
    is described from its footer only (never decompressed: no decompression bomb); a csv is parsed
    from its first ``MAX_CSV_SAMPLE_BYTES`` (``row_count`` then absent, ``sampled_bytes`` present);
    json and xlsx are parsed only up to ``MAX_DATASET_PROFILE_BYTES`` (an xlsx only if it unpacks to
    at most ``MAX_XLSX_UNPACKED_BYTES``); at most ``MAX_PROFILE_COLUMNS`` columns and
    ``PREVIEW_ROWS`` rows of cells clipped to ``MAX_PREVIEW_CELL_CHARS`` are kept. Large datasets
    are profiled out of process by ``alphaagent.domain.profiling.profile_dataset``.
    """
    sampled = 0
    try:
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            parquet = pq.ParquetFile(io.BytesIO(source) if isinstance(source, bytes) else source)
            meta = parquet.metadata
            result: dict[str, Any] = {
                "profiled": True,
                "schema": {
                    str(f.name)[:200]: str(f.type) for f in list(parquet.schema_arrow)[:MAX_PROFILE_COLUMNS]
                },
                "row_count": meta.num_rows,
                "nulls": _parquet_nulls(meta),
            }
            first_group = meta.row_group(0).total_byte_size if meta.num_row_groups else 0
            if first_group <= MAX_PARQUET_PREVIEW_GROUP_BYTES:  # decompressed size, from the footer
                columns = parquet.schema_arrow.names[:MAX_PROFILE_COLUMNS]
                # Row group 0 only: without it, the reader pre-buffers every row group (the whole file).
                batch = next(
                    parquet.iter_batches(batch_size=PREVIEW_ROWS, row_groups=[0], columns=columns), None
                )
                rows = batch.to_pylist() if batch is not None else []
                result["preview"] = json.loads(
                    json.dumps([{k: _clip(v) for k, v in r.items()} for r in rows], default=str)
                )
            return result
        if suffix == ".csv":
            data = (
                source[: MAX_CSV_SAMPLE_BYTES + 1]
                if isinstance(source, bytes)
                else source.read(MAX_CSV_SAMPLE_BYTES + 1)
            )
            if len(data) > MAX_CSV_SAMPLE_BYTES:
                data = data[: data.rfind(b"\n", 0, MAX_CSV_SAMPLE_BYTES) + 1]
                sampled = len(data)
        else:
            data = source if isinstance(source, bytes) else source.read(MAX_DATASET_PROFILE_BYTES + 1)
        if len(data) > MAX_DATASET_PROFILE_BYTES:
            return {"profiled": False, "reason": f"larger than {MAX_DATASET_PROFILE_BYTES // 2**20} MiB"}
        import pandas as pd

        if suffix == ".xlsx":
            unpacked = sum(entry.file_size for entry in zipfile.ZipFile(io.BytesIO(data)).infolist())
            if unpacked > MAX_XLSX_UNPACKED_BYTES:  # sizes from the zip's directory: nothing unpacked
                return {
                    "profiled": False,
                    "reason": f"unpacks to more than {MAX_XLSX_UNPACKED_BYTES // 2**20} MiB",
                }
        reader = {".csv": pd.read_csv, ".json": pd.read_json, ".xlsx": pd.read_excel}[suffix]
        options: dict[str, Any] = {}
        if suffix == ".csv" and data.split(b"\n", 1)[0].count(b",") >= MAX_PROFILE_COLUMNS:
            # A very wide table (a 1 MB header can name 500,000 columns): parse only the columns the
            # profile keeps, or pandas builds every one of them (minutes, gigabytes).
            options["usecols"] = range(MAX_PROFILE_COLUMNS)
        frame = reader(io.BytesIO(data), **options)
    except Exception as exc:  # a dataset we cannot parse is still registered, with the reason
        return {"profiled": False, "reason": f"{type(exc).__name__}: {exc}"[:500]}
    head = frame.iloc[:PREVIEW_ROWS, :MAX_PROFILE_COLUMNS]
    preview = [
        {str(k): _clip(v) for k, v in row.items()}
        for row in json.loads(head.to_json(orient="records", date_format="iso"))
    ]
    result = {
        "profiled": True,
        "schema": {
            str(col)[:200]: str(dtype) for col, dtype in list(frame.dtypes.items())[:MAX_PROFILE_COLUMNS]
        },
        "row_count": len(frame),
        "nulls": {
            str(col)[:200]: int(n) for col, n in frame.iloc[:, :MAX_PROFILE_COLUMNS].isna().sum().items() if n
        },
        "preview": preview,
    }
    if sampled:
        del result["row_count"]  # only the sample was parsed: its row count is not the file's
        result["sampled_bytes"] = sampled
    return result


def _parquet_nulls(meta: Any) -> dict[str, int]:
    """Null counts per column from the footer's statistics (nothing decompressed); a column whose
    statistics do not all carry a null count is left out (unknown, not zero)."""
    nulls: dict[str, int] = {}
    unknown: set[str] = set()
    for group in range(meta.num_row_groups):
        row_group = meta.row_group(group)
        for index in range(min(row_group.num_columns, MAX_PROFILE_COLUMNS)):
            column = row_group.column(index)
            name = str(column.path_in_schema)[:200]
            stats = column.statistics
            if stats is None or not stats.has_null_count:
                unknown.add(name)
            else:
                nulls[name] = nulls.get(name, 0) + int(stats.null_count)
    return {name: n for name, n in nulls.items() if n and name not in unknown}


def register_artifact(
    store: Store,
    workspace: Workspace,
    *,
    scope: Scope,
    user_id: str,
    turn_id: str,
    kind: ArtifactKind,
    path: str,
    name: str | None = None,
    description: str | None = None,
) -> ArtifactVersion:
    """Register the file's current bytes as the next version of artifact ``name``.

    The bytes are copied into content-addressed storage first (so version n returns the same bytes
    forever), then the version record is written in one transaction: a crash in between leaves an
    unreferenced blob, never a half-registered artifact.

    Raises:
        ArtifactError: the path breaks a rule or does not fit ``kind``, or ``name`` is already an
            artifact of another kind in the scope.
    """
    normal = check_artifact_path(workspace, scope, kind, path)
    artifact_name = name or artifact_name_for(normal)
    latest = store.get_artifact(user_id, scope.key, artifact_name, None)
    if latest is not None and latest.kind != kind:
        # A reader of the latest "summary" dataset must never get a report: one name, one kind.
        raise ArtifactError(
            f"name {artifact_name!r}: already a {latest.kind} in this scope; give the {kind} another name"
        )
    sha256, size = workspace.put_blob(scope, normal)
    metadata: dict[str, Any] = {}
    if kind == "dataset":
        suffix = PurePosixPath(normal).suffix.lower()
        open_blob = getattr(workspace, "open_blob", None)
        limit = MAX_PARQUET_PROFILE_BYTES if suffix == ".parquet" else MAX_DATASET_PROFILE_BYTES
        if open_blob is not None:
            # A seekable local blob: footer-only parquet, sampled csv, large ones out of process.
            with open_blob(sha256) as reader:
                metadata = profile_dataset(reader, size, suffix)
        elif size > limit and suffix != ".csv":
            metadata = {"profiled": False, "reason": f"larger than {limit // 2**20} MiB"}
        else:
            # Compressed formats go to the bounded child here too (spooled: no descriptor).
            metadata = profile_dataset(io.BytesIO(workspace.read_blob(sha256)), size, suffix)
    return store.add_artifact_version(
        ArtifactVersion(
            artifact_id=new_ulid(),
            scope_key=scope.key,
            kind=kind,
            name=artifact_name,
            version=0,
            path=normal,
            sha256=sha256,
            size_bytes=size,
            description=description,
            metadata=metadata,
            turn_id=turn_id,
            user_id=user_id,
            created_at=utcnow(),
        )
    )
