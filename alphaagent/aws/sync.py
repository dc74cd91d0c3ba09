"""The env function's working copy of a scope, kept between invocations and reconciled with S3 (issue
11: the cost of a run follows what changed, not the size of the scope).

Lambda's tenant isolation (``TenancyConfig: PER_TENANT``, template.yaml) gives every scope its own
execution environments: the coder invokes with ``TenantId = scope.key`` (``LambdaExecutor``), so an
environment serves one scope's runs, one after the other. Its ``/tmp`` survives between invocations
(the exclusive sandbox empties ``/tmp`` after each run except the working copies, ``wipe_keep``), so the
copy the last run left is reused instead of being wiped and downloaded again:

1. **list** the scope (ListObjectsV2, 1,000 keys a call; a page that ends inside an excluded folder
   such as ``work/runs/`` jumps over it with ``StartAfter``, so the platform's growing run records
   cost at most one call). A *carried* folder inside an excluded one (the run's own session state,
   ``work/sessions/{session_id}/``) comes from the same listing, with its own byte cap: a warm run
   still lists once, and the jump over the excluded folder lands on the carried one;
2. **reconcile** the local tree with the listing: a local file is kept only when its S3 object still
   has the ETag it was downloaded (or uploaded) as *and* the file is exactly as it was then (inode,
   size, mtime and ctime: a run cannot set a ctime back, so a change whose upload failed or was
   refused is noticed); everything else local is removed (files gone from S3, files a run left that
   were never uploaded, links, FIFOs, empty folders);
3. **download** what is missing or differs, in parallel (``POOL_SIZE`` threads), one GetObject per file
   with the size from the listing (no HeadObject): objects of ``multipart_bytes`` or more go through
   boto3's managed transfer (ranged GETs);
4. after the run, **upload** the files it created or modified in parallel (one PutObject each; its
   ETag is remembered) and delete the ones it deleted (DeleteObjects, 1,000 keys a call).

What was downloaded as which ETag is kept in this process's memory, never on disk where run code could
forge it: a process that starts on a ``/tmp`` it did not fill (Lambda restarted the runtime) has no
record, so it wipes the copy and downloads it again. A copy is never visible to another scope's run:
before each sync every other scope's copy under ``local_dir`` is removed (tenant isolation already
prevents it; this keeps it true for a function made without it).

A scope larger than the sync cap is refused before anything is downloaded (``EnvScopeTooLargeError``
names its size and the cap): a run on part of its files would be a run on a scope that does not exist.

Example::

    copies = WorkingCopies(workspace)
    down = copies.sync_down(
        scope, max_bytes=2 * 2**30, exclude=["work/runs", "work/sessions"],
        carry={"work/sessions/s-1": 576 * 2**20},
    )
    down.carried["work/sessions/s-1"].sizes  # what S3 held there: {path: bytes}
    ...  # run code in workspace.local_root(scope)
    up = copies.sync_up(scope, ["reports/summary.md"])
    copies.delete(scope, ["datasets/old.csv"])
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from alphaagent.aws import sdk
from alphaagent.aws.workspace import S3Workspace
from alphaagent.errors import EnvScopeTooLargeError, PathRuleError
from alphaagent.local import safefs
from alphaagent.models.common import MAX_KEY_BYTES, SCOPE_FOLDERS, Scope, check_workspace_path
from alphaagent.sandbox.removal import remove_tree

MiB: Final = 2**20

MIN_PART_BYTES: Final = 5 * MiB
"""S3's minimum size of every multipart part but the last (5 MiB)."""

DEFAULT_MULTIPART_BYTES: Final = 64 * MiB
"""Transfers of files at or above this size go by boto3's managed transfer (multipart upload, ranged
GETs), in parts of this size."""

