"""The AWS backend's conversation filesystem: one S3 bucket with exactly the local key layout (DESIGN §1,
§4.2).

Layout of the bucket ``alphaagent-workspaces-{account}-{region}`` (``workspaces_bucket_name``)::

    conversations/{conversation_id}/{spec,docs,datasets,charts,reports,work}/...
    workflows/{workflow_execution_id}/nodes/{node_id}/{spec,docs,...}/...
    blobs/sha256/{first two hex digits}/{64 hex digits}    immutable, written once

Every scope file is the object ``{scope.key}/{path}``; every ``path`` goes through
``check_workspace_path`` with the scope prefix, so the full key is NFC and at most 1,024 UTF-8 bytes
(S3's key limit).

Code runs in a local working copy (``local_root``): the env function's ``alphaagent.aws.sync`` keeps it
reconciled with the bucket (this adapter only names where it is).

Example::

    workspace = S3Workspace(workspaces_bucket_name("123456789012", "eu-west-1"), local_dir=Path("/tmp/ws"))
    scope = ConversationScope(conversation_id="c1")
    workspace.ensure_scope(scope)
    workspace.write_bytes(scope, "reports/summary.md", b"# Summary\\n")
    sha256, size = workspace.put_blob(scope, "reports/summary.md")
    workspace.read_blob(sha256)  # b"# Summary\\n"
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import re
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Final

from alphaagent.aws import sdk
from alphaagent.domain.names import unaddressable_reason
from alphaagent.errors import FileChangedError, PathRuleError
from alphaagent.models.common import SCOPE_FOLDERS, Scope, check_workspace_path
from alphaagent.ports import FileInfo

MiB: Final = 2**20

BLOB_PREFIX: Final = "blobs/sha256/"
"""Key prefix of content-addressed storage, beside ``conversations/`` and ``workflows/``."""

COPY_PART_BYTES: Final = 64 * MiB
"""Part size of boto3's managed copy of a blob larger than ``MAX_COPY_BYTES`` (at 5 GiB and up, at
most ~80 parts of the 10,000 S3 allows per upload until 625 GiB)."""

MAX_COPY_BYTES: Final = 5 * 1024 * MiB
"""The largest object a single CopyObject can copy (5 GiB, an S3 limit); larger blobs are copied by
boto3's managed (multipart) copy."""

HASH_BLOCK_BYTES: Final = MiB
"""``put_blob`` hashes the object in 1 MiB blocks: memory stays constant whatever its size."""

_SHA256_HEX: Final = re.compile(r"[0-9a-f]{64}")
_MISSING_CODES: Final = frozenset({"NoSuchKey", "404", "NotFound"})
_PRECONDITION_CODES: Final = frozenset({"PreconditionFailed", "412", "ConditionalRequestConflict"})
_CONFLICT_CODES: Final = frozenset({"ConditionalRequestConflict"})

CONFLICT_ATTEMPTS: Final = 3
"""``create_exclusive`` puts at most this many times while S3 answers 409 ``ConditionalRequestConflict``."""
CONFLICT_PAUSE_S: Final = 0.1
"""Seconds before the second put after a 409 conflict (twice that before the third)."""


def workspaces_bucket_name(account: str, region: str) -> str:
    """The workspaces bucket of a deployment: ``alphaagent-workspaces-{account}-{region}`` (DESIGN §1)."""
    return f"alphaagent-workspaces-{account}-{region}"


