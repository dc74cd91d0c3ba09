"""What only the S3 conversation filesystem shows, under moto (DESIGN §4.2): the key layout, one object
version per write, paging, multipart uploads, blob copies pinned to a version, and the env function's
working copy (``alphaagent.aws.sync``) that never follows a symlink (PATH-01). The behaviour both Workspace adapters share (path rules,
NFC names, listing, blobs) is the contract suite, tests/integration/test_workspace_contract.py."""

from __future__ import annotations

import hashlib
import os
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from moto_account import MotoAccount

from alphaagent.aws.sync import SKIP_NOT_REGULAR, SKIP_PATH_RULE, SkippedFile, WorkingCopies
from alphaagent.aws.workspace import S3Workspace, workspaces_bucket_name
from alphaagent.errors import FileChangedError, RetryableError
from alphaagent.local import safefs
from alphaagent.models.common import ConversationScope, NodeScope

MiB = 2**20
BUCKET = workspaces_bucket_name("123456789012", "us-east-1")


@pytest.fixture
def s3(moto: MotoAccount) -> Any:
    """The S3 client of the moto account, with the versioned workspaces bucket."""
    return moto.bucket(BUCKET, versioned=True)


@pytest.fixture
def workspace(s3: Any, tmp_path: Path) -> S3Workspace:
    return S3Workspace(BUCKET, client=s3, local_dir=tmp_path / "work")


@pytest.fixture
def copies(workspace: S3Workspace) -> WorkingCopies:
    """The env function's working copies of ``workspace``, with multipart transfers from 5 MiB."""
    return WorkingCopies(workspace, multipart_bytes=5 * MiB)


@pytest.fixture
def scope(workspace: S3Workspace) -> ConversationScope:
    scope = ConversationScope(conversation_id="c1")
    workspace.ensure_scope(scope)
    return scope


@pytest.fixture
def other(workspace: S3Workspace) -> ConversationScope:
    other = ConversationScope(conversation_id="conv-OTHER")
    workspace.ensure_scope(other)
    workspace.write_bytes(other, "datasets/x.csv", b"other conversation's data\n")
    workspace.write_bytes(other, "reports/leak.md", b"other conversation's report\n")
    return other


def bucket_contents(s3: Any) -> dict[str, bytes]:
    """Every current object of the bucket, key -> bytes."""
    found: dict[str, bytes] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        for item in page.get("Contents", []):
            found[item["Key"]] = s3.get_object(Bucket=BUCKET, Key=item["Key"])["Body"].read()
    return found


def version_count(s3: Any, key: str) -> int:
    versions = s3.list_object_versions(Bucket=BUCKET, Prefix=key).get("Versions", [])
    return sum(1 for version in versions if version["Key"] == key)


# -- layout and scopes -----------------------------------------------------------------------------


def test_files_are_stored_at_exactly_the_scope_key_and_path(s3: Any, workspace: S3Workspace) -> None:
    # Given a conversation and a workflow node that do not exist yet
    conversation = ConversationScope(conversation_id="c1")
    node = NodeScope(workflow_execution_id="wf1", node_id="n1")
    assert workspace.scope_exists(conversation) is False

    # When both are ensured (twice) and written to
    for _ in range(2):
        workspace.ensure_scope(conversation)
        workspace.ensure_scope(node)
    workspace.write_bytes(conversation, "datasets/x.csv", b"a,b\n1,2\n")
    workspace.write_bytes(node, "reports/r.md", b"# r\n")

    # Then the objects are {scope.key}/{path}, the six folder markers exist once each, and read back
    contents = bucket_contents(s3)
    assert contents["conversations/c1/datasets/x.csv"] == b"a,b\n1,2\n"
    assert contents["workflows/wf1/nodes/n1/reports/r.md"] == b"# r\n"
    assert workspace.scope_exists(conversation) and workspace.scope_exists(node)
    folders = ("spec", "docs", "datasets", "charts", "reports", "work")
    assert all(version_count(s3, f"conversations/c1/{folder}/") == 1 for folder in folders)
    assert workspace.read_bytes(node, "reports/r.md") == b"# r\n"
    assert [info.path for info in workspace.list_files(conversation)] == ["datasets/x.csv"]


