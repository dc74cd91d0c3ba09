"""A session's live state (``work/sessions/{sid}/``: pickles and a manifest) is platform-owned
(DESIGN §4.7), like ``work/runs/``' claims: never listed as a user's file, never exported, never shown
by the viewer, and a path into it is answered exactly as a missing path is, on both backends."""

from __future__ import annotations

import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from alphaagent.aws.workspace import S3Workspace, workspaces_bucket_name
from alphaagent.domain import tools
from alphaagent.domain.artifacts import check_artifact_path
from alphaagent.domain.reads import ScopeReads
from alphaagent.errors import ArtifactError, NotFoundError, ToolError
from alphaagent.local.export import export_scope
from alphaagent.local.workspace import LocalWorkspace
from alphaagent.models.common import ConversationScope
from alphaagent.viewer.reader import WorkspaceReader
from coder import seeing

SCOPE = ConversationScope(conversation_id="c1")
STATE = ["work/sessions/s1/g1-0badc0de.pkl", "work/sessions/s1/manifest.json", "work/sessions/s1/x.csv"]
USER_FILES = ["reports/a.md", "work/notes.txt"]
BUCKET = workspaces_bucket_name("123456789012", "us-east-1")


class _Owner:
    """The one Store method the reads need: alice owns every scope."""

    def owner_of(self, _key: str) -> str:
        return "alice"


@pytest.fixture(params=["local", "s3"])
def workspace(request: pytest.FixtureRequest, tmp_path: Path) -> LocalWorkspace | S3Workspace:
    if request.param == "local":
        local = LocalWorkspace(tmp_path / "home")
        local.ensure_scope(SCOPE)
        root = tmp_path / "home" / SCOPE.key
        for name in [*STATE, *USER_FILES]:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(b"n\n1\n")
        return local
    s3 = request.getfixturevalue("moto").bucket(BUCKET)
    remote = S3Workspace(BUCKET, client=s3, local_dir=tmp_path / "work")
    remote.ensure_scope(SCOPE)
    for name in [*STATE, *USER_FILES]:
        s3.put_object(Bucket=BUCKET, Key=f"{SCOPE.key}/{name}", Body=b"n\n1\n")
    return remote


def _reads(workspace: Any) -> ScopeReads:
    reads = ScopeReads()
    reads.store = _Owner()  # type: ignore[assignment]
    reads.workspace = workspace
    return reads


def _fails(call: Any) -> tuple[type[BaseException], str]:
    with pytest.raises(Exception) as caught:
        call()
    return type(caught.value), str(caught.value).replace("g1-0badc0de.pkl", "X").replace("no-such.pkl", "X")


def test_files_and_cat_never_show_a_sessions_state(workspace: Any) -> None:
    reads = _reads(workspace)
    assert [f.path for f in reads.files("alice", SCOPE)] == USER_FILES
    assert reads.files("alice", SCOPE, "work/sessions") == []
    assert reads.files("alice", SCOPE, "work") == [
        f for f in reads.files("alice", SCOPE) if f.path.startswith("work/")
    ]
    # cat of a pickle is exactly cat of a missing file
    assert _fails(lambda: reads.read_file("alice", SCOPE, STATE[0])) == _fails(
        lambda: reads.read_file("alice", SCOPE, "work/sessions/s1/no-such.pkl")
    )
    assert _fails(lambda: reads.read_file("alice", SCOPE, STATE[0]))[0] is NotFoundError


def test_the_viewer_neither_lists_nor_serves_a_sessions_state(workspace: Any) -> None:
    reader = WorkspaceReader("alice", lambda: (_Owner(), workspace))  # type: ignore[arg-type, return-value]
    files, skipped = reader.files(SCOPE)
    assert [f.path for f in files] == USER_FILES and skipped == []
    with pytest.raises(NotFoundError):
        reader.file(SCOPE, STATE[0])
    assert reader.file(SCOPE, USER_FILES[0])[1].read() == b"n\n1\n"


def test_registering_or_reading_a_sessions_state_is_answered_as_a_missing_path(workspace: Any) -> None:
    # register_artifact: the same error as a path that does not exist, and no pickle offered as the
    # "closest existing file"
    present = _fails(lambda: check_artifact_path(workspace, SCOPE, "dataset", STATE[2]))
    missing = _fails(lambda: check_artifact_path(workspace, SCOPE, "dataset", "work/sessions/s1/y.csv"))
    assert present[0] is missing[0] is ArtifactError
    assert present[1] == missing[1].replace("y.csv", "x.csv")
    assert "file is 'work/sessions" not in present[1]

    ctx = SimpleNamespace(backend=SimpleNamespace(workspace=workspace), scope=SCOPE)
    for name in STATE[:2]:
        with pytest.raises(ToolError, match="no such document in this scope"):
            tools.read_document(ctx, name)  # type: ignore[arg-type]
    with pytest.raises(ToolError, match="no such document in this scope"):
        seeing.read_table(ctx, STATE[2], 0, 5)  # type: ignore[arg-type]
    with pytest.raises(ToolError, match="is not a file of this scope"):
        tools.emit_citation(SimpleNamespace(citations=[], fetched_sources=set(), **vars(ctx)), STATE[0])  # type: ignore[arg-type]
    assert tools.read_document(ctx, USER_FILES[1]).text == "n\n1\n"  # type: ignore[arg-type]


def test_export_leaves_a_sessions_state_out(tmp_path: Path) -> None:
    workspace = LocalWorkspace(tmp_path / "home")
    workspace.ensure_scope(SCOPE)
    root = tmp_path / "home" / SCOPE.key
    for name in [*STATE, *USER_FILES, "work/sessions/s1/bad\\name.pkl"]:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"n\n1\n")

    report = export_scope(workspace, SCOPE, tmp_path / "c1.zip")

    assert [item.path for item in report.included] == USER_FILES
    assert report.omitted == []  # not even named as left out: it is not the user's
    with zipfile.ZipFile(tmp_path / "c1.zip") as archive:
        assert not any("sessions" in name for name in archive.namelist())