SKIP_PATH_RULE: Final = "path_rule"
"""Skipped by a sync: the path breaks a rule of DESIGN §4.2."""
SKIP_NOT_REGULAR: Final = "not_regular_file"
"""Skipped by ``sync_up``: missing, a symlink (at any component), a directory, FIFO, socket or device."""
SKIP_NOT_READABLE: Final = "not_readable"
"""Skipped by ``sync_up``: the run took away the read permission of the file or of a folder on its
path (``chmod 000``); the run's choice, not a platform failure."""
SKIP_LOCAL_UNSAFE: Final = "local_path_unsafe"
"""Skipped by ``sync_down``: the local path is taken by another key (a file where a folder is needed,
or the reverse)."""

POOL_SIZE: Final = 32
"""Transfers in flight at once. 32 connections keep a 100 KB GetObject pipeline near the bandwidth of
a Lambda function at ~20 ms per request; the threads exist only while a sync runs (they would otherwise
count against Lambda's 1,024 processes/threads quota beside the run's own). The S3 client's connection
pool must be at least this large (``client_config``)."""

DELETE_BATCH: Final = 1000
"""Keys per DeleteObjects call: S3's maximum."""

LIST_PAGE_KEYS: Final = 1000
"""Keys per ListObjectsV2 call: S3's maximum (and default)."""

_LAST_KEY_CHAR: Final = "\U0010ffff"
"""The largest code point: ``{folder}/`` followed by it sorts after every key S3 can list in the folder
that a workspace path can name (S3 lists in UTF-8 byte order)."""

_BEFORE_SLASH: Final = "."
"""The character just below ``/`` (0x2E < 0x2F): ``{folder}.`` followed by ``_LAST_KEY_CHAR`` sorts
after every key that is not in ``{folder}/`` and before all that are (a listing can start there)."""


def client_config() -> dict[str, Any]:
    """botocore ``Config`` arguments for the env function's S3 client: a connection pool as large as the
    transfer pool (botocore's default of 10 would drop connections under ``POOL_SIZE`` threads)."""
    return {"max_pool_connections": POOL_SIZE}


@dataclass(frozen=True)
class SkippedFile:
    """A file a sync did not transfer, and why (one of the ``SKIP_*`` reasons)."""

    path: str
    reason: str


@dataclass
class SyncReport:
    """What one ``sync_down`` or ``sync_up`` did: workspace paths transferred (in order), their total
    size in bytes, and every file left out with its reason (never silently dropped, case PATH-01)."""

    transferred: list[str] = field(default_factory=list)
    bytes_transferred: int = 0
    skipped: list[SkippedFile] = field(default_factory=list)


@dataclass(frozen=True)
class Entry:
    """What one local file was when it last matched S3: the object's ETag and the file's identity.

    ``ctime_ns`` is what makes a change visible whatever the run did: write, chmod, utime and rename all
    set it to now, and no system call sets it back."""

    etag: str
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, etag: str, info: os.stat_result) -> Entry:
        """The entry of a file with lstat ``info`` that holds the bytes of the object ``etag``."""
        return cls(etag, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)

    def matches(self, info: os.stat_result) -> bool:
        """Whether the file with lstat ``info`` is still the one this entry describes."""
        return stat.S_ISREG(info.st_mode) and (
            info.st_ino,
            info.st_size,
            info.st_mtime_ns,
            info.st_ctime_ns,
        ) == (self.ino, self.size, self.mtime_ns, self.ctime_ns)


@dataclass
class CarriedFolder:
    """What S3 held in a carried folder when it was listed: ``sizes`` is ``{path: bytes}``.
    ``brought_down`` is False when they added up to more than the folder's cap: then nothing of it is
    in the working copy (its local files were removed too)."""

    sizes: dict[str, int] = field(default_factory=dict)
    brought_down: bool = True


@dataclass
class DownReport(SyncReport):
    """A ``SyncReport`` of a sync down, with what the reconciliation kept and removed locally, and
    what each carried folder held in S3 (``carried``, by the folder as the caller named it)."""

    kept: int = 0
    removed: list[str] = field(default_factory=list)
    cold: bool = True
    carried: dict[str, CarriedFolder] = field(default_factory=dict)