def test_the_client_is_created_on_first_use_from_the_environment(s3: Any, tmp_path: Path) -> None:
    # Given a workspace constructed with no client (as a Lambda builds it from its settings)
    workspace = S3Workspace(BUCKET, local_dir=tmp_path)
    scope = ConversationScope(conversation_id="c1")

    # When it is used
    workspace.write_bytes(scope, "reports/a.md", b"a")

    # Then it reached the bucket through a client of its own
    assert s3.get_object(Bucket=BUCKET, Key="conversations/c1/reports/a.md")["Body"].read() == b"a"


def test_a_multipart_size_below_the_s3_minimum_part_is_refused(tmp_path: Path) -> None:
    # Given a multipart size under S3's 5 MiB minimum part size
    # When the working copies are configured with it
    # Then it is refused, naming the limit
    with pytest.raises(ValueError, match=str(5 * MiB)):
        WorkingCopies(S3Workspace(BUCKET, local_dir=tmp_path), multipart_bytes=MiB)


# -- writes and listing --------------------------------------------------------------------------------


def test_each_write_is_one_put_of_one_object_version(
    s3: Any, workspace: S3Workspace, scope: ConversationScope
) -> None:
    # Given a report written once
    workspace.write_bytes(scope, "reports/a.md", b"version 1\n" * 1000)

    # When the report is rewritten
    workspace.write_bytes(scope, "reports/a.md", b"version 2\n")

    # Then each write made exactly one object version (no temporary keys, no partial objects)
    assert version_count(s3, "conversations/c1/reports/a.md") == 2


def test_list_files_pages_through_more_than_one_thousand_keys(
    s3: Any, moto: MotoAccount, workspace: S3Workspace, scope: ConversationScope
) -> None:
    # Given 1,005 files in one folder (ListObjectsV2 returns at most 1,000 keys a page), put straight
    # into moto's bucket: the listing below is what goes through the API
    names = [f"work/f{index:04d}.txt" for index in range(1005)]
    moto.seed_objects(BUCKET, {f"conversations/c1/{name}": b"x" for name in names})
    pages = s3.list_objects_v2(Bucket=BUCKET, Prefix="conversations/c1/work/")
    assert pages["KeyCount"] == 1000 and pages["IsTruncated"], "the folder must not fit one page"

    # When the folder is listed
    # Then every file comes back, in order
    assert [info.path for info in workspace.list_files(scope, "work")] == names


def test_a_key_with_an_empty_segment_is_not_listed_and_is_reported(
    s3: Any, workspace: S3Workspace, scope: ConversationScope
) -> None:
    # Given an object put into the scope by another client under a key with an empty segment (no
    # local file name can be one; the names both adapters refuse are in the contract suite)
    s3.put_object(Bucket=BUCKET, Key="conversations/c1/reports/a//b.md", Body=b"x")
    workspace.write_bytes(scope, "reports/ok.md", b"ok")

    # When the scope is listed, asking what was left out
    skipped: list[tuple[str, str]] = []
    files = workspace.list_files(scope, skipped=skipped)

    # Then only the addressable file is listed, the other key is reported, and the folder markers of
    # ensure_scope are neither listed nor reported
    assert [info.path for info in files] == ["reports/ok.md"]
    assert [path for path, _ in skipped] == ["reports/a//b.md"]


# -- the env function's working copy: sync down, sync up (PATH-01) ---------------------------------------


def test_sync_down_never_writes_through_a_symlink_in_the_working_copy(
    workspace: S3Workspace, copies: WorkingCopies, scope: ConversationScope, tmp_path: Path
) -> None:
    # Given a working copy where earlier code planted links: a file link and a linked folder
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "target.txt").write_bytes(b"MARKER")
    root = workspace.local_root(scope)
    (root / "docs").mkdir(parents=True)
    os.symlink(outside / "target.txt", root / "docs/a.txt")
    os.symlink(outside, root / "datasets")
    workspace.write_bytes(scope, "docs/a.txt", b"from s3")
    workspace.write_bytes(scope, "datasets/b.csv", b"from s3")

    # When the scope is synced down, cold (no record of the copy) and again warm after new links
    cold = copies.sync_down(scope, max_bytes=MiB)
    os.symlink(outside / "target.txt", root / "reports/planted.md")
    (root / "docs/a.txt").unlink()
    os.symlink(outside / "target.txt", root / "docs/a.txt")
    warm = copies.sync_down(scope, max_bytes=MiB)

    # Then the links were removed, never followed: the files are S3's, and nothing outside changed
    assert (cold.transferred, cold.skipped) == (["datasets/b.csv", "docs/a.txt"], [])
    assert (warm.transferred, warm.skipped, warm.kept) == (["docs/a.txt"], [], 1)
    for path in ("docs/a.txt", "datasets/b.csv"):
        assert not (root / path).is_symlink() and (root / path).read_bytes() == b"from s3"
    assert not os.path.lexists(root / "reports/planted.md")
    assert sorted(os.listdir(outside)) == ["target.txt"]
    assert (outside / "target.txt").read_bytes() == b"MARKER"


