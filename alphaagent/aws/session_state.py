"""A session's live state on AWS (DESIGN §4.7): it travels with the run like the working copy.

The state folder ``work/sessions/{session_id}/`` of the scope is a platform folder: the general sync
never brings it down nor takes a run's writes there up. The env function brings down only the
run's own session's folder (``state_down``) and, after the run and before the claim check, uploads
what the new manifest names that S3 does not hold yet, the manifest LAST, then deletes what it no
longer names (``state_up``): the manifest in S3 never names an object that is not there, so a run's
result never points at a state that does not exist, and a run that saved nothing (killed, fresh)
leaves S3 as it was. Large files go by multipart upload (``S3Workspace.sync_up``).

Example::

    before = state_down(workspace, scope, session_id, max_bytes)
    result = sandbox.run(code, cwd=root, state=StateRequest(session_id))
    state_up(workspace, scope, root, session_id, before)
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from alphaagent.aws.workspace import S3Workspace
from alphaagent.models.common import Scope
from alphaagent.sandbox.session import MANIFEST, state_files, state_path

STATE_SLACK_BYTES = 64 * 2**20
"""What a state may hold beyond its cap, in bytes, when it is brought down: the cap bounds the
objects' pickled size, and each buffer starts at a page boundary in its file."""


@dataclass
class StateBefore:
    """The session's state objects in S3 before the run, and the manifest's digest then."""

    paths: set[str] = field(default_factory=set)
    manifest_sha256: str | None = None
    bytes: int = 0


def state_down(workspace: S3Workspace, scope: Scope, session_id: str, max_bytes: int) -> StateBefore:
    """Bring the session's state folder into the working copy (at most ``max_bytes`` +
    ``STATE_SLACK_BYTES``; a state larger than that, which no run of ours writes, is not brought
    down and the run starts with empty globals). Returns what S3 held."""
    folder = state_path(session_id)
    listed = workspace.list_files(scope, folder)
    before = StateBefore(paths={info.path for info in listed}, bytes=sum(i.size_bytes for i in listed))
    if not listed or before.bytes > max_bytes + STATE_SLACK_BYTES:
        return before
    workspace.sync_down(scope, [folder], max_bytes + STATE_SLACK_BYTES)
    manifest = workspace.local_root(scope) / folder / MANIFEST
    try:
        before.manifest_sha256 = hashlib.sha256(manifest.read_bytes()).hexdigest()
    except OSError:
        before.manifest_sha256 = None
    return before


def state_up(
    workspace: S3Workspace,
    scope: Scope,
    root: Path,
    session_id: str,
    before: StateBefore,
    *,
    check_in_time: Callable[[], None] = lambda: None,
) -> tuple[int, str | None]:
    """Upload the session's new state from the working copy ``root``; return the bytes uploaded and
    None, or the reason the new state was not kept (a file the manifest names could not be
    uploaded: the manifest then is not, and S3 keeps the previous state).

    Only files the new manifest names are uploaded (never other files a run left in the folder),
    each file once (state files are never rewritten under the same name), the manifest last; then
    the objects the manifest no longer names are deleted. Nothing changes when the manifest is the
    one brought down. ``check_in_time`` is called before each change (it raises to stop).

    Raises:
        botocore errors: S3 failed (a platform failure: the run gets no claim check).
    """
    current = state_files(root, session_id)
    if not current:
        return 0, None
    manifest_path = current[-1]
    try:
        digest = hashlib.sha256((root / manifest_path).read_bytes()).hexdigest()
    except OSError:
        return 0, None
    if digest == before.manifest_sha256:
        return 0, None
    uploads = [path for path in current[:-1] if path not in before.paths]
    sent = 0
    for path in uploads:
        check_in_time()
        report = workspace.sync_up(scope, [path])
        if report.skipped:  # replaced by the code (a symlink, removed): the new state is not kept
            return sent, f"not kept: {path} could not be uploaded ({report.skipped[0].reason})"
        sent += report.bytes_transferred
    check_in_time()
    report = workspace.sync_up(scope, [manifest_path])
    if report.skipped:
        return sent, f"not kept: the manifest could not be uploaded ({report.skipped[0].reason})"
    sent += report.bytes_transferred
    for stale in sorted(before.paths - set(current)):
        check_in_time()
        workspace.delete(scope, stale)
    return sent, None


def drop_state_objects(workspace: S3Workspace, scope: Scope, session_id: str) -> int:
    """Delete every object of the session's state folder (its session ended); return how many.
    The manifest goes first, so a half-finished delete leaves no manifest naming missing objects."""
    paths = [info.path for info in workspace.list_files(scope, state_path(session_id))]
    paths.sort(key=lambda path: not path.endswith(f"/{MANIFEST}"))
    for path in paths:
        workspace.delete(scope, path)
    return len(paths)
