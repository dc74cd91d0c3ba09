"""What of a run reaches the scope in S3, and how the run's result says so (DESIGN §3 step 6, case PATH-01).

After the sandbox ran the code in the working copy, ``sync_result`` uploads the files the run created or
modified (through ``WorkingCopies``, in parallel), deletes in S3 the ones it deleted, uploads the spill
files, and returns the run result as it is then true: a file that was not uploaded is taken out of
``files.created``/``modified`` and listed in ``files.skipped`` with its reason, as is every file the
sync down left out. Nothing a sync leaves out is dropped silently.

The platform folders (``PLATFORM_FOLDERS``) are never uploaded or deleted from a run: otherwise run
code could rewrite the spec of its own turn, or forge a result or an event.

Example::

    result = sync_result(workspace, scope, result, down, max_sync_bytes, check_in_time=check, copies=copies)
    result.files.skipped  # [SkippedPath(path="spec/turn.json", reason="not uploaded: spec/, ...")]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from alphaagent.aws.sync import (
    SKIP_LOCAL_UNSAFE,
    SKIP_NOT_READABLE,
    SKIP_NOT_REGULAR,
    SKIP_PATH_RULE,
    SkippedFile,
    SyncReport,
    WorkingCopies,
)
from alphaagent.aws.workspace import S3Workspace
from alphaagent.domain.names import path_rule_broken
from alphaagent.errors import PathRuleError
from alphaagent.models.common import Scope, check_workspace_path
from alphaagent.models.run import RunResult, SkippedPath

PLATFORM_FOLDERS: Final = ("spec/", "work/turns/", "work/runs/", "work/events/", "work/sessions/")
"""Folders only the platform writes: the specs the coder reads (claim checks), turn results
(``finalize_turn`` reads them), run results and spill files, event claim checks (the recorder reads
them), sessions' live state (``alphaagent.aws.session_state`` moves the run's own session's). A
run may write there in its working copy, but nothing of it is uploaded or deleted in S3."""

PLATFORM_FOLDER_REASON: Final = (
    "not uploaded: spec/, work/turns/, work/runs/, work/events/ and work/sessions/ are written by the"
    " platform only"
)

_DOWN_REASONS: Final = {
    SKIP_LOCAL_UNSAFE: "not synced down: the local path is taken by another key (a file and a folder)",
    SKIP_PATH_RULE: "not synced down: the key breaks a workspace path rule (DESIGN §4.2)",
}

_UP_REASONS: Final = {
    SKIP_NOT_REGULAR: "not uploaded: no longer a regular file (a symlink on its path, or removed)",
    SKIP_NOT_READABLE: "not uploaded: the run made it unreadable (its permissions or a folder's)",
    SKIP_PATH_RULE: "not uploaded: the name breaks a workspace path rule (DESIGN §4.2)",
}


def platform_owned(path: str) -> bool:
    """Whether ``path`` is in a platform folder, or is a platform folder or one of its parents (a run
    that replaces ``spec/`` or ``work/`` with a file would hide the folder from every later run)."""
    return path.startswith(PLATFORM_FOLDERS) or any(
        folder.startswith(f"{path}/") for folder in PLATFORM_FOLDERS
    )


def sync_result(
    workspace: S3Workspace,
    scope: Scope,
    result: RunResult,
    down: SyncReport,
    max_sync_bytes: int,
    *,
    check_in_time: Callable[[], None] = lambda: None,
    copies: WorkingCopies | None = None,
) -> RunResult:
    """Bring the scope in S3 up to date with what the run did; return the result as it is now true.

    ``check_in_time`` is called before each upload and delete; it raises to stop the sync (the
    request's ``not_after`` passed), and the exception propagates.

    Uploads the created and modified regular files (in parallel, through ``copies``: the working copy
    then knows them as synced), deletes the deleted ones, uploads the spill files.
    A file that is not uploaded (its name breaks a path rule, or it stopped being a regular file) is
    taken out of ``files.created``/``modified`` and ``files_changed`` and listed in ``files.skipped``,
    as is every file ``down`` left out; a spill file that is not uploaded is no longer named in
    ``stdout_path``/``stderr_path``.

    Raises:
        botocore errors: S3 failed (a platform failure).
    """
    files = result.files
    skipped = list(files.skipped)
    skipped += [_skipped(item, _DOWN_REASONS, max_sync_bytes, scope) for item in down.skipped]
    canonical: list[str] = []
    for path in [*files.created, *files.modified]:
        if platform_owned(path):
            skipped.append(SkippedPath(path=path, reason=PLATFORM_FOLDER_REASON))
        elif _canonical(scope, path):
            canonical.append(path)
        else:
            skipped.append(SkippedPath(path=path, reason=_UP_REASONS[SKIP_PATH_RULE]))
    copies = copies or WorkingCopies(workspace)
    up = copies.sync_up(scope, canonical, check=check_in_time)
    skipped += [_skipped(item, _UP_REASONS, max_sync_bytes, scope) for item in up.skipped]
    uploaded = set(up.transferred)
    deleted = [path for path in files.deleted if _canonical(scope, path) and not platform_owned(path)]
    skipped += [
        SkippedPath(path=path, reason=PLATFORM_FOLDER_REASON.replace("uploaded", "deleted"))
        for path in files.deleted
        if platform_owned(path)
    ]
    if deleted:
        check_in_time()
        copies.delete(scope, deleted)
    spills = [path for path in (result.stdout_path, result.stderr_path) if path]
    spilled = copies.sync_up(scope, spills, check=check_in_time)
    skipped += [_skipped(item, _UP_REASONS, max_sync_bytes) for item in spilled.skipped]
    created = [path for path in files.created if path in uploaded]
    modified = [path for path in files.modified if path in uploaded]
    report = files.model_copy(
        update={
            "created": created,
            "modified": modified,
            "deleted": deleted,
            "skipped": sorted(skipped, key=lambda item: (item.path, item.reason)),
        }
    )
    kept = set(spilled.transferred)
    return result.model_copy(
        update={
            "files": report,
            "files_changed": sorted({*created, *modified, *deleted}),
            "stdout_path": result.stdout_path if result.stdout_path in kept else None,
            "stderr_path": result.stderr_path if result.stderr_path in kept else None,
        }
    )


def _canonical(scope: Scope, path: str) -> bool:
    """True when ``path`` is exactly the NFC spelling of a valid workspace path of ``scope``."""
    try:
        return check_workspace_path(path, prefix=f"{scope.key}/") == path
    except PathRuleError:
        return False


def _skipped(
    item: SkippedFile, reasons: dict[str, str], budget: int, scope: Scope | None = None
) -> SkippedPath:
    reason = reasons.get(item.reason, item.reason).format(budget=budget)
    if item.reason == SKIP_PATH_RULE and scope is not None:
        rule = path_rule_broken(item.path, key_prefix=f"{scope.key}/")
        reason = f"{reason}: {rule}" if rule else reason
    return SkippedPath(path=item.path, reason=reason)
