"""The Workspace contract (alphaagent/ports.py, DESIGN §4.2) as one suite over both adapters: the
local filesystem (alphaagent/local/workspace.py) and S3 (alphaagent/aws/workspace.py), as the store
suite runs over SQLite and DynamoDB. What only one adapter can show (symlinks and atomic renames on
disk; object versions, paging and multipart on S3) stays in tests/unit/test_workspace.py and
tests/integration/test_s3_workspace.py."""

from __future__ import annotations

import hashlib
import os
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path

import pytest

from alphaagent.aws.workspace import S3Workspace, workspaces_bucket_name
from alphaagent.errors import PathRuleError
from alphaagent.local.workspace import LocalWorkspace
from alphaagent.models.common import ConversationScope, Scope

BUCKET = workspaces_bucket_name("123456789012", "us-east-1")


@dataclass
class Adapter:
    """One Workspace adapter and what the tests need to look behind it."""

    workspace: LocalWorkspace | S3Workspace
    stored: Callable[[], dict[str, bytes]]
    """Everything the adapter keeps, by key from its root ("conversations/c1/reports/a.md": bytes)."""
    plant: Callable[[Scope, str, bytes], None]
    """Store bytes under a raw name, as user code (locally) or another S3 client could."""
    identity: Callable[[str], object]
    """What changes when the stored object at a key is rewritten (inode and mtime, or VersionId)."""


