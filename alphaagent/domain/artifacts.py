"""Artifact registration (issue 3 §9): a regular file inside the scope that fits its kind becomes an
immutable, content-addressed version."""

from __future__ import annotations

import io
import json
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import unquote

from alphaagent.errors import ArtifactError
from alphaagent.ids import new_ulid
from alphaagent.models.common import ArtifactKind, PathRuleError, Scope, check_workspace_path, utcnow
from alphaagent.models.records import ArtifactVersion
from alphaagent.ports import Store, Workspace

KIND_SUFFIXES: dict[str, tuple[str, ...]] = {
    "dataset": (".csv", ".parquet", ".json", ".xlsx"),
    "chart": (".png", ".svg", ".jpg", ".jpeg", ".html"),
    "report": (".md", ".html", ".pdf", ".txt"),
}
"""File types each artifact kind accepts (issue 3 §9)."""

KIND_FOLDERS: dict[str, str] = {"dataset": "datasets", "chart": "charts", "report": "reports"}
ARTIFACT_FOLDERS = ("datasets", "charts", "reports", "work")
"""Where a registered file may live (case PATH-03): never spec/ (the platform's) nor docs/ (inputs)."""
PREVIEW_ROWS = 5
MAX_DATASET_PROFILE_BYTES = 256 * 2**20
"""Datasets larger than this are registered without schema, row count or preview (reading them whole
to profile them would cost the turn too much memory)."""


def artifact_name_for(path: str) -> str:
    """A default artifact name from a file name: lower case, other characters as '-'."""
    stem = PurePosixPath(path).stem.lower()
    cleaned = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in stem).strip("._-")
    return (cleaned or "artifact")[:64]


def check_artifact_path(workspace: Workspace, scope: Scope, kind: ArtifactKind, path: str) -> str:
    """Validate a path handed to ``register_artifact``; return it normalised.

    Raises ``ArtifactError`` naming the path: breaks a §4.2 rule, is missing, is a directory, a
    symlink or another non-regular file, or its type does not fit ``kind``.
    """
    inside = "path must stay inside this scope's datasets/, charts/, reports/ or work/"
    if unquote(path) != path:
        raise ArtifactError(f"path {path!r}: percent-encoding is not decoded in paths; {inside}")
    try:
        normal = check_workspace_path(path, prefix=scope.key + "/")
    except PathRuleError as exc:
        raise ArtifactError(f"path {path!r}: {exc}; {inside}") from None
    if normal.split("/", 1)[0] not in ARTIFACT_FOLDERS or "/" not in normal:
        raise ArtifactError(f"path {normal!r}: {inside}")
    if workspace.stat(scope, normal) is None:
        raise ArtifactError(f"path {normal!r}: no regular file there (missing, a directory or a symlink)")
    suffix = PurePosixPath(normal).suffix.lower()
    if suffix not in KIND_SUFFIXES[kind]:
        allowed = ", ".join(KIND_SUFFIXES[kind])
        raise ArtifactError(f"path {normal!r}: a {kind} must be one of {allowed}")
    return normal


def dataset_metadata(data: bytes, suffix: str) -> dict[str, Any]:
    """Schema (column -> dtype), row count and the first rows of a dataset; {} if it cannot be read."""
    if len(data) > MAX_DATASET_PROFILE_BYTES:
        return {"profiled": False, "reason": "larger than the profiling limit"}
    try:
        import pandas as pd

        reader = {
            ".csv": pd.read_csv,
            ".parquet": pd.read_parquet,
            ".json": pd.read_json,
            ".xlsx": pd.read_excel,
        }[suffix]
        frame = reader(io.BytesIO(data))
    except Exception as exc:  # a dataset we cannot parse is still registered, with the reason
        return {"profiled": False, "reason": f"{type(exc).__name__}: {exc}"[:500]}
    preview = json.loads(frame.head(PREVIEW_ROWS).to_json(orient="records", date_format="iso"))
    return {
        "profiled": True,
        "schema": {str(col): str(dtype) for col, dtype in frame.dtypes.items()},
        "row_count": len(frame),
        "preview": preview,
    }


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
    """
    normal = check_artifact_path(workspace, scope, kind, path)
    artifact_name = name or artifact_name_for(normal)
    sha256, size = workspace.put_blob(scope, normal)
    metadata: dict[str, Any] = {}
    if kind == "dataset":
        metadata = dataset_metadata(workspace.read_blob(sha256), PurePosixPath(normal).suffix.lower())
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