class WorkingCopies:
    """Working copies of scopes under ``workspace.local_dir``, reconciled with S3 on every sync.

    One instance lives as long as the process (the env function's cached getter); it holds the record
    of what each local file was downloaded as. Not for use by two threads at once (the env function
    holds its working-copy lock around every sync).

    Args:
        workspace: the workspaces bucket and where the copies live (``local_root``).
        pool_size: transfers in flight at once (``POOL_SIZE``).
        multipart_bytes: files at or above this size go by boto3's managed transfer in parts of this
            size; at least 5 MiB (S3's minimum part size), default 64 MiB.

    Raises:
        ValueError: ``multipart_bytes`` is below 5 MiB.
    """

    def __init__(
        self,
        workspace: S3Workspace,
        *,
        pool_size: int = POOL_SIZE,
        multipart_bytes: int = DEFAULT_MULTIPART_BYTES,
    ) -> None:
        if multipart_bytes < MIN_PART_BYTES:
            raise ValueError(f"multipart_bytes must be at least {MIN_PART_BYTES} (S3's minimum part size)")
        self.workspace = workspace
        self.pool_size = pool_size
        self.multipart_bytes = multipart_bytes
        self._entries: dict[str, dict[str, Entry]] = {}

    # -- down --------------------------------------------------------------------------------------

    def sync_down(
        self,
        scope: Scope,
        *,
        max_bytes: int,
        exclude: Iterable[str] = (),
        carry: Mapping[str, int] | None = None,
    ) -> DownReport:
        """Make ``local_root(scope)`` hold exactly the scope's files in S3, below no folder of
        ``exclude`` (folder paths, matched by whole components), and the six scope folders.

        ``carry`` names folders (usually below an excluded one) that are synced all the same, from the
        same listing, each with its own cap in bytes: a carried folder whose files add up to more than
        its cap is not brought down (its local files are removed), and ``DownReport.carried`` says
        what S3 held in each. What is brought down of them counts against ``max_bytes`` with the rest:
        ``max_bytes`` bounds the whole working copy (it shares ``/tmp`` with what the run writes).

        Keys no method could address (not NFC, breaking a rule of DESIGN §4.2) are reported as
        ``path_rule``; a key whose local path is taken by another key (S3 may hold both ``a`` and
        ``a/b``) as ``local_path_unsafe``.

        Raises:
            EnvScopeTooLargeError: the files to sync, carried folders included, add up to more than
                ``max_bytes`` bytes (nothing is downloaded; the message names the scope's bytes, the
                carried bytes and the cap).
            PathRuleError: an excluded folder breaks a rule, or the copy's root is blocked.
            botocore errors: S3 failed (the copy is then forgotten: the next sync starts cold).
        """
        self._drop_other_scopes(scope)
        excluded = tuple(_folder(scope, folder) for folder in exclude)
        carried = {folder: _folder(scope, folder) for folder in carry or {}}
        report = DownReport()
        remote, unaddressable = self._listing(scope, excluded, tuple(sorted(carried.values())))
        report.skipped.extend(SkippedFile(path, SKIP_PATH_RULE) for path in sorted(unaddressable))
        for folder, inside in carried.items():
            sizes = {path: size for path, (_, size) in remote.items() if path.startswith(inside)}
            report.carried[folder] = CarriedFolder(sizes, sum(sizes.values()) <= (carry or {})[folder])
            if not report.carried[folder].brought_down:
                for path in sizes:  # not in the copy: reconciling removes what is local
                    del remote[path]
        carried_prefixes = tuple(carried.values())
        files = {path: size for path, (_, size) in remote.items() if not path.startswith(carried_prefixes)}
        scope_bytes = sum(files.values())
        carried_bytes = sum(size for _, size in remote.values()) - scope_bytes
        if scope_bytes + carried_bytes > max_bytes:
            self.forget(scope)
            state = f" and the session state {carried_bytes:,} bytes ({_mib(carried_bytes)})"
            raise EnvScopeTooLargeError(
                f"scope {scope.key}: its files are {scope_bytes:,} bytes ({_mib(scope_bytes)}) in"
                f" {len(files):,} files{state if carried_bytes else ''}, over the sync cap of"
                f" {max_bytes:,} bytes ({_mib(max_bytes)}, ENV_SYNC_MAX_BYTES, at most half of /tmp);"
                " nothing was run: delete or move files to run code here"
            )
        root = self.workspace.local_root(scope)
        known = self._entries.get(scope.key)
        if known is None:  # no record of what is on disk: nothing local can be trusted
            wipe_tree(root)
            known = {}
        else:
            report.cold = False
        entries = self._entries[scope.key] = {}
        try:
            self._open_root(scope)
            os.chmod(root, 0o700)  # a run may have taken its working directory's permissions away
            for path, info in _scan(root).items():
                entry, wanted = known.get(path), remote.get(path)
                same = entry is not None and wanted is not None and entry.etag == wanted[0]
                if same and entry is not None and entry.matches(info):
                    entries[path] = entry
                    report.kept += 1
                    continue
                os.unlink(root / path)  # gone from S3, changed in S3, or changed here since
                if wanted is None:
                    report.removed.append(path)
            _prune_empty(root)
            missing = sorted(path for path in remote if path not in entries)
            for path, outcome in self._parallel(missing, functools.partial(self._download, scope, remote)):
                if isinstance(outcome, Entry):
                    entries[path] = outcome
                    report.transferred.append(path)
                    report.bytes_transferred += outcome.size
                else:
                    report.skipped.append(SkippedFile(path, SKIP_LOCAL_UNSAFE))
            for folder in SCOPE_FOLDERS:  # S3 has no folders; the code expects the six of DESIGN §4.2
                with contextlib.suppress(FileExistsError):
                    (root / folder).mkdir()
        except BaseException:
            self.forget(scope)
            raise
        report.transferred.sort()
        return report

    # -- up ----------------------------------------------------------------------------------------

    def sync_up(
        self,
        scope: Scope,
        paths: Iterable[str],
        *,
        check: Callable[[], None] = lambda: None,
        tagging: str | None = None,
    ) -> SyncReport:
        """Upload ``paths`` (workspace-relative) from the working copy, in parallel, and remember each
        uploaded file as the object's new ETag (the next sync keeps it).

        Regular files only, opened without following a link at any component (case PATH-01): others
        are ``not_regular_file``, unreadable ones ``not_readable``, rule-breaking names ``path_rule``.
        ``check`` is called right before each upload's first request to S3, once the file is open
        (from the transfer threads: it must be thread-safe), so a deadline it enforces holds for the
        request itself; what it raises stops the sync and propagates. ``tagging``: the objects' tag set
        as a URL query (``key=value&...``), for a lifecycle rule that filters on it (the role needs
        ``s3:PutObjectTagging`` as well as ``s3:PutObject`` then).

        Raises:
            botocore errors: S3 failed (the copy is forgotten: the next sync starts cold).
        """
        report = SyncReport()
        entries = self._entries.setdefault(scope.key, {})
        todo: list[str] = []
        for raw in paths:
            try:
                path = check_workspace_path(raw, prefix=f"{scope.key}/")
            except PathRuleError:
                report.skipped.append(SkippedFile(raw, SKIP_PATH_RULE))
                continue
            entries.pop(path, None)
            todo.append(path)
        try:
            for path, outcome in self._parallel(todo, lambda path: self._upload(scope, path, check, tagging)):
                if isinstance(outcome, Entry):
                    entries[path] = outcome
                    report.transferred.append(path)
                    report.bytes_transferred += outcome.size
                else:
                    report.skipped.append(SkippedFile(path, outcome))
        except BaseException:
            self.forget(scope)
            raise
        report.transferred.sort()
        return report

    def delete(self, scope: Scope, paths: Iterable[str]) -> None:
        """Delete the objects of ``paths`` (already checked workspace paths) with DeleteObjects, 1,000
        keys a call (in a versioned bucket, delete markers); a missing one is not an error.

        Raises:
            botocore errors: S3 failed, or refused a key (the first refusal's code is raised).
        """
        keys = [f"{scope.key}/{path}" for path in paths]
        entries = self._entries.get(scope.key, {})
        for path in paths:
            entries.pop(path, None)
        client = self.workspace.client
        for start in range(0, len(keys), DELETE_BATCH):
            batch = keys[start : start + DELETE_BATCH]
            if len(batch) == 1:
                client.delete_object(Bucket=self.workspace.bucket, Key=batch[0])
                continue
            answer = client.delete_objects(
                Bucket=self.workspace.bucket,
                Delete={"Objects": [{"Key": key} for key in batch], "Quiet": True},
            )
            if answer.get("Errors"):
                first = answer["Errors"][0]
                raise sdk.client_error()(
                    {"Error": {"Code": first.get("Code", ""), "Message": first.get("Message", "")}},
                    "DeleteObjects",
                )

    def forget(self, scope: Scope) -> None:
        """Forget what the copy of ``scope`` holds and remove it: the next sync starts cold."""
        self._entries.pop(scope.key, None)
        with contextlib.suppress(OSError):
            wipe_tree(self.workspace.local_root(scope))

    def known(self, scope: Scope) -> int:
        """How many local files of ``scope`` are recorded as matching S3 (0 for a cold copy)."""
        return len(self._entries.get(scope.key, {}))

    # -- helpers -----------------------------------------------------------------------------------

    def _listing(
        self, scope: Scope, excluded: tuple[str, ...], carried: tuple[str, ...] = ()
    ) -> tuple[dict[str, tuple[str, int]], set[str]]:
        """``{path: (etag, size)}`` of the scope's addressable files outside ``excluded`` or inside
        ``carried`` (sorted folder paths ending in ``/``), and the paths of unaddressable keys (folder
        markers left out)."""
        prefix = f"{scope.key}/"
        skip = tuple(prefix + folder for folder in excluded)
        keep = tuple(prefix + folder for folder in carried)
        remote: dict[str, tuple[str, int]] = {}
        unaddressable: set[str] = set()
        bucket = self.workspace.bucket
        arguments: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": LIST_PAGE_KEYS}
        while True:
            page = self.workspace.client.list_objects_v2(**arguments)
            contents = page.get("Contents", [])
            for item in contents:
                key: str = item["Key"]
                if key.startswith(skip) and not key.startswith(keep):
                    continue
                path = key[len(prefix) :]
                if _addressable(path, prefix):
                    remote[path] = (str(item["ETag"]), int(item["Size"]))
                elif not _folder_marker(path):
                    unaddressable.add(path)
            if not page.get("IsTruncated") or not contents:
                return remote, unaddressable
            last = contents[-1]["Key"]
            inside = next((folder for folder in skip if last.startswith(folder)), None)
            arguments = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": LIST_PAGE_KEYS}
            if inside is not None and not last.startswith(keep):
                # The rest of that folder is never synced: jump over it, or to the next carried folder
                # in it (every key between the two is in the excluded folder and in no carried one).
                ahead = next((folder for folder in keep if folder.startswith(inside) and folder > last), None)
                if ahead is None:
                    arguments["StartAfter"] = inside + _LAST_KEY_CHAR
                else:
                    arguments["StartAfter"] = max(last, ahead[:-1] + _BEFORE_SLASH + _LAST_KEY_CHAR)
            else:
                arguments["ContinuationToken"] = page["NextContinuationToken"]

    def _parallel(self, paths: list[str], task: Callable[[str], Any]) -> Iterator[tuple[str, Any]]:
        """``(path, task(path))`` for every path, at most ``pool_size`` in flight. The first exception
        stops new tasks and is raised once those in flight are done (a task that must not start
        after a deadline checks it itself, right before its request: ``_upload``)."""
        if not paths:
            return
        if len(paths) == 1:  # one transfer (a warm run's usual case) needs no thread
            yield paths[0], task(paths[0])
            return
        workers = min(self.pool_size, len(paths))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sync") as pool:
            pending: dict[Future[Any], str] = {}
            queue = iter(paths)
            failure: BaseException | None = None
            while True:
                while failure is None and len(pending) < workers:
                    path = next(queue, None)
                    if path is None:
                        break
                    pending[pool.submit(task, path)] = path
                if not pending:
                    break
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    path = pending.pop(future)
                    error = future.exception()
                    if error is not None:
                        failure = failure or error
                    elif failure is None:
                        yield path, future.result()
            if failure is not None:
                raise failure

    def _open_root(self, scope: Scope) -> None:
        """Create the copy's root, refusing a link on the way (``PathRuleError``)."""
        os.close(open_scope_root(self.workspace.local_dir, scope))

    def _transfer_config(self) -> Any:
        transfer = importlib.import_module("boto3.s3.transfer")
        return transfer.TransferConfig(
            multipart_threshold=self.multipart_bytes, multipart_chunksize=self.multipart_bytes
        )

    def _download(self, scope: Scope, remote: dict[str, tuple[str, int]], path: str) -> Entry | None:
        """One object into the working copy (temporary file, then rename); the entry of the file, or
        None when its local path is taken (a file where a folder is needed, or the reverse)."""
        root = self.workspace.local_root(scope)
        target = root / path
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            return None
        etag, size = remote[path]
        key = f"{scope.key}/{path}"
        client = self.workspace.client
        tmp = target.parent / safefs.temp_name()
        try:
            with open(tmp, "xb") as writer:
                if size >= self.multipart_bytes:
                    # Ranged GETs in parallel; a changed object gets a new ETag, so keeping the
                    # listed one at worst downloads it again next time.
                    client.download_fileobj(
                        self.workspace.bucket, key, writer, Config=self._transfer_config()
                    )
                else:
                    response = client.get_object(Bucket=self.workspace.bucket, Key=key)
                    etag = str(response["ETag"])
                    with contextlib.closing(response["Body"]) as body:
                        for chunk in body.iter_chunks(1024 * 1024):
                            writer.write(chunk)
            os.chmod(tmp, 0o644)
            try:
                os.replace(tmp, target)
            except (IsADirectoryError, NotADirectoryError):
                os.unlink(tmp)
                return None
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return Entry.of(etag, os.lstat(target))

    def _upload(
        self, scope: Scope, path: str, check: Callable[[], None], tagging: str | None = None
    ) -> Entry | str:
        """One local file to S3; its entry, or the ``SKIP_*`` reason it was not uploaded. ``check`` is
        called last before the first request (what it raises propagates: nothing is sent)."""
        base = safefs.open_root(self.workspace.local_dir, create=True)
        try:
            root = safefs.open_dir(base, scope.key.split("/"))
        finally:
            os.close(base)
        try:
            try:
                fd = safefs.open_regular(root, path.split("/"))
            except FileNotFoundError:
                return SKIP_NOT_REGULAR
            except PermissionError:
                return SKIP_NOT_READABLE
        finally:
            os.close(root)
        key = f"{scope.key}/{path}"
        client = self.workspace.client
        extra = {} if tagging is None else {"Tagging": tagging}
        with os.fdopen(fd, "rb") as reader:
            info = os.fstat(reader.fileno())
            check()  # here, not when the task starts: the deadline holds for the request itself
            if info.st_size >= self.multipart_bytes:
                client.upload_fileobj(
                    reader, self.workspace.bucket, key, ExtraArgs=extra, Config=self._transfer_config()
                )
                # The managed transfer does not return the ETag; one HeadObject per large file.
                etag = str(client.head_object(Bucket=self.workspace.bucket, Key=key)["ETag"])
            else:
                answer = client.put_object(Bucket=self.workspace.bucket, Key=key, Body=reader, **extra)
                etag = str(answer["ETag"])
        return Entry.of(etag, info)

    def _drop_other_scopes(self, scope: Scope) -> None:
        """Remove every working copy under ``local_dir`` but ``scope``'s, and forget them."""
        for other in [key for key in self._entries if key != scope.key]:
            del self._entries[other]
        keep = scope.key.split("/")
        directory = self.workspace.local_dir
        for depth, part in enumerate(keep):
            try:
                names = os.listdir(directory)
            except FileNotFoundError:
                return
            for name in names:
                if name != part:
                    wipe_tree(directory / name)
            directory = directory / part
            if depth == len(keep) - 1:
                return