def _tree(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root``, not following links: key -> bytes."""
    found: dict[str, bytes] = {}
    for dirpath, _dirnames, filenames in os.walk(root, followlinks=False):
        for name in filenames:
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink():
                found[str(path.relative_to(root))] = path.read_bytes()
    return found


def _local(tmp_path: Path) -> Adapter:
    home = tmp_path / "home"
    workspace = LocalWorkspace(home)

    def plant(scope: Scope, name: str, data: bytes) -> None:
        path = home / scope.key / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def identity(key: str) -> object:
        info = (home / key).stat()
        return (info.st_ino, info.st_mtime_ns)

    return Adapter(workspace, lambda: _tree(home), plant, identity)


def _s3(request: pytest.FixtureRequest, tmp_path: Path) -> Adapter:
    s3 = request.getfixturevalue("moto").bucket(BUCKET, versioned=True)
    workspace = S3Workspace(BUCKET, client=s3, local_dir=tmp_path / "work")

    def stored() -> dict[str, bytes]:
        found: dict[str, bytes] = {}
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
            for item in page.get("Contents", []):
                if not item["Key"].endswith("/"):  # ensure_scope's folder markers
                    found[item["Key"]] = s3.get_object(Bucket=BUCKET, Key=item["Key"])["Body"].read()
        return found

    def plant(scope: Scope, name: str, data: bytes) -> None:
        s3.put_object(Bucket=BUCKET, Key=f"{scope.key}/{name}", Body=data)

    def identity(key: str) -> object:
        versions = s3.list_object_versions(Bucket=BUCKET, Prefix=key).get("Versions", [])
        return [version["VersionId"] for version in versions if version["Key"] == key]

    return Adapter(workspace, stored, plant, identity)


@pytest.fixture(params=["local", "s3"])
def adapter(request: pytest.FixtureRequest, tmp_path: Path) -> Adapter:
    return _local(tmp_path) if request.param == "local" else _s3(request, tmp_path)


@pytest.fixture
def workspace(adapter: Adapter) -> LocalWorkspace | S3Workspace:
    return adapter.workspace


@pytest.fixture
def scope(workspace: LocalWorkspace | S3Workspace) -> ConversationScope:
    scope = ConversationScope(conversation_id="c1")
    workspace.ensure_scope(scope)
    return scope


@pytest.fixture
def other(workspace: LocalWorkspace | S3Workspace) -> ConversationScope:
    """Another conversation holding data that must never leak into or be overwritten from ``scope``."""
    other = ConversationScope(conversation_id="conv-OTHER")
    workspace.ensure_scope(other)
    workspace.write_bytes(other, "datasets/x.csv", b"other conversation's data\n")
    workspace.write_bytes(other, "reports/leak.md", b"other conversation's report\n")
    return other


# -- scopes --------------------------------------------------------------------------------------------


def test_a_scope_that_was_never_created_has_no_files(workspace: LocalWorkspace | S3Workspace) -> None:
    # Given a conversation nobody created
    ghost = ConversationScope(conversation_id="ghost")

    # When it is read, stat'ed, listed and put into blob storage
    # Then it simply has no files
    with pytest.raises(FileNotFoundError):
        workspace.read_bytes(ghost, "reports/a.md")
    with pytest.raises(FileNotFoundError):
        workspace.put_blob(ghost, "reports/a.md")
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
    adapter: Adapter, scope: ConversationScope, other: ConversationScope, path: str
) -> None:
    # Given two conversations and a snapshot of everything stored
    workspace = adapter.workspace
    before = adapter.stored()

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

    # ... and nothing was read into a blob or written anywhere, in this scope or another
    assert adapter.stored() == before


def test_percent_encoded_dots_are_a_literal_name_that_stays_inside_the_scope(
    adapter: Adapter, scope: ConversationScope, other: ConversationScope
) -> None:
    # Given another conversation holding datasets/x.csv, and a percent-encoded traversal
    workspace = adapter.workspace
    literal = "..%2F..%2Fconv-OTHER%2Fdatasets%2Fx.csv"

    # When it is used: percent-encoding is never decoded (check_workspace_path), so it is one literal
    # file name at the top of *this* scope
    # Then reading it does not reach the other conversation's file
    with pytest.raises(FileNotFoundError):
        workspace.read_bytes(scope, literal)
    assert workspace.stat(scope, literal) is None

    # And writing it creates exactly one file, inside this scope, under that literal name
    workspace.write_bytes(scope, literal, b"mine")
    stored = adapter.stored()
    assert stored[f"conversations/c1/{literal}"] == b"mine"
    assert stored["conversations/conv-OTHER/datasets/x.csv"] == b"other conversation's data\n"
    assert workspace.read_bytes(scope, literal) == b"mine"
    assert [info.path for info in workspace.list_files(scope)] == [literal]


def test_the_1024_byte_key_limit_counts_utf8_bytes_of_the_full_key(
    workspace: LocalWorkspace | S3Workspace, scope: ConversationScope
) -> None:
    # Given paths whose full key "conversations/c1/<path>" is exactly 1,024 and 1,025 UTF-8 bytes
    # (segments of 2-byte 'é's, each within the 255-byte segment limit, so characters and bytes differ)
    at_limit = "reports/" + "/".join(["é" * 120] * 4) + "/" + "f" * 35
    assert len(("conversations/c1/" + at_limit).encode()) == 1024
    assert len("conversations/c1/" + at_limit) < 1000
    over_limit = at_limit + "g"

    # When both are written
    workspace.write_bytes(scope, at_limit, b"fits")

    # Then the 1,024-byte key is stored and reads back, the 1,025-byte one is refused for every use
    assert workspace.read_bytes(scope, at_limit) == b"fits"
    with pytest.raises(PathRuleError, match="1024"):
        workspace.write_bytes(scope, over_limit, b"too long")
    with pytest.raises(PathRuleError):
        workspace.read_bytes(scope, over_limit)


def test_a_segment_over_the_255_byte_name_limit_is_never_found_and_never_written(
    workspace: LocalWorkspace | S3Workspace, scope: ConversationScope
) -> None:
    # Given a path whose last segment is 256 bytes, more than a local file name may hold
    path = "reports/" + "n" * 256

    # When it is written, read and stat'ed
    # Then each is refused with a rule error naming the limit (one rule on disk and on S3, so every
    # object of a scope can be synced to a working copy)
    for operation in (
        lambda: workspace.write_bytes(scope, path, b"x"),
        lambda: workspace.read_bytes(scope, path),
        lambda: workspace.stat(scope, path),
    ):
        with pytest.raises(PathRuleError, match="255"):
            operation()


def test_an_nfd_spelling_finds_the_nfc_file_and_it_is_stored_nfc(
    adapter: Adapter, scope: ConversationScope
) -> None:
    # Given a file written under its decomposed (NFD) spelling
    workspace = adapter.workspace
    nfc = "reports/café.md"
    nfd = unicodedata.normalize("NFD", nfc)
    assert nfd != nfc
    workspace.write_bytes(scope, nfd, b"cafe")

    # When it is looked up under either spelling
    # Then both find it, and it is stored and listed under the composed (NFC) name only
    assert workspace.read_bytes(scope, nfc) == b"cafe"
    assert workspace.read_bytes(scope, nfd) == b"cafe"
    info = workspace.stat(scope, nfd)
    assert info is not None and info.path == nfc and info.size_bytes == 4
    assert [key for key in adapter.stored() if key.startswith("conversations/c1/reports/")] == [
        f"conversations/c1/{nfc}"
    ]
    assert [item.path for item in workspace.list_files(scope)] == [nfc]


# -- writes and listing --------------------------------------------------------------------------------


def test_write_bytes_replaces_the_file_and_an_open_reader_keeps_the_version_it_opened(
    adapter: Adapter, scope: ConversationScope
) -> None:
    # Given a report and a reader that opened its first version
    workspace = adapter.workspace
    workspace.write_bytes(scope, "reports/a.md", b"version 1\n" * 1000)
    reader = workspace.open_file(scope, "reports/a.md")

    # When the report is rewritten
    workspace.write_bytes(scope, "reports/a.md", b"version 2\n")

    # Then the open reader still sees the whole first version, new reads see the second, and the
    # folder holds nothing but the report (no temporary file or key, no partial object)
    with reader:
        assert reader.read() == b"version 1\n" * 1000
    assert workspace.read_bytes(scope, "reports/a.md") == b"version 2\n"
    assert [key for key in adapter.stored() if key.startswith("conversations/c1/reports/")] == [
        "conversations/c1/reports/a.md"
    ]


def test_write_bytes_creates_missing_parent_folders(
    workspace: LocalWorkspace | S3Workspace, scope: ConversationScope
) -> None:
    # Given a scope without a reports/2024/q1 folder
    # When a report is written there
    workspace.write_bytes(scope, "reports/2024/q1/summary.md", b"# Q1\n")

    # Then the file reads back and is listed
    assert workspace.read_bytes(scope, "reports/2024/q1/summary.md") == b"# Q1\n"
    assert [info.path for info in workspace.list_files(scope, "reports")] == ["reports/2024/q1/summary.md"]


def test_list_files_is_sorted_and_filtered_by_whole_folder_components(
    workspace: LocalWorkspace | S3Workspace, scope: ConversationScope
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


UNADDRESSABLE_NAMES = ("back\\slash.md", "new\nline.md", unicodedata.normalize("NFD", "café.md"))
"""Names user code or another client can store that no workspace method could address."""


def test_names_no_workspace_method_could_address_are_not_listed_and_are_reported(
    adapter: Adapter, scope: ConversationScope
) -> None:
    # Given files stored by other means under names that break the path rules or are not NFC
    for name in UNADDRESSABLE_NAMES:
        adapter.plant(scope, f"reports/{name}", b"x")
    adapter.workspace.write_bytes(scope, "reports/ok.md", b"ok")

    # When the scope is listed, asking what was left out
    skipped: list[tuple[str, str]] = []
    files = adapter.workspace.list_files(scope, skipped=skipped)

    # Then only the addressable file is listed (every listed path can be read back), and each other
    # name is reported with a reason
    assert [info.path for info in files] == ["reports/ok.md"]
    assert sorted(path for path, _ in skipped) == sorted(f"reports/{name}" for name in UNADDRESSABLE_NAMES)
    assert all(reason for _, reason in skipped)


# -- blobs --------------------------------------------------------------------------------------------


def test_put_blob_stores_a_content_addressed_copy(adapter: Adapter, scope: ConversationScope) -> None:
    # Given a chart
    content = b"\x89PNG fake chart bytes"
    adapter.workspace.write_bytes(scope, "charts/plot.png", content)

    # When it is put into blob storage
    digest, size = adapter.workspace.put_blob(scope, "charts/plot.png")

    # Then the blob is named by its sha256 under blobs/sha256/<ab>/, sized in bytes, and reads back
    assert digest == hashlib.sha256(content).hexdigest()
    assert size == len(content)
    assert adapter.stored()[f"blobs/sha256/{digest[:2]}/{digest}"] == content
    assert adapter.workspace.read_blob(digest) == content


def test_a_blob_keeps_its_bytes_when_the_file_changes_and_is_never_rewritten(
    adapter: Adapter, scope: ConversationScope
) -> None:
    # Given a dataset registered as a blob
    workspace = adapter.workspace
    workspace.write_bytes(scope, "datasets/a.csv", b"v1\n")
    first, _ = workspace.put_blob(scope, "datasets/a.csv")
    key = f"blobs/sha256/{first[:2]}/{first}"
    identity = adapter.identity(key)

    # When the file changes and is registered again, and a copy of v1 elsewhere is registered too
    workspace.write_bytes(scope, "datasets/a.csv", b"v2\n")
    second, _ = workspace.put_blob(scope, "datasets/a.csv")
    workspace.write_bytes(scope, "datasets/copy.csv", b"v1\n")
    again, _ = workspace.put_blob(scope, "datasets/copy.csv")

    # Then each version keeps its own bytes, and the v1 blob was not rewritten
    assert second != first and again == first
    assert workspace.read_blob(first) == b"v1\n"
    assert workspace.read_blob(second) == b"v2\n"
    assert adapter.identity(key) == identity


def test_an_empty_file_is_a_valid_blob(
    workspace: LocalWorkspace | S3Workspace, scope: ConversationScope
) -> None:
    # Given an empty file
    workspace.write_bytes(scope, "work/empty.txt", b"")

    # When it is put into blob storage
    # Then its digest is sha256 of nothing and it reads back empty
    assert workspace.put_blob(scope, "work/empty.txt") == (hashlib.sha256(b"").hexdigest(), 0)
    assert workspace.read_blob(hashlib.sha256(b"").hexdigest()) == b""


@pytest.mark.parametrize(
    "digest", ["0" * 64, "../../../../etc/passwd", "../../conversations/c1/reports/a.md", "A" * 64, "abc", ""]
)
def test_read_blob_of_an_unknown_or_malformed_digest_is_not_found(
    workspace: LocalWorkspace | S3Workspace, scope: ConversationScope, digest: str
) -> None:
    # Given a scope with a report (a key a malformed digest might try to reach)
    workspace.write_bytes(scope, "reports/a.md", b"a")

    # When an unknown or malformed digest is read
    # Then nothing is found, and nothing outside the blob store is ever reached
    with pytest.raises(FileNotFoundError):
        workspace.read_blob(digest)
