"""A session's live state on AWS (DESIGN §4.7): it travels with the run like the working copy.

The state folder ``work/sessions/{session_id}/`` of the scope is a platform folder: the general sync
never brings it down nor takes a run's writes there up. Only the run's own session's folder comes
down, *carried* by the working copy's sync (``state_carry``: from the same single listing as the
rest of the scope, kept warm between runs like any other file, with its own cap); ``state_before``
reads what S3 held there from that sync's report. After the run and before the claim check,
``state_up`` uploads what the new manifest names that S3 does not hold yet, the manifest LAST, then
deletes what it no longer names: the manifest in S3 never names an object that is not there, so a
run's result never points at a state that does not exist, and a run that saved nothing (killed,
fresh) leaves S3 as it was. Its uploads go through the working copy (``WorkingCopies.sync_up``:
in parallel, large files by multipart upload, each one checked against the run's deadline right
before its request), so the state obeys the same stop rule as the run's files; each is tagged
``STATE_TAGGING``, so its old versions expire within a day (template.yaml's lifecycle rule).

Example::

    down = copies.sync_down(scope, max_bytes=cap, exclude=[SESSIONS_DIR], carry=state_carry(sid, mb))
    before = state_before(down, workspace.local_root(scope), sid)
    result = sandbox.run(code, cwd=root, state=StateRequest(sid))
    state_up(copies, scope, root, sid, before, check_in_time=check)
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from alphaagent.aws.sync import DownReport, WorkingCopies
from alphaagent.aws.workspace import S3Workspace
from alphaagent.models.common import Scope
from alphaagent.sandbox.session import MANIFEST, read_state_file, state_file_size, state_files, state_path

STATE_TAGGING = "alphaagent-kind=session-state"
"""The tag set of every state object (a URL query, as S3's ``Tagging`` takes it): template.yaml's
``ExpireSessionStateVersions`` lifecycle rule filters on it, so the versions a state leaves behind
(each run's replaced manifest, the objects a newer state no longer names) expire after a day instead
of the bucket's 90 days for scope files. A prefix cannot select them: every scope has its own
``work/sessions/``."""

STATE_SLACK_BYTES = 64 * 2**20
"""What a state may hold beyond its cap, in bytes, when it is brought down: the cap bounds the
objects' pickled size, and each buffer starts at a page boundary in its file."""


@dataclass
class StateBefore:
    """The session's state objects in S3 before the run, and the manifest's digest then."""

    paths: set[str] = field(default_factory=set)
    manifest_sha256: str | None = None
    bytes: int = 0


def state_carry(session_id: str, max_bytes: int) -> dict[str, int]:
    """The ``carry`` of ``WorkingCopies.sync_down`` that brings the session's state folder down: at
    most ``max_bytes`` + ``STATE_SLACK_BYTES`` (a larger state, which no run of ours writes, is not
    brought down and the run starts with empty globals). No other session's folder is named, so no
    other session's state is ever downloaded."""
    return {state_path(session_id): max_bytes + STATE_SLACK_BYTES}


def state_before(down: DownReport, root: Path, session_id: str) -> StateBefore:
    """What S3 held in the session's state folder, from the sync down that carried it
    (``state_carry``; no request of its own), and the digest of the manifest it brought into the
    working copy ``root`` (the copy matches S3 once synced)."""
    carried = down.carried.get(state_path(session_id))
    if carried is None:
        return StateBefore()
    before = StateBefore(paths=set(carried.sizes), bytes=sum(carried.sizes.values()))
    if carried.brought_down and f"{state_path(session_id)}/{MANIFEST}" in carried.sizes:
        # Never through a link (``read_state_file``): the working copy is the runs' to write.
        manifest = read_state_file(root, session_id, MANIFEST)
        before.manifest_sha256 = None if manifest is None else hashlib.sha256(manifest).hexdigest()
    return before


def state_up(
    copies: WorkingCopies,
    scope: Scope,
    root: Path,
    session_id: str,
    before: StateBefore,
    *,
    max_bytes: int | None = None,
    check_in_time: Callable[[], None] = lambda: None,
) -> tuple[int, str | None]:
    """Upload the session's new state from the working copy ``root``; return the bytes uploaded and
    None, or the reason the new state was not kept (a file the manifest names could not be
    uploaded: the manifest then is not, and S3 keeps the previous state).

    Only files the new manifest names are uploaded (never other files a run left in the folder),
    each file once (state files are never rewritten under the same name), in parallel, the manifest
    last and alone; then the objects the manifest no longer names are deleted (one DeleteObjects).
    Nothing changes when the manifest is the one brought down; a state over ``max_bytes`` (plus
    ``STATE_SLACK_BYTES``) is not kept. ``check_in_time`` is called right
    before each upload's request and before the delete (it raises to stop, as for the run's files).

    Raises:
        botocore errors: S3 failed (a platform failure: the run gets no claim check).
    """
    current = state_files(root, session_id)
    if not current:
        return 0, None
    manifest_path = current[-1]
    manifest = read_state_file(root, session_id, MANIFEST)  # never through a link
    if manifest is None:
        return 0, None
    digest = hashlib.sha256(manifest).hexdigest()
    if digest == before.manifest_sha256:
        return 0, None
    if max_bytes is not None:
        # The child keeps to its cap, but the folder is the run's to write: a state larger than the
        # next run would bring down (``state_carry``) is not kept, nor paid for in S3.
        sizes = (state_file_size(root, session_id, path.rsplit("/", 1)[-1]) for path in current)
        total = sum(size for size in sizes if size is not None)
        if total > max_bytes + STATE_SLACK_BYTES:
            return 0, f"not kept: {total:,} bytes is over the {max_bytes // 2**20} MiB state cap"
    uploads = [path for path in current[:-1] if path not in before.paths]
    report = copies.sync_up(scope, uploads, check=check_in_time, tagging=STATE_TAGGING)
    sent = report.bytes_transferred
    if report.skipped:  # replaced by the code (a symlink, removed): the new state is not kept
        first = min(report.skipped, key=lambda item: item.path)
        return sent, f"not kept: {first.path} could not be uploaded ({first.reason})"
    report = copies.sync_up(scope, [manifest_path], check=check_in_time, tagging=STATE_TAGGING)
    if report.skipped:
        return sent, f"not kept: the manifest could not be uploaded ({report.skipped[0].reason})"
    sent += report.bytes_transferred
    stale = sorted(before.paths - set(current))
    if stale:
        check_in_time()
        copies.delete(scope, stale)
    return sent, None


def drop_state_objects(workspace: S3Workspace, scope: Scope, session_id: str) -> int:
    """Delete every object of the session's state folder (its session ended); return how many.
    The manifest goes first, so a half-finished delete leaves no manifest naming missing objects."""
    paths = [info.path for info in workspace.list_files(scope, state_path(session_id))]
    paths.sort(key=lambda path: not path.endswith(f"/{MANIFEST}"))
    for path in paths:
        workspace.delete(scope, path)
    return len(paths)
