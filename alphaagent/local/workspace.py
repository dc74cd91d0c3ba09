"""The local backend's conversation filesystem: a directory tree under ``$ALPHAAGENT_HOME`` with exactly
the S3 key layout (DESIGN §1, §4.2).

Layout::

    $ALPHAAGENT_HOME/
        conversations/{conversation_id}/{spec,docs,datasets,charts,reports,work}/...
        workflows/{workflow_execution_id}/nodes/{node_id}/{spec,docs,...}/...
        blobs/sha256/{first two hex digits}/{64 hex digits}    immutable, read-only (0o444)
        blobs/tmp/                                             blob copies in progress

User code runs with a scope root as its working directory and the same uid, so every name below the
home is treated as hostile: all access goes through ``alphaagent.local.safefs``, which reaches each
component relative to its parent with ``O_NOFOLLOW`` and never resolves a path string (cases PATH-01,
PATH-03). Only the home itself is trusted (it may be reached through a symlink the operator chose).

Example::

    workspace = LocalWorkspace(Path(".alphaagent"))
    scope = ConversationScope(conversation_id="c1")
    workspace.ensure_scope(scope)
    workspace.write_bytes(scope, "reports/summary.md", b"# Summary\\n")
    sha256, size = workspace.put_blob(scope, "reports/summary.md")
    workspace.read_blob(sha256)  # b"# Summary\\n"
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO, Final

from alphaagent.domain.names import unaddressable_reason
from alphaagent.errors import PathRuleError
from alphaagent.local import safefs
from alphaagent.models.common import SCOPE_FOLDERS, Scope, check_workspace_path
from alphaagent.ports import FileInfo
from alphaagent.sandbox.session import drop_state, valid_session_id

BLOBS_DIR: Final = "blobs"
"""Top-level folder of content-addressed storage, beside ``conversations/`` and ``workflows/``."""

_SHA256_HEX: Final = re.compile(r"[0-9a-f]{64}")


class LocalWorkspace:
    """``alphaagent.ports.Workspace`` on the local disk, rooted at ``home`` (``$ALPHAAGENT_HOME``).

    Scope files live at ``home/<scope.key>/<path>``; blobs at ``home/blobs/sha256/<ab>/<hex>``. Every
    ``path`` argument is checked with ``check_workspace_path`` against the full key
    ``<scope.key>/<path>`` (at most 1,024 UTF-8 bytes, S3's key limit) and NFC-normalised, so an NFD
    spelling finds the NFC file. On top of the S3 rules, the local filesystem limits each component to
    255 bytes (NAME_MAX): a longer one is never found and cannot be written.

    Symlinks are never followed at any component below the home, in either direction:

    * reads (``read_bytes``, ``open_file``, ``put_blob``) raise ``FileNotFoundError`` when a component
      is a symlink or not a directory, or the file is not a regular file; ``stat`` returns None;
    * writes (``write_bytes``) raise ``PathRuleError`` in the same situations, and never create,
      truncate or replace anything outside the scope;
    * ``list_files`` lists regular files only and never enters a symlinked directory.

    Args:
        home: the root of all local state; created on first write (mode 0o700) if missing.
    """

    def __init__(self, home: Path) -> None:
        self.home = Path(home).absolute()

    # -- scopes ------------------------------------------------------------------------------------

    def ensure_scope(self, scope: Scope) -> None:
        """Create the scope's root and its six folders (``SCOPE_FOLDERS``) if missing; idempotent.

        A folder that user code replaced by a symlink, a file or anything else is moved aside (renamed
        ``<folder>.displaced-<ns>``, never followed, never deleted) and made anew, so code cannot lock
        a conversation out of its own ``spec/`` or ``work/``.

        Raises:
            PathRuleError: a component of the scope's own key (``conversations/{id}``) is a symlink or
                not a directory.
        """
        with self._scope_dir(scope, create=True) as root:
            for folder in SCOPE_FOLDERS:
                info = safefs.lstat_at(root, [folder])
                if info is not None and not stat.S_ISDIR(info.st_mode):
                    os.rename(
                        folder, f"{folder}.displaced-{time.time_ns()}", src_dir_fd=root, dst_dir_fd=root
                    )
                with contextlib.suppress(FileExistsError):
                    os.mkdir(folder, 0o755, dir_fd=root)

    def scope_exists(self, scope: Scope) -> bool:
        """True when the scope's root is a directory reachable without following a symlink."""
        try:
            home = safefs.open_root(self.home)
        except FileNotFoundError:
            return False
        try:
            info = safefs.lstat_at(home, scope.key.split("/"))
        finally:
            os.close(home)
        return info is not None and stat.S_ISDIR(info.st_mode)

    def local_root(self, scope: Scope) -> Path:
        """``home/<scope.key>``: the scope itself, where code runs. Does not create it (see
        ``ensure_scope``)."""
        return self.home / scope.key

    def drop_session_state(self, scope: Scope, session_id: str) -> None:
        """Delete ``work/sessions/{session_id}/`` of the scope (the session ended, DESIGN §4.7);
        symlinks are removed, never followed. An id that could not name a folder has no state."""
        if valid_session_id(session_id):  # checked before any path is made of it
            drop_state(self.local_root(scope), session_id)

    # -- files -------------------------------------------------------------------------------------

    def read_bytes(self, scope: Scope, path: str) -> bytes:
        """The whole content of the regular file ``path`` of the scope.

        Raises:
            PathRuleError: ``path`` breaks a rule of DESIGN §4.2.
            FileNotFoundError: missing, not a regular file, or a symlink at any component.
        """
        with self.open_file(scope, path) as reader:
            return reader.read()

    def open_file(self, scope: Scope, path: str) -> BinaryIO:
        """A buffered binary reader of the regular file ``path``; the caller closes it.

        The file is opened once, without following any symlink; later renames or replacements of the
        name do not affect what the reader returns.

        Raises:
            PathRuleError: ``path`` breaks a rule of DESIGN §4.2.
            FileNotFoundError: missing, not a regular file, or a symlink at any component.
        """
        parts = self._parts(scope, path)
        with self._scope_dir(scope) as root:
            fd = safefs.open_regular(root, parts)
        return os.fdopen(fd, "rb")

    def write_bytes(self, scope: Scope, path: str, data: bytes) -> None:
        """Replace the file ``path`` with ``data`` atomically (temporary file in the same folder, fsync,
        rename), creating the scope and parent folders as needed. File mode 0o644 (before umask).

        Raises:
            PathRuleError: ``path`` breaks a rule of DESIGN §4.2, or cannot be written without following
                a symlink: a component is a symlink or a file, the target is a symlink or a directory,
                or a component is longer than 255 bytes. Nothing is written in that case.
        """
        parts = self._parts(scope, path)
        with self._scope_dir(scope, create=True) as root:
            try:
                safefs.write_atomic(root, parts, data)
            except OSError as error:
                if error.errno in safefs.MISSING_ERRNOS:
                    raise PathRuleError(f"cannot write {path!r}: {safefs.describe(error)}") from None
                raise

    def stat(self, scope: Scope, path: str) -> FileInfo | None:
        """The ``FileInfo`` of the regular file ``path``, or None if it is missing, not a regular file,
        or reached through a symlink at any component.

        Raises:
            PathRuleError: ``path`` breaks a rule of DESIGN §4.2.
        """
        parts = self._parts(scope, path)
        try:
            with self._scope_dir(scope) as root:
                info = safefs.lstat_at(root, parts)
        except FileNotFoundError:
            return None
        if info is None or not stat.S_ISREG(info.st_mode):
            return None
        return _file_info("/".join(parts), info)

    def list_files(
        self, scope: Scope, prefix: str = "", skipped: list[tuple[str, str]] | None = None
    ) -> list[FileInfo]:
        """Regular files of the scope below the folder ``prefix`` ('' for all), sorted by path.

        ``prefix`` is a folder path matched by whole components (``"reports"`` does not match
        ``reports2/``); one trailing '/' is accepted. Paths are workspace-relative and sorted by code
        point, which is also S3's UTF-8 byte order. Symlinks, FIFOs, sockets and devices are never
        listed and symlinked directories are never entered. Names that no ``Workspace`` method could
        address are left out too: not UTF-8, not NFC, breaking a rule of DESIGN §4.2 (a backslash, a
        control character), or the temporary files of writes in progress (``safefs.TEMP_PREFIX``).

        When ``skipped`` is given, what was left out is appended to it as ``(display path, reason)``
        (the display path escapes bytes that are not UTF-8), so an export can say so (case PATH-01).

        Raises:
            PathRuleError: ``prefix`` breaks a rule of DESIGN §4.2.
        """
        folder = prefix[:-1] if prefix.endswith("/") else prefix
        parts = self._parts(scope, folder) if folder else []
        key_prefix = scope.key + "/"
        try:
            with self._scope_dir(scope) as root:
                try:
                    start = safefs.open_dir(root, parts)
                except OSError as error:
                    if error.errno in safefs.MISSING_ERRNOS:
                        return []
                    raise
        except FileNotFoundError:
            return []
        files: list[FileInfo] = []
        try:
            special: list[tuple[str, str]] = []
            for rel, info in safefs.iter_regular_files(start, special):
                path = f"{folder}/{rel}" if folder else rel
                if _addressable(path, key_prefix):
                    files.append(_file_info(path, info))
                elif skipped is not None and not rel.rsplit("/", 1)[-1].startswith(safefs.TEMP_PREFIX):
                    skipped.append((_display(path), unaddressable_reason(path, key_prefix=key_prefix)))
            if skipped is not None:
                skipped.extend(
                    (_display(f"{folder}/{rel}" if folder else rel), kind) for rel, kind in special
                )
        finally:
            os.close(start)
        files.sort(key=lambda item: item.path)
        return files

    # -- blobs -------------------------------------------------------------------------------------

    def put_blob(self, scope: Scope, path: str) -> tuple[str, int]:
        """Copy the regular file ``path`` into content-addressed storage; return ``(sha256 hex, size)``.

        The file is opened once without following any symlink and streamed (1 MiB blocks, constant
        memory) into a temporary file while being hashed, so the stored blob is exactly the bytes that
        were hashed even if the file changes meanwhile. The copy is made read-only (0o444) and moved to
        ``blobs/sha256/<ab>/<hex>``; if that blob exists already it is kept, never rewritten.

        Raises:
            PathRuleError: ``path`` breaks a rule of DESIGN §4.2.
            FileNotFoundError: missing, not a regular file, or a symlink at any component.
            OSError: the blob store cannot be written.
        """
        parts = self._parts(scope, path)
        with self._scope_dir(scope) as root:
            source = safefs.open_regular(root, parts)
        # Callbacks run last-in first-out: the temporary copy is removed (if it was not moved into
        # place) before its folder is closed, and every descriptor is closed on every path.
        with contextlib.ExitStack() as cleanup:
            cleanup.callback(os.close, source)
            home = cleanup.enter_context(self._home(create=True))
            tmp_dir = safefs.open_dir(home, (BLOBS_DIR, "tmp"), create=True)
            cleanup.callback(os.close, tmp_dir)
            tmp_name, tmp_fd = safefs.create_temp(tmp_dir)
            cleanup.callback(_unlink_if_present, tmp_name, tmp_dir)
            try:
                digest, size = safefs.copy_and_hash(source, tmp_fd)
                os.fchmod(tmp_fd, 0o444)
                os.fsync(tmp_fd)
            finally:
                os.close(tmp_fd)
            shard = safefs.open_dir(home, (BLOBS_DIR, "sha256", digest[:2]), create=True)
            cleanup.callback(os.close, shard)
            if safefs.publish_once(tmp_dir, tmp_name, shard, digest):
                os.fsync(shard)  # the new name is durable before an artifact version points at it
        return digest, size

    def read_blob(self, sha256: str) -> bytes:
        """The bytes stored under the lowercase hex digest ``sha256``.

        Raises:
            FileNotFoundError: no blob is stored under that digest; also for anything that is not 64
                lowercase hex digits (so no digest can name a path outside the store).
        """
        if not _SHA256_HEX.fullmatch(sha256):
            raise FileNotFoundError(f"no blob stored under {sha256!r}")
        with self._home() as home:
            fd = safefs.open_regular(home, (BLOBS_DIR, "sha256", sha256[:2], sha256))
        with os.fdopen(fd, "rb") as reader:
            return reader.read()

    def open_blob(self, sha256: str) -> BinaryIO:
        """A seekable binary reader of the blob stored under ``sha256`` (so a parquet footer can be read
        without reading the file); ``FileNotFoundError`` as for ``read_blob``."""
        if not _SHA256_HEX.fullmatch(sha256):
            raise FileNotFoundError(f"no blob stored under {sha256!r}")
        with self._home() as home:
            fd = safefs.open_regular(home, (BLOBS_DIR, "sha256", sha256[:2], sha256))
        return os.fdopen(fd, "rb")

    # -- helpers -----------------------------------------------------------------------------------

    def _parts(self, scope: Scope, path: str) -> list[str]:
        return check_workspace_path(path, prefix=scope.key + "/").split("/")

    @contextlib.contextmanager
    def _home(self, *, create: bool = False) -> Iterator[int]:
        fd = safefs.open_root(self.home, create=create)
        try:
            yield fd
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _scope_dir(self, scope: Scope, *, create: bool = False) -> Iterator[int]:
        """The scope root's fd. Without ``create``, ``FileNotFoundError`` when it cannot be reached
        without a link; with it, ``PathRuleError``."""
        with self._home(create=create) as home:
            try:
                fd = safefs.open_dir(home, scope.key.split("/"), create=create)
            except OSError as error:
                if error.errno not in safefs.MISSING_ERRNOS:
                    raise
                reason = safefs.describe(error)
                if create:
                    raise PathRuleError(f"scope {scope.key!r} is unusable: {reason}") from None
                raise FileNotFoundError(f"scope {scope.key!r} not found: {reason}") from None
        try:
            yield fd
        finally:
            os.close(fd)


def _unlink_if_present(name: str, dir_fd: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)


def _display(path: str) -> str:
    """A path as text that is always valid UTF-8: bytes that were not UTF-8 are shown escaped."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _addressable(path: str, key_prefix: str) -> bool:
    """True when ``path`` is the canonical spelling of a valid workspace path (what the S3 sync and every
    ``Workspace`` method would accept unchanged)."""
    if path.rsplit("/", 1)[-1].startswith(safefs.TEMP_PREFIX):
        return False
    try:
        path.encode("utf-8")
        return check_workspace_path(path, prefix=key_prefix) == path
    except (UnicodeEncodeError, PathRuleError):
        return False


def _file_info(path: str, info: os.stat_result) -> FileInfo:
    return FileInfo(
        path=path,
        size_bytes=info.st_size,
        modified_at=datetime.fromtimestamp(info.st_mtime_ns / 1e9, tz=UTC),
    )
