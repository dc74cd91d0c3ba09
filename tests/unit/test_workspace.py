"""Behaviour of the local conversation filesystem (DESIGN §4.2): the S3 key layout on disk, the path
rules, symlinks never followed at any component (PATH-01, PATH-03), atomic writes, immutable blobs."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tracemalloc
import unicodedata
from collections.abc import Callable
from datetime import UTC
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


def test_a_scope_that_was_never_created_has_no_files(workspace: LocalWorkspace) -> None:
    # Given a conversation nobody created (and not even a home directory)
    ghost = ConversationScope(conversation_id="ghost")

    # When it is read, stat'ed and listed
    # Then it simply has no files
    with pytest.raises(FileNotFoundError):
        workspace.read_bytes(ghost, "reports/a.md")
    assert workspace.stat(ghost, "reports/a.md") is None
    assert workspace.list_files(ghost) == []
    assert workspace.scope_exists(ghost) is False


# -- path rules (DESIGN §4.2, PATH-03) ---------------------------------------------------------------

REJECTED_PATHS = [
    "../../conv-OTHER/reports/leak.md",
    "charts/../../../spec/override.json",
    "/etc/hosts",
    "reports/a\x00b.md",
    "reports/a\x01b.md",
    "reports/a\nb.md",
    "reports/a\x7fb.md",
    "a//b",
    "reports/",
    "",
    "./reports/a.md",
    "reports/.",
    "..",
    "reports\\..\\..\\conv-OTHER\\reports\\leak.md",
    "datasets/c1-\x85-\x9b[31m.csv",  # C1 controls: U+009B is the terminal's CSI
    "reports/rtl-\u202egnp.exe",  # a right-to-left override: shows as "rtl-exe.png"
    "reports/isolate-\u2066x.md",
    "reports/mark-\u200fx.md",  # a right-to-left mark
    "reports/line\u2028break.md",  # splitlines() splits here: a fake line in a listing
    "reports/para\u2029break.md",
    "reports/" + "a" * 256 + ".md",  # a segment over NAME_MAX (255 bytes)
    "reports/" + "é" * 128 + ".md",  # 256 + 3 bytes in UTF-8, though 131 characters
]


@pytest.mark.parametrize("path", REJECTED_PATHS)
def test_every_operation_rejects_a_path_that_breaks_a_rule(
    workspace: LocalWorkspace, scope: ConversationScope, other: ConversationScope, tmp_path: Path, path: str
) -> None:
    # Given two conversations and a snapshot of everything on disk
    before = tree(tmp_path)

    # When each operation is handed the bad path
    # Then each one refuses it with PathRuleError ...
    operations: list[Callable[[], object]] = [
        lambda: workspace.read_bytes(scope, path),
        lambda: workspace.open_file(scope, path),
        lambda: workspace.write_bytes(scope, path, b"pwned"),
        lambda: workspace.stat(scope, path),
        lambda: workspace.put_blob(scope, path),
    ]
    if path not in ("", "reports/"):  # '' lists everything; one trailing '/' names the folder
        operations.append(lambda: workspace.list_files(scope, path))
    for operation in operations:
        with pytest.raises(PathRuleError):
            operation()

    # ... and nothing was read into a blob or written anywhere, in this scope or outside it
    assert tree(tmp_path) == before


def test_percent_encoded_dots_are_a_literal_name_that_stays_inside_the_scope(
    workspace: LocalWorkspace, scope: ConversationScope, other: ConversationScope, home: Path
) -> None:
    # Given another conversation holding datasets/x.csv
    literal = "..%2F..%2Fconv-OTHER%2Fdatasets%2Fx.csv"
    others_file = home / "conversations/conv-OTHER/datasets/x.csv"
    others_bytes = others_file.read_bytes()

    # When the percent-encoded traversal is used: percent-encoding is never decoded (check_workspace_path),
    # so it is one literal file name at the top of *this* scope
    # Then reading it does not reach the other conversation's file
    with pytest.raises(FileNotFoundError):
        workspace.read_bytes(scope, literal)
    assert workspace.stat(scope, literal) is None

    # And writing it creates exactly one file, inside this scope, under that literal name
    workspace.write_bytes(scope, literal, b"mine")
    assert (home / "conversations/c1" / literal).read_bytes() == b"mine"
    assert workspace.read_bytes(scope, literal) == b"mine"
    assert others_file.read_bytes() == others_bytes
    assert [info.path for info in workspace.list_files(scope)] == [literal]


def test_the_1024_byte_key_limit_counts_utf8_bytes_of_the_full_key(
    workspace: LocalWorkspace, scope: ConversationScope
) -> None:
    # Given paths whose full key "conversations/c1/<path>" is exactly 1,024 and 1,025 UTF-8 bytes
    # (segments of at most 255 bytes, with 2-byte 'é's so characters and bytes differ)
    prefix = "conversations/c1/"
    at_limit = "/".join(["a" * 200] * 4) + "/" + "é" * 101 + "f"
    assert len((prefix + at_limit).encode()) == 1024
    assert len(prefix + at_limit) < 1000
    over_limit = at_limit + "g"

    # When both are written
    workspace.write_bytes(scope, at_limit, b"fits")

    # Then the 1,024-byte key is accepted and reads back, the 1,025-byte key is refused for every use
    assert workspace.read_bytes(scope, at_limit) == b"fits"
    with pytest.raises(PathRuleError, match="1024"):
        workspace.write_bytes(scope, over_limit, b"too long")
    with pytest.raises(PathRuleError):
        workspace.read_bytes(scope, over_limit)


def test_a_segment_over_the_local_255_byte_name_limit_is_never_found_and_never_written(
    workspace: LocalWorkspace, scope: ConversationScope
) -> None:
    # Given a path whose last segment is 256 bytes, more than a file name may hold
    path = "reports/" + "n" * 256

    # When it is written, read and stat'ed
    # Then each is refused with a rule error naming the limit (the same rule as on S3, so every
    # object of a scope can be synced to a working copy)
    for operation in (
        lambda: workspace.write_bytes(scope, path, b"x"),
        lambda: workspace.read_bytes(scope, path),
        lambda: workspace.stat(scope, path),
    ):
        with pytest.raises(PathRuleError, match="255"):
            operation()


def test_an_nfd_spelling_finds_the_nfc_file_and_files_are_stored_nfc(
    workspace: LocalWorkspace, scope: ConversationScope
) -> None:
    # Given a file written under its decomposed (NFD) spelling
    nfc = "reports/café.md"
    nfd = unicodedata.normalize("NFD", nfc)
    assert nfd != nfc
    workspace.write_bytes(scope, nfd, b"cafe")

    # When it is looked up under either spelling
    # Then both find it, and it is stored and listed under the composed (NFC) name
    assert workspace.read_bytes(scope, nfc) == b"cafe"
    assert workspace.read_bytes(scope, nfd) == b"cafe"
    info = workspace.stat(scope, nfd)
    assert info is not None and info.path == nfc
    assert os.listdir(workspace.local_root(scope) / "reports") == ["café.md"]
    assert [item.path for item in workspace.list_files(scope)] == [nfc]


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


def test_list_files_is_sorted_and_filtered_by_whole_folder_components(
    workspace: LocalWorkspace, scope: ConversationScope
) -> None:
    # Given files in several folders, including one whose name extends another's
    for path in ("reports/b.md", "reports/2024/q1.md", "reports2/x.md", "datasets/a.csv", "top.txt"):
        workspace.write_bytes(scope, path, path.encode())

    # When the scope and a folder are listed
    everything = workspace.list_files(scope)
    reports = workspace.list_files(scope, "reports")

    # Then paths are sorted, workspace-relative, with sizes and UTC times; the folder is matched whole
    assert [info.path for info in everything] == [
        "datasets/a.csv",
        "reports/2024/q1.md",
        "reports/b.md",
        "reports2/x.md",
        "top.txt",
    ]
    assert [info.path for info in reports] == ["reports/2024/q1.md", "reports/b.md"]
    assert workspace.list_files(scope, "reports/") == reports
    assert all(info.size_bytes == len(info.path) for info in everything)
    assert all(info.modified_at.tzinfo == UTC for info in everything)
    assert workspace.list_files(scope, "missing") == []
    assert workspace.list_files(scope, "top.txt") == []


def test_names_no_workspace_method_could_address_are_not_listed(
    workspace: LocalWorkspace, scope: ConversationScope, home: Path
) -> None:
    # Given files created by user code under names that break the path rules or are not NFC
    root = home / "conversations/c1/reports"
    for name in ("back\\slash.md", "new\nline.md", unicodedata.normalize("NFD", "café.md")):
        (root / name).write_bytes(b"x")
    (root / os.fsdecode(b"bad\xff.md")).write_bytes(b"x")
    workspace.write_bytes(scope, "reports/ok.md", b"ok")

    # When the scope is listed
    # Then only the addressable file is listed: every listed path can be read back
    files = workspace.list_files(scope)
    assert [info.path for info in files] == ["reports/ok.md"]


# -- atomic writes ------------------------------------------------------------------------------------


def test_write_bytes_replaces_atomically_and_leaves_no_temporary_file(
    workspace: LocalWorkspace, scope: ConversationScope, home: Path
) -> None:
    # Given a report and a reader that opened its first version
    workspace.write_bytes(scope, "reports/a.md", b"version 1\n" * 1000)
    reader = workspace.open_file(scope, "reports/a.md")

    # When the report is rewritten
    workspace.write_bytes(scope, "reports/a.md", b"version 2\n")

    # Then the open reader still sees the whole first version, new reads see the second, and the
    # folder holds nothing but the report
    with reader:
        assert reader.read() == b"version 1\n" * 1000
    assert workspace.read_bytes(scope, "reports/a.md") == b"version 2\n"
    assert os.listdir(home / "conversations/c1/reports") == ["a.md"]


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


def test_write_bytes_creates_missing_parent_folders(
    workspace: LocalWorkspace, scope: ConversationScope
) -> None:
    # Given a scope without a reports/2024/q1 folder
    # When a report is written there
    workspace.write_bytes(scope, "reports/2024/q1/summary.md", b"# Q1\n")

    # Then the folders are created and the file reads back
    assert workspace.read_bytes(scope, "reports/2024/q1/summary.md") == b"# Q1\n"


# -- blobs --------------------------------------------------------------------------------------------


def test_put_blob_stores_a_read_only_content_addressed_copy(
    workspace: LocalWorkspace, scope: ConversationScope, home: Path
) -> None:
    # Given a chart
    content = b"\x89PNG fake chart bytes"
    workspace.write_bytes(scope, "charts/plot.png", content)

    # When it is put into blob storage
    digest, size = workspace.put_blob(scope, "charts/plot.png")

    # Then the blob is named by its sha256, sized in bytes, read-only, and reads back
    assert digest == hashlib.sha256(content).hexdigest()
    assert size == len(content)
    blob = home / "blobs" / "sha256" / digest[:2] / digest
    assert blob.read_bytes() == content
    assert stat.S_IMODE(blob.stat().st_mode) == 0o444
    assert workspace.read_blob(digest) == content
    assert os.listdir(home / "blobs" / "tmp") == []


def test_a_blob_keeps_its_bytes_when_the_file_changes_and_is_never_rewritten(
    workspace: LocalWorkspace, scope: ConversationScope, home: Path
) -> None:
    # Given a dataset registered as a blob
    workspace.write_bytes(scope, "datasets/a.csv", b"v1\n")
    first, _ = workspace.put_blob(scope, "datasets/a.csv")
    blob = home / "blobs" / "sha256" / first[:2] / first
    identity = (blob.stat().st_ino, blob.stat().st_mtime_ns)

    # When the file changes and is registered again, and a copy of v1 elsewhere is registered too
    workspace.write_bytes(scope, "datasets/a.csv", b"v2\n")
    second, _ = workspace.put_blob(scope, "datasets/a.csv")
    workspace.write_bytes(scope, "datasets/copy.csv", b"v1\n")
    again, _ = workspace.put_blob(scope, "datasets/copy.csv")

    # Then each version keeps its own bytes, and the v1 blob was not rewritten (same inode, same mtime)
    assert second != first and again == first
    assert workspace.read_blob(first) == b"v1\n"
    assert workspace.read_blob(second) == b"v2\n"
    assert (blob.stat().st_ino, blob.stat().st_mtime_ns) == identity


def test_an_empty_file_is_a_valid_blob(workspace: LocalWorkspace, scope: ConversationScope) -> None:
    # Given an empty file
    workspace.write_bytes(scope, "work/empty.txt", b"")

    # When it is put into blob storage
    # Then its digest is sha256 of nothing and it reads back empty
    assert workspace.put_blob(scope, "work/empty.txt") == (hashlib.sha256(b"").hexdigest(), 0)
    assert workspace.read_blob(hashlib.sha256(b"").hexdigest()) == b""


@pytest.mark.parametrize("digest", ["0" * 64, "../../../../etc/passwd", "A" * 64, "abc", ""])
def test_read_blob_of_an_unknown_or_malformed_digest_is_not_found(
    workspace: LocalWorkspace, scope: ConversationScope, digest: str
) -> None:
    # Given a blob store (possibly empty)
    # When an unknown or malformed digest is read
    # Then nothing is found, and no path outside the store is ever reached
    with pytest.raises(FileNotFoundError):
        workspace.read_blob(digest)


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