def test_sync_up_uploads_regular_files_only_and_reports_links_and_bad_paths(
    s3: Any,
    workspace: S3Workspace,
    copies: WorkingCopies,
    scope: ConversationScope,
    other: ConversationScope,
) -> None:
    # Given a working copy where user code wrote a report and planted the PATH-01 links and a FIFO
    root = workspace.local_root(scope)
    for folder in ("reports", "work", "datasets"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    (root / "reports/real.md").write_bytes(b"# real\n")
    os.symlink("/proc/self/environ", root / "reports/env.txt")
    os.symlink("/usr", root / "work/runner_src")
    os.symlink("/etc/passwd", root / "datasets/users.csv")
    os.mkfifo(root / "work/pipe")
    before = bucket_contents(s3)

    # When the run's changed paths (as the sandbox reported them) are synced up
    report = copies.sync_up(
        scope,
        [
            "reports/real.md",
            "reports/env.txt",
            "work/runner_src/lib/os.py",
            "datasets/users.csv",
            "work/pipe",
            "../../conv-OTHER/reports/leak.md",
        ],
    )

    # Then only the regular file is uploaded; every other name is skipped and reported
    assert report.transferred == ["reports/real.md"]
    assert sorted(report.skipped, key=lambda item: item.path) == [
        SkippedFile("../../conv-OTHER/reports/leak.md", SKIP_PATH_RULE),
        SkippedFile("datasets/users.csv", SKIP_NOT_REGULAR),
        SkippedFile("reports/env.txt", SKIP_NOT_REGULAR),
        SkippedFile("work/pipe", SKIP_NOT_REGULAR),
        SkippedFile("work/runner_src/lib/os.py", SKIP_NOT_REGULAR),
    ]
    after = bucket_contents(s3)
    assert after.pop("conversations/c1/reports/real.md") == b"# real\n"
    assert after == before


def test_sync_up_reports_a_file_the_run_made_unreadable_and_uploads_the_rest(
    workspace: S3Workspace,
    copies: WorkingCopies,
    scope: ConversationScope,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a working copy with two reports, one of which the run made unreadable (chmod 000; the
    # open fails as it would for the function's non-root user: root reads through any mode)
    root = workspace.local_root(scope)
    (root / "reports").mkdir(parents=True)
    (root / "reports/ok.md").write_bytes(b"ok")
    (root / "reports/locked.md").write_bytes(b"locked")
    real_open = safefs.open_regular

    def open_regular(dir_fd: int, parts: Sequence[str]) -> int:
        if parts[-1] == "locked.md":
            raise PermissionError(13, "Permission denied")
        return real_open(dir_fd, parts)

    monkeypatch.setattr(safefs, "open_regular", open_regular)

    # When both are synced up
    report = copies.sync_up(scope, ["reports/locked.md", "reports/ok.md"])

    # Then the readable one is uploaded and the other reported, not raised as a platform failure
    assert report.transferred == ["reports/ok.md"]
    assert [(item.path, item.reason) for item in report.skipped] == [("reports/locked.md", "not_readable")]


def test_sync_up_sends_a_large_file_by_multipart_upload(
    s3: Any, workspace: S3Workspace, copies: WorkingCopies, scope: ConversationScope
) -> None:
    # Given an 11 MiB dataset in the working copy and a 5 MiB multipart size
    root = workspace.local_root(scope)
    (root / "datasets").mkdir(parents=True)
    content = os.urandom(11 * MiB)
    (root / "datasets/big.bin").write_bytes(content)

    # When it is synced up
    report = copies.sync_up(scope, ["datasets/big.bin"])

    # Then it went in three parts (S3's ETag of a multipart object ends in -<parts>) and reads back whole
    assert report.transferred == ["datasets/big.bin"] and report.bytes_transferred == 11 * MiB
    head = s3.head_object(Bucket=BUCKET, Key="conversations/c1/datasets/big.bin")
    assert head["ETag"].strip('"').endswith("-3")
    info = workspace.stat(scope, "datasets/big.bin")
    assert info is not None and info.size_bytes == 11 * MiB
    assert hashlib.sha256(workspace.read_bytes(scope, "datasets/big.bin")).digest() == (
        hashlib.sha256(content).digest()
    )
    digest, size = workspace.put_blob(scope, "datasets/big.bin")
    assert (digest, size) == (hashlib.sha256(content).hexdigest(), 11 * MiB)


class ClientProxy:
    """The real (moto) S3 client, with ``get_object`` replaceable by a test."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_put_blob_copies_the_version_that_was_hashed_even_if_the_file_changes_meanwhile(
    s3: Any, tmp_path: Path
) -> None:
    # Given a versioned bucket and a file that user code rewrites right after put_blob has read it
    proxy = ClientProxy(s3)
    workspace = S3Workspace(BUCKET, client=proxy, local_dir=tmp_path)
    scope = ConversationScope(conversation_id="c1")
    workspace.write_bytes(scope, "datasets/a.csv", b"hashed\n")

    def get_then_rewrite(**kwargs: Any) -> Any:
        response = s3.get_object(**kwargs)
        s3.put_object(Bucket=BUCKET, Key=kwargs["Key"], Body=b"rewritten meanwhile\n")
        return response

    proxy.get_object = get_then_rewrite

    # When the file is put into blob storage
    digest, size = workspace.put_blob(scope, "datasets/a.csv")

    # Then the blob holds exactly the bytes its digest names
    assert (digest, size) == (hashlib.sha256(b"hashed\n").hexdigest(), 7)
    assert bucket_contents(s3)[f"blobs/sha256/{digest[:2]}/{digest}"] == b"hashed\n"


def test_put_blob_refuses_a_file_that_changed_before_its_copy_in_an_unversioned_bucket(
    s3: Any, tmp_path: Path
) -> None:
    # Given an unversioned bucket, where S3 answers the copy's CopySourceIfMatch with 412 because the
    # file was rewritten after put_blob hashed it
    s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Suspended"})
    proxy = ClientProxy(s3)
    workspace = S3Workspace(BUCKET, client=proxy, local_dir=tmp_path)
    scope = ConversationScope(conversation_id="c1")
    workspace.write_bytes(scope, "datasets/a.csv", b"hashed\n")

    def changed_source(**kwargs: Any) -> Any:
        from botocore.exceptions import ClientError

        assert kwargs["CopySourceIfMatch"] and "VersionId" not in kwargs["CopySource"]
        raise ClientError({"Error": {"Code": "PreconditionFailed", "Message": "At least one"}}, "CopyObject")

    proxy.copy_object = changed_source

    # When the file is put into blob storage
    # Then a retryable error names the file, and no blob is stored
    with pytest.raises(FileChangedError, match=r"datasets/a\.csv") as caught:
        workspace.put_blob(scope, "datasets/a.csv")
    assert isinstance(caught.value, RetryableError)
    assert not any(key.startswith("blobs/") for key in bucket_contents(s3))


class Zeros:
    """A streaming body of ``size`` zero bytes that never holds more than one read in memory."""

    def __init__(self, size: int) -> None:
        self.left = size

    def read(self, amount: int = -1) -> bytes:
        count = self.left if amount < 0 else min(amount, self.left)
        self.left -= count
        return bytes(count)

    def close(self) -> None:
        self.left = 0


def test_put_blob_hashes_in_constant_memory(s3: Any, tmp_path: Path) -> None:
    # Given a 64 MiB object, streamed by the client in the reads put_blob asks for
    proxy = ClientProxy(s3)
    workspace = S3Workspace(BUCKET, client=proxy, local_dir=tmp_path)
    scope = ConversationScope(conversation_id="c1")
    workspace.write_bytes(scope, "datasets/big.bin", b"placeholder")
    real_get = s3.get_object

    def streamed_get(**kwargs: Any) -> Any:
        response = real_get(**kwargs)
        if kwargs["Key"].endswith("datasets/big.bin"):
            response["Body"] = Zeros(64 * MiB)
        return response

    proxy.get_object = streamed_get

    # When it is hashed into blob storage while Python allocations are traced
    tracemalloc.start()
    try:
        digest, size = workspace.put_blob(scope, "datasets/big.bin")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    # Then the digest covers every byte and memory stayed near one 1 MiB block
    assert size == 64 * MiB
    assert digest == hashlib.sha256(bytes(64 * MiB)).hexdigest()
    assert peak < 4 * MiB