def open_scope_root(local_dir: Path, scope: Scope) -> int:
    """The fd of the working copy's root ``local_dir/{scope.key}``, created if missing, reached without
    following a link below ``local_dir``; the caller closes it.

    Raises:
        PathRuleError: a link or a file is in the way (the message says what).
    """
    base = safefs.open_root(local_dir, create=True)
    try:
        return safefs.open_dir(base, scope.key.split("/"), create=True)
    except OSError as error:
        raise PathRuleError(
            f"local working copy of {scope.key!r} is unusable: {safefs.describe(error)}"
        ) from None
    finally:
        os.close(base)


def _scan(root: Path) -> dict[str, os.stat_result]:
    """The regular files below ``root`` as ``{relative path: lstat}``. Everything else is removed on
    the way (symlinks, FIFOs, sockets, devices: never followed), and folders the run made unreadable
    are given back to their owner (``0o700``) so they can be listed and cleaned."""
    found: dict[str, os.stat_result] = {}
    stack: list[tuple[Path, str]] = [(root, "")]
    while stack:
        directory, relative = stack.pop()
        with os.scandir(directory) as entries:
            listed = list(entries)
        for entry in listed:
            name = f"{relative}{entry.name}"
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                if len(name.encode("utf-8", "surrogateescape")) >= MAX_KEY_BYTES:
                    # Nothing below is addressable (a key is at most 1,024 bytes), and a walk by
                    # path would soon pass PATH_MAX: removed whole, however deep it goes.
                    remove_tree(entry.path)
                    continue
                if stat.S_IMODE(info.st_mode) & 0o700 != 0o700:
                    os.chmod(entry.path, 0o700, follow_symlinks=False)
                stack.append((Path(entry.path), f"{name}/"))
            elif stat.S_ISREG(info.st_mode):
                found[name] = info
            else:
                os.unlink(entry.path)
    return found