class S3Workspace:
    """``alphaagent.ports.Workspace`` on S3: scope files at ``{scope.key}/{path}`` in ``bucket``.

    Semantics mirror ``LocalWorkspace``:

    * every ``path`` is checked and NFC-normalised by ``check_workspace_path`` against the full key (at
      most 1,024 UTF-8 bytes), raising ``PathRuleError`` before any request is made;
    * ``write_bytes`` is one PutObject, which S3 makes visible atomically: a reader sees the old object
      or the new one, never a mix, and a failed write leaves the old one;
    * ``list_files`` pages through ListObjectsV2 and lists only keys that a method could address (not
      the folder markers of ``ensure_scope``, not names breaking a rule or not NFC);
    * blobs are immutable: written once under ``blobs/sha256/<ab>/<hex>`` (``IfNoneMatch="*"``), never
      rewritten.

    Args:
        bucket: the workspaces bucket (``workspaces_bucket_name``).
        client: a boto3 S3 client; created on first use (``boto3.client("s3")``) when None.
        local_dir: where ``local_root`` places local working copies (the env Lambda's ``/tmp``);
            default ``<tempdir>/alphaagent-workspaces``.
    """

    def __init__(
        self,
        bucket: str,
        *,
        client: Any = None,
        local_dir: Path | None = None,
    ) -> None:
        self.bucket = bucket
        self._client = client
        default_dir = Path(tempfile.gettempdir()) / "alphaagent-workspaces"
        self.local_dir = (Path(local_dir) if local_dir is not None else default_dir).absolute()

    @property
    def client(self) -> Any:
        """The S3 client, created on first use (nothing is created at import or construction)."""
        if self._client is None:
            self._client = sdk.client("s3")
        return self._client

    def _copy_config(self) -> Any:
        transfer = importlib.import_module("boto3.s3.transfer")
        return transfer.TransferConfig(
            multipart_threshold=COPY_PART_BYTES, multipart_chunksize=COPY_PART_BYTES
        )

    # -- scopes ------------------------------------------------------------------------------------

    def ensure_scope(self, scope: Scope) -> None:
        """Create the six folders of the scope as zero-byte folder markers (``{scope.key}/{folder}/``,
        what the S3 console's "Create folder" makes) if missing; idempotent. Markers are written with
        ``IfNoneMatch="*"`` so repeated calls add no object versions. Markers are never listed as files.
        """
        for folder in SCOPE_FOLDERS:
            try:
                self.client.put_object(
                    Bucket=self.bucket, Key=f"{scope.key}/{folder}/", Body=b"", IfNoneMatch="*"
                )
            except sdk.client_error() as error:
                if sdk.error_code(error) not in _PRECONDITION_CODES:
                    raise

    def scope_exists(self, scope: Scope) -> bool:
        """True when any object (a folder marker or a file) exists under ``{scope.key}/``."""
        response = self.client.list_objects_v2(Bucket=self.bucket, Prefix=f"{scope.key}/", MaxKeys=1)
        return int(response.get("KeyCount", 0)) > 0

    def local_root(self, scope: Scope) -> Path:
        """``local_dir/<scope.key>``: the local working copy where code runs. Not created here: the env
        function's ``alphaagent.aws.sync.WorkingCopies`` fills it and sends the run's changes back."""
        return self.local_dir / scope.key

    # -- files -------------------------------------------------------------------------------------

    def read_bytes(self, scope: Scope, path: str) -> bytes:
        """The whole content of the object ``{scope.key}/{path}``.

        Raises:
            PathRuleError: ``path`` breaks a rule of DESIGN §4.2.
            FileNotFoundError: no such object.
        """
        with self.open_file(scope, path) as reader:
            return reader.read()

    def open_file(self, scope: Scope, path: str) -> BinaryIO:
        """A streaming binary reader of the object (one GetObject: later writes to the key do not
        change what it returns); the caller closes it.

        Raises:
            PathRuleError: ``path`` breaks a rule of DESIGN §4.2.
            FileNotFoundError: no such object.
        """
        key = self._key(scope, path)
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=key)
        except sdk.client_error() as error:
            if sdk.error_code(error) in _MISSING_CODES:
                raise FileNotFoundError(f"no file {path!r} in scope {scope.key!r}") from None
            raise
        body: BinaryIO = response["Body"]
        return body

    def write_bytes(self, scope: Scope, path: str, data: bytes) -> None:
        """Replace the object ``{scope.key}/{path}`` with ``data`` in one PutObject (atomic in S3; at
        most 5 GiB, S3's single-PUT limit). S3 has no folders to create.

        Raises:
            PathRuleError: ``path`` breaks a rule of DESIGN §4.2. Nothing is written in that case.
        """
        key = self._key(scope, path)
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data)

    def create_exclusive(self, scope: Scope, path: str, data: bytes) -> bool:
        """Create the object ``{scope.key}/{path}`` with ``data`` only if no object has that key: True
        if this call created it, False if one existed already (which is then left as it was).

        A conditional PutObject (``IfNoneMatch="*"``): S3 checks and writes atomically, so of concurrent
        callers at most one gets True. S3 answers "the key exists" with ``PreconditionFailed`` (HTTP
        412): False. It answers ``ConditionalRequestConflict`` (HTTP 409) while another operation on the
        key is in flight, and advises a retry: the put is retried up to ``CONFLICT_ATTEMPTS`` times in
        all, ``CONFLICT_PAUSE_S`` seconds apart, and a conflict that persists is False as well (never
        two callers with True). The env function claims a run with it: two deliveries of one
        asynchronous event may run at the same time.

        Raises:
            PathRuleError: ``path`` breaks a rule of DESIGN §4.2. Nothing is written in that case.
            botocore errors: any other S3 failure.
        """
        key = self._key(scope, path)
        for attempt in range(1, CONFLICT_ATTEMPTS + 1):
            try:
                self.client.put_object(Bucket=self.bucket, Key=key, Body=data, IfNoneMatch="*")
            except sdk.client_error() as error:
                code = sdk.error_code(error)
                if code not in _PRECONDITION_CODES:
                    raise
                if code not in _CONFLICT_CODES or attempt == CONFLICT_ATTEMPTS:
                    return False
                time.sleep(CONFLICT_PAUSE_S * attempt)
            else:
                return True
        return False  # not reached: the last attempt returns in the loop

    def stat(self, scope: Scope, path: str) -> FileInfo | None:
        """The ``FileInfo`` of the object (HeadObject), or None if there is none.

        Raises:
            PathRuleError: ``path`` breaks a rule of DESIGN §4.2.
        """
        key = self._key(scope, path)
        try:
            response = self.client.head_object(Bucket=self.bucket, Key=key)
        except sdk.client_error() as error:
            if sdk.error_code(error) in _MISSING_CODES:
                return None
            raise
        return FileInfo(
            path=key[len(scope.key) + 1 :],
            size_bytes=int(response["ContentLength"]),
            modified_at=_utc(response["LastModified"]),
        )

    def list_files(
        self, scope: Scope, prefix: str = "", skipped: list[tuple[str, str]] | None = None
    ) -> list[FileInfo]:
        """Files of the scope below the folder ``prefix`` ('' for all), sorted by path.

        ``prefix`` is a folder path matched by whole components (``"reports"`` does not match
        ``reports2/``); one trailing '/' is accepted. Pages through ListObjectsV2 (1,000 keys a page).
        Folder markers and keys no method could address (not NFC, breaking a rule) are left out; when
        ``skipped`` is given, each such key (not the markers) is appended to it as ``(path, reason)``
        (S3 keys are always UTF-8, so the path is shown as it is).

        Raises:
            PathRuleError: ``prefix`` breaks a rule of DESIGN §4.2.
        """
        folder = prefix[:-1] if prefix.endswith("/") else prefix
        scope_prefix = f"{scope.key}/"
        key_prefix = scope_prefix + (self._path(scope, folder) + "/" if folder else "")
        files: list[FileInfo] = []
        for item in self._iter_objects(key_prefix):
            path = item["Key"][len(scope_prefix) :]
            if _addressable(path, scope_prefix):
                files.append(
                    FileInfo(path=path, size_bytes=int(item["Size"]), modified_at=_utc(item["LastModified"]))
                )
            elif skipped is not None and not _folder_marker(path):
                skipped.append((path, unaddressable_reason(path, key_prefix=scope_prefix)))
        files.sort(key=lambda info: info.path)
        return files

    # -- blobs -------------------------------------------------------------------------------------

    def put_blob(self, scope: Scope, path: str) -> tuple[str, int]:
        """Copy the object ``{scope.key}/{path}`` into content-addressed storage; return
        ``(sha256 hex, size in bytes)``.

        The object is streamed once and hashed in 1 MiB blocks (constant memory), then copied server
        side to ``blobs/sha256/<ab>/<hex>``, pinned to the version (or ETag) that was hashed, so the
        blob holds exactly the hashed bytes even if the file changes meanwhile. A blob that exists
        already is kept, never rewritten (HeadObject first, and ``IfNoneMatch="*"`` on the copy against
        a concurrent writer).

        Raises:
            PathRuleError: ``path`` breaks a rule of DESIGN §4.2.
            FileNotFoundError: no such object.
            FileChangedError: the object changed between hashing and copying (unversioned bucket).
        """
        key = self._key(scope, path)
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=key)
        except sdk.client_error() as error:
            if sdk.error_code(error) in _MISSING_CODES:
                raise FileNotFoundError(f"no file {path!r} in scope {scope.key!r}") from None
            raise
        digest = hashlib.sha256()
        size = 0
        with contextlib.closing(response["Body"]) as body:
            while chunk := body.read(HASH_BLOCK_BYTES):
                digest.update(chunk)
                size += len(chunk)
        sha256 = digest.hexdigest()
        blob_key = _blob_key(sha256)
        if self._exists(blob_key):
            return sha256, size
        source: dict[str, str] = {"Bucket": self.bucket, "Key": key}
        version_id = response.get("VersionId")
        if version_id and version_id != "null":
            source["VersionId"] = version_id
        etag = str(response["ETag"])
        if size <= MAX_COPY_BYTES:
            try:
                self.client.copy_object(
                    Bucket=self.bucket,
                    Key=blob_key,
                    CopySource=source,
                    CopySourceIfMatch=etag,
                    IfNoneMatch="*",
                )
            except sdk.client_error() as error:
                if sdk.error_code(error) not in _PRECONDITION_CODES:
                    raise
                # IfNoneMatch: a concurrent writer stored the same bytes first, which is fine.
                # CopySourceIfMatch: the file changed after it was hashed; nothing is stored.
                if not self._exists(blob_key):
                    raise FileChangedError(
                        f"{path!r} in scope {scope.key!r} changed while it was being stored; retry"
                    ) from None
        else:
            self.client.copy(
                source,
                self.bucket,
                blob_key,
                ExtraArgs={"CopySourceIfMatch": etag},
                Config=self._copy_config(),
            )
        return sha256, size

    def read_blob(self, sha256: str) -> bytes:
        """The bytes stored under the lowercase hex digest ``sha256``.

        Raises:
            FileNotFoundError: no blob under that digest; also for anything that is not 64 lowercase
                hex digits (so no digest names a key outside the blob store).
        """
        with contextlib.closing(self.open_blob(sha256)) as body:
            data: bytes = body.read()
        return data

    def open_blob(self, sha256: str) -> BinaryIO:
        """A streaming reader of the blob stored under ``sha256`` (one GetObject; the caller closes
        it), so a dataset's profile reads only what it needs (a csv's first 4 MiB, not the whole
        object into memory); ``FileNotFoundError`` as for ``read_blob``."""
        if not _SHA256_HEX.fullmatch(sha256):
            raise FileNotFoundError(f"no blob stored under {sha256!r}")
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=_blob_key(sha256))
        except sdk.client_error() as error:
            if sdk.error_code(error) in _MISSING_CODES:
                raise FileNotFoundError(f"no blob stored under {sha256!r}") from None
            raise
        body: BinaryIO = response["Body"]
        return body

    def drop_session_state(self, scope: Scope, session_id: str) -> None:
        """Delete every object of ``work/sessions/{session_id}/`` (the session ended, DESIGN §4.7),
        the manifest first. An id that could not name a folder has no state."""
        from alphaagent.aws.session_state import drop_state_objects  # it imports this module
        from alphaagent.sandbox.session import valid_session_id

        if valid_session_id(session_id):
            drop_state_objects(self, scope, session_id)

    def delete(self, scope: Scope, path: str) -> None:
        """Delete the object ``{scope.key}/{path}`` (DeleteObject; in a versioned bucket a delete
        marker, so the bytes stay recoverable). Deleting a missing file is not an error.

        Raises:
            PathRuleError: ``path`` breaks a rule of DESIGN §4.2. Nothing is deleted in that case.
        """
        self.client.delete_object(Bucket=self.bucket, Key=self._key(scope, path))

    # -- helpers -----------------------------------------------------------------------------------

    def _path(self, scope: Scope, path: str) -> str:
        return check_workspace_path(path, prefix=f"{scope.key}/")

    def _key(self, scope: Scope, path: str) -> str:
        return f"{scope.key}/{self._path(scope, path)}"

    def _exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=key)
        except sdk.client_error() as error:
            if sdk.error_code(error) in _MISSING_CODES:
                return False
            raise
        return True

    def _iter_objects(self, key_prefix: str) -> Iterator[dict[str, Any]]:
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=key_prefix):
            yield from page.get("Contents", [])


def _folder_marker(path: str) -> bool:
    """True for the zero-byte ``{folder}/`` objects of ``ensure_scope``."""
    return path.endswith("/") and "//" not in path and path[:-1] in SCOPE_FOLDERS


def _blob_key(sha256: str) -> str:
    return f"{BLOB_PREFIX}{sha256[:2]}/{sha256}"


def _addressable(path: str, scope_prefix: str) -> bool:
    """True when ``path`` is the canonical spelling of a valid workspace path (folder markers, which
    end in '/', are not)."""
    try:
        return check_workspace_path(path, prefix=scope_prefix) == path
    except PathRuleError:
        return False


def _utc(moment: datetime) -> datetime:
    return moment.astimezone(UTC) if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


if TYPE_CHECKING:
    from alphaagent.ports import Workspace

    # mypy proves here that S3Workspace satisfies the Workspace Protocol.
    _WORKSPACE_PROTOCOL_CHECK: type[Workspace] = S3Workspace
