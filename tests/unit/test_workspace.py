"""What only the local conversation filesystem shows (DESIGN §4.2): the S3 key layout on disk,
symlinks never followed at any component (PATH-01, PATH-03), atomic writes, read-only blobs. The
behaviour both Workspace adapters share (path rules, NFC names, listing, blobs) is the contract suite,
tests/integration/test_workspace_contract.py."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from alphaagent.errors import PathRuleError
from alphaagent.local.workspace import LocalWorkspace
from alphaagent.models.common import ConversationScope, NodeScope

SCOPE_FOLDERS = ("spec", "docs", "datasets", "charts", "reports", "work")
MARKER = b"MARKER-outside-the-scope"
MiB = 2**20


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def workspace(home: Path) -> LocalWorkspace:
    return LocalWorkspace(home)


@pytest.fixture
def scope(workspace: LocalWorkspace) -> ConversationScope:
    scope = ConversationScope(conversation_id="c1")
    workspace.ensure_scope(scope)
    return scope


@pytest.fixture
def other(workspace: LocalWorkspace) -> ConversationScope:
    """Another conversation holding data that must never leak into or be overwritten from ``scope``."""
    other = ConversationScope(conversation_id="conv-OTHER")
    workspace.ensure_scope(other)
    workspace.write_bytes(other, "datasets/x.csv", b"other conversation's data\n")
    workspace.write_bytes(other, "reports/leak.md", b"other conversation's report\n")
    return other


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A tree outside every scope, holding the marker where a followed symlink would lead."""
    root = tmp_path / "outside"
    for rel in ("secret.txt", "reports/secret.txt", "c1/reports/secret.txt"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(MARKER)
    return root


def tree(root: Path) -> dict[str, bytes | str]:
    """Every entry under ``root`` without following links: file contents, link targets, dirs."""
    found: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                found[rel] = f"-> {os.readlink(path)}"
            elif path.is_file():
                found[rel] = path.read_bytes()
            else:
                found[rel] = "dir" if path.is_dir() else "special"
    return found


# -- layout and scopes -----------------------------------------------------------------------------


def test_ensure_scope_creates_the_six_folders_with_the_s3_key_layout(home: Path) -> None:
    # Given an empty home and a conversation that does not exist yet
    workspace = LocalWorkspace(home)
    scope = ConversationScope(conversation_id="c1")
    assert workspace.scope_exists(scope) is False

    # When the scope is ensured twice and a dataset is written
    workspace.ensure_scope(scope)
    workspace.ensure_scope(scope)
    workspace.write_bytes(scope, "datasets/x.csv", b"a,b\n1,2\n")

    # Then the files sit at home/<scope key>/..., exactly the S3 key layout
    root = home / "conversations" / "c1"
    assert workspace.scope_exists(scope) is True
    assert workspace.local_root(scope) == root
    assert sorted(os.listdir(root)) == sorted(SCOPE_FOLDERS)
    assert (root / "datasets" / "x.csv").read_bytes() == b"a,b\n1,2\n"


def test_a_workflow_node_scope_lives_under_workflows_nodes(home: Path) -> None:
    # Given a node of a workflow run
    workspace = LocalWorkspace(home)
    node = NodeScope(workflow_execution_id="wf1", node_id="n1")

    # When it is ensured and written to
    workspace.ensure_scope(node)
    workspace.write_bytes(node, "reports/r.md", b"# r\n")

    # Then it lives at home/workflows/{id}/nodes/{node}/ and reads back
    assert (home / "workflows/wf1/nodes/n1/reports/r.md").read_bytes() == b"# r\n"
    assert workspace.read_bytes(node, "reports/r.md") == b"# r\n"


# -- symlinks, never followed (PATH-01, PATH-03) ----------------------------------------------------


def link_file(home: Path, outside: Path) -> str:
    os.symlink(outside / "secret.txt", home / "conversations/c1/reports/secret.txt")
    return "reports/secret.txt"


def link_nested_dir(home: Path, outside: Path) -> str:
    os.symlink(outside, home / "conversations/c1/reports/sub")
    return "reports/sub/secret.txt"


def link_scope_folder(home: Path, outside: Path) -> str:
    (home / "conversations/c1/reports").rmdir()
    os.symlink(outside, home / "conversations/c1/reports")
    return "reports/secret.txt"


def link_scope_root(home: Path, outside: Path) -> str:
    shutil.rmtree(home / "conversations/c1")
    os.symlink(outside, home / "conversations/c1")
    return "reports/secret.txt"


def link_conversations(home: Path, outside: Path) -> str:
    shutil.rmtree(home / "conversations")
    os.symlink(outside, home / "conversations")
    return "reports/secret.txt"


LINK_POSITIONS = [link_file, link_nested_dir, link_scope_folder, link_scope_root, link_conversations]


@pytest.mark.parametrize("plant", LINK_POSITIONS)
def test_reads_never_follow_a_symlink_at_any_component(
    workspace: LocalWorkspace, scope: ConversationScope, home: Path, outside: Path, plant: Callable[..., str]
) -> None:
    # Given a symlink planted (by user code) at one component of a path, leading to the marker outside
    path = plant(home, outside)
    assert (home / "conversations/c1" / path).read_bytes() == MARKER  # the OS would follow it

    # When the path is read, opened, stat'ed, listed and copied into a blob
    # Then nothing is found, the marker never comes back, and no blob is stored
    with pytest.raises(FileNotFoundError):
        workspace.read_bytes(scope, path)
    with pytest.raises(FileNotFoundError):
        workspace.open_file(scope, path)
    assert workspace.stat(scope, path) is None
    with pytest.raises(FileNotFoundError):
        workspace.put_blob(scope, path)
    assert workspace.list_files(scope) == []
    assert workspace.list_files(scope, "reports") == []
    blobs = home / "blobs" / "sha256"
    assert not blobs.exists() or not any(p.is_file() for p in blobs.rglob("*"))


@pytest.mark.parametrize("plant", LINK_POSITIONS)
def test_writes_never_follow_a_symlink_at_any_component(
    workspace: LocalWorkspace, scope: ConversationScope, home: Path, outside: Path, plant: Callable[..., str]
) -> None:
    # Given a symlink planted at one component of a path, and a snapshot of the tree outside
    path = plant(home, outside)
    before = tree(outside)
    sibling = path.rsplit("/", 1)[0] + "/new.txt"

    # When the linked path, and a new file next to it, are written (and the scope re-ensured)
    # Then every write is refused with a rule error and nothing outside the scope changed
    with pytest.raises(PathRuleError):
        workspace.write_bytes(scope, path, b"overwritten")
    if plant is not link_file:
        with pytest.raises(PathRuleError):
            workspace.write_bytes(scope, sibling, b"created")
    if plant in (link_scope_root, link_conversations):
        with pytest.raises(PathRuleError):
            workspace.ensure_scope(scope)
        assert workspace.scope_exists(scope) is False
    else:
        workspace.ensure_scope(scope)  # leaves the planted link alone
    assert tree(outside) == before


def test_a_dangling_symlink_is_not_written_through(
    workspace: LocalWorkspace, scope: ConversationScope, home: Path, outside: Path
) -> None:
    # Given a symlink to a file outside that does not exist yet (O_CREAT would create it)
    os.symlink(outside / "created.txt", home / "conversations/c1/reports/out.txt")

    # When the link's path is written
    # Then the write is refused, the target is not created, and the link is left as it was
    with pytest.raises(PathRuleError, match="symlink"):
        workspace.write_bytes(scope, "reports/out.txt", b"x")
    assert not (outside / "created.txt").exists()
    assert os.readlink(home / "conversations/c1/reports/out.txt") == str(outside / "created.txt")


def test_list_files_lists_regular_files_only_and_never_enters_linked_directories(
    workspace: LocalWorkspace, scope: ConversationScope, home: Path, outside: Path
) -> None:
    # Given regular files alongside links to a file, to a directory, to /usr, and a FIFO
    root = home / "conversations/c1"
    workspace.write_bytes(scope, "reports/real.md", b"# real\n")
    os.symlink(outside / "secret.txt", root / "reports/link.txt")
    os.symlink(outside, root / "work/linked_dir")
    os.symlink("/usr", root / "work/usr")
    os.mkfifo(root / "work/pipe")

    # When the scope is listed
    files = workspace.list_files(scope)

    # Then only the regular file comes back
    assert [info.path for info in files] == ["reports/real.md"]


def test_a_fifo_is_not_a_file_and_does_not_block(
    workspace: LocalWorkspace, scope: ConversationScope, home: Path
) -> None:
    # Given a FIFO where a dataset is expected (opening it for reading would block forever)
    os.mkfifo(home / "conversations/c1/datasets/feed.csv")

    # When it is read, stat'ed and copied into a blob
    # Then it is simply not a file
    with pytest.raises(FileNotFoundError):
        workspace.read_bytes(scope, "datasets/feed.csv")
    with pytest.raises(FileNotFoundError):
        workspace.put_blob(scope, "datasets/feed.csv")
    assert workspace.stat(scope, "datasets/feed.csv") is None


def test_a_directory_where_a_file_is_expected_and_a_file_where_a_folder_is_expected(
    workspace: LocalWorkspace, scope: ConversationScope
) -> None:
    # Given a folder and a file in it
    workspace.write_bytes(scope, "reports/a.md", b"a")

    # When the folder is read or written as a file, and the file used as a folder
    # Then reads find nothing and writes are refused, leaving both as they were
    with pytest.raises(FileNotFoundError):
        workspace.read_bytes(scope, "reports")
    assert workspace.stat(scope, "reports") is None
    with pytest.raises(PathRuleError):
        workspace.write_bytes(scope, "reports", b"x")
    with pytest.raises(PathRuleError):
        workspace.write_bytes(scope, "reports/a.md/b.md", b"x")
    with pytest.raises(FileNotFoundError):
        workspace.read_bytes(scope, "reports/a.md/b.md")
    assert workspace.read_bytes(scope, "reports/a.md") == b"a"


# -- listing -----------------------------------------------------------------------------------------


def test_a_file_name_that_is_not_utf8_is_not_listed(
    workspace: LocalWorkspace, scope: ConversationScope, home: Path
) -> None:
    # Given a file user code created under a name that is not UTF-8 (no S3 key can be; the names
    # both adapters refuse are in the contract suite)
    (home / "conversations/c1/reports" / os.fsdecode(b"bad\xff.md")).write_bytes(b"x")
    workspace.write_bytes(scope, "reports/ok.md", b"ok")

    # When the scope is listed
    # Then only the addressable file is listed: every listed path can be read back
    files = workspace.list_files(scope)
    assert [info.path for info in files] == ["reports/ok.md"]


# -- atomic writes ------------------------------------------------------------------------------------


def test_a_failed_write_keeps_the_old_content_and_leaves_no_temporary_file(
    workspace: LocalWorkspace, scope: ConversationScope, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a report, and a disk that fails to flush
    workspace.write_bytes(scope, "reports/a.md", b"old")

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)

    # When the report is rewritten
    with pytest.raises(OSError, match="Input/output"):
        workspace.write_bytes(scope, "reports/a.md", b"new")

    # Then the old content is intact and no temporary file is left
    monkeypatch.undo()
    assert workspace.read_bytes(scope, "reports/a.md") == b"old"
    assert os.listdir(home / "conversations/c1/reports") == ["a.md"]


# -- blobs --------------------------------------------------------------------------------------------


def test_put_blob_stores_a_read_only_copy_and_leaves_no_temporary_file(
    workspace: LocalWorkspace, scope: ConversationScope, home: Path
) -> None:
    # Given a chart
    workspace.write_bytes(scope, "charts/plot.png", b"\x89PNG fake chart bytes")

    # When it is put into blob storage
    digest, _ = workspace.put_blob(scope, "charts/plot.png")

    # Then the blob file is read-only, and the staging folder is empty again
    blob = home / "blobs" / "sha256" / digest[:2] / digest
    assert stat.S_IMODE(blob.stat().st_mode) == 0o444
    assert os.listdir(home / "blobs" / "tmp") == []


def test_put_blob_streams_in_constant_memory(
    workspace: LocalWorkspace, scope: ConversationScope, home: Path
) -> None:
    # Given a 24 MiB dataset (sparse, so it is quick to make)
    path = home / "conversations/c1/datasets/big.bin"
    with open(path, "wb") as handle:
        handle.truncate(24 * MiB)

    # When it is put into blob storage while Python allocations are traced
    tracemalloc.start()
    try:
        digest, size = workspace.put_blob(scope, "datasets/big.bin")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    # Then the digest covers every byte, and memory stayed near one 1 MiB block
    assert size == 24 * MiB
    assert digest == hashlib.sha256(bytes(24 * MiB)).hexdigest()
    assert peak < 4 * MiB