def _prune_empty(root: Path) -> None:
    """Remove the folders below ``root`` that hold nothing (S3 has no folders; the six scope folders
    are made again by the caller). Bottom up, so a folder emptied by its children's removal goes too;
    with a stack, not ``os.walk`` (recursive on 3.11: a run's folders nested 1,000 deep would raise
    ``RecursionError``). ``_scan`` has already removed what is nested past a key's length."""
    folders, stack = [], [str(root)]
    while stack:
        folder = stack.pop()
        folders.append(folder)
        with contextlib.suppress(OSError), os.scandir(folder) as entries:
            stack.extend(entry.path for entry in entries if entry.is_dir(follow_symlinks=False))
    for folder in reversed(folders[1:]):  # every folder after its parent: reversed, children first
        with contextlib.suppress(OSError):  # not empty
            os.rmdir(folder)


def wipe_tree(path: Path) -> None:
    """Remove ``path`` and everything below it, whatever the last run left there: a symlink is
    unlinked (never followed), and directories the run made unreadable (``chmod 000``) are made
    accessible to the owner first. A missing path is fine.

    Raises:
        OSError: something could not be removed.
    """
    remove_tree(path)  # iterative (a run may nest folders thousands deep), never follows a link


def _folder(scope: Scope, folder: str) -> str:
    """``folder`` as a checked workspace path of ``scope`` ending in ``/``.

    Raises:
        PathRuleError: it breaks a workspace path rule.
    """
    return check_workspace_path(folder.rstrip("/"), prefix=f"{scope.key}/") + "/"


def _addressable(path: str, scope_prefix: str) -> bool:
    try:
        return check_workspace_path(path, prefix=scope_prefix) == path
    except PathRuleError:
        return False


def _folder_marker(path: str) -> bool:
    return path.endswith("/") and path[:-1] in SCOPE_FOLDERS


def _mib(size: int) -> str:
    return f"{size / 2**20:,.1f} MiB"
