"""Where a session's live state lives in its scope, and what the supervisor asks of the child about
it (DESIGN §4.7). The child restores and saves (``state.py``, loaded by the zygote); nothing here
unpickles anything: the supervisor and the backends only place, list, move and delete state files.

Example::

    state = StateRequest(session_id=session.session_id, max_bytes=512 * 2**20)
    result = sandbox.run("x = 41", cwd=root, state=state)
    result = sandbox.run("print(x + 1)", cwd=root, state=state)   # prints 42
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from alphaagent.errors import InvalidRequestError
from alphaagent.sandbox.removal import remove_at

SESSIONS_DIR: Final = "work/sessions"
"""The platform-owned folder of every scope that holds its sessions' states, one folder per session
(``work/sessions/{session_id}/``): never reported as the code's changes, never synced from a run."""

DEFAULT_STATE_MB: Final = 512
"""The default cap of a session's saved state (``EnvironmentLimits.state_mb``, DESIGN §4.7)."""

DEFAULT_SAVE_S: Final = 10.0
"""The default cap on the time the child spends saving after the code ran, in seconds: past it the
largest objects are dropped. Ten seconds write ~1 GB on a slow disk, and are part of the run's own
wall clock, so a run near its timeout loses its save, never its result."""

MANIFEST: Final = "manifest.json"
_SESSION_ID: Final = re.compile(r"[0-9A-Za-z_-]{1,64}")
_STATE_FILE: Final = re.compile(r"g[0-9]{1,12}-[0-9a-f]{8}\.(pkl|bin)")


@dataclass(frozen=True)
class StateRequest:
    """What a run keeps of its session's state.

    ``session_id``: whose state (a platform id, 1-64 of ``[0-9A-Za-z_-]``). ``fresh``: run with
    empty globals and keep the saved state as it is. ``max_bytes``: the cap of the saved state
    (the environment's ``state_mb`` in bytes). ``max_save_s``: the save time cap, seconds.

    Raises ``InvalidRequestError`` for a session id that could not be a folder name.
    """

    session_id: str
    fresh: bool = False
    max_bytes: int = DEFAULT_STATE_MB * 2**20
    max_save_s: float = DEFAULT_SAVE_S

    def __post_init__(self) -> None:
        if not _SESSION_ID.fullmatch(self.session_id):
            raise InvalidRequestError("session_id: must be 1-64 of [0-9A-Za-z_-]")
        if self.max_bytes < 1 or self.max_save_s <= 0:
            raise InvalidRequestError("state: max_bytes must be >= 1 and max_save_s > 0")

    @property
    def path(self) -> str:
        """The state's folder, workspace-relative: ``work/sessions/{session_id}``."""
        return state_path(self.session_id)

    def for_child(self) -> dict[str, Any]:
        """The ``state`` field of the zygote's spawn request (see ``zygote._SessionState``)."""
        return {
            "dir": self.path,
            "fresh": self.fresh,
            "max_bytes": self.max_bytes,
            "max_save_s": self.max_save_s,
        }


def valid_session_id(session_id: str) -> bool:
    """Whether ``session_id`` can name a state folder (1-64 of ``[0-9A-Za-z_-]``)."""
    return bool(_SESSION_ID.fullmatch(session_id))


def is_session_state(path: str) -> bool:
    """Whether the normalised workspace path ``path`` is ``work/sessions`` or below it: the sessions'
    live state, platform-owned (DESIGN §4.7), so never a user's file. ``files``, ``cat``, export, the
    viewer, ``read_document``, citations, inputs and ``register_artifact`` answer for such a path
    exactly as for a missing one, and leave it out of every listing (a pickle is not the user's
    work, and unpickled later it is code)."""
    return path == SESSIONS_DIR or path.startswith(SESSIONS_DIR + "/")


def state_path(session_id: str) -> str:
    """``work/sessions/{session_id}``: the workspace-relative folder of a session's state."""
    return f"{SESSIONS_DIR}/{session_id}"


def state_files(root: Path, session_id: str) -> list[str]:
    """The workspace-relative paths of the session's current state, manifest LAST (so an upload in
    this order never makes a manifest visible before the files it names): what the manifest in
    ``root``'s state folder names, if it is a regular file with a sane layout; [] when there is no
    state. Files the manifest does not name (a run's own writes there, leftovers) are not listed."""
    data = read_state_file(root, session_id, MANIFEST, max_bytes=1 << 22)
    if data is None:
        return []
    try:
        manifest = json.loads(data)
        names = {str(manifest["pickle"]), *(str(ref["file"]) for ref in manifest.get("buffers", []))}
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return []
    if not all(_STATE_FILE.fullmatch(name) for name in names):
        return []
    base = state_path(session_id)
    return [f"{base}/{name}" for name in sorted(names)] + [f"{base}/{MANIFEST}"]


def _open_state_file(root: Path, session_id: str, name: str) -> int | None:
    """A read descriptor of the regular file ``name`` of the session's state folder, reached from
    the scope root without following a link (``open_state_dir``: the run may have made ``work``,
    ``work/sessions``, the folder or the file a symlink); None when it is missing, or is not a
    regular file reached so."""
    # The child's own walk (state.py is stdlib-only); imported here, not at the module's import:
    # it brings ctypes and pickle, which the CLI's commands do not need.
    from alphaagent.sandbox.state import open_state_dir

    if "/" in name or name in ("", ".", ".."):
        return None
    try:
        folder = open_state_dir(str(root), state_path(session_id), create=False)
    except (OSError, ValueError):
        return None
    if folder is None:
        return None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
    except OSError:
        return None
    finally:
        os.close(folder)
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device the run put there
        os.close(fd)
        return None
    return fd


def read_state_file(root: Path, session_id: str, name: str, *, max_bytes: int | None = None) -> bytes | None:
    """The bytes (at most ``max_bytes``) of the file ``name`` of the session's state folder under
    the scope root ``root``, or None when it cannot be reached without following a link, or is
    not a regular file (see ``_open_state_file``)."""
    fd = _open_state_file(root, session_id, name)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as fh:
        return fh.read() if max_bytes is None else fh.read(max_bytes)


def state_file_size(root: Path, session_id: str, name: str) -> int | None:
    """The size in bytes of the file ``name`` of the session's state folder, reached as
    ``read_state_file`` reaches it; None when it cannot be."""
    fd = _open_state_file(root, session_id, name)
    if fd is None:
        return None
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def drop_state(root: Path, session_id: str) -> bool:
    """Delete a session's state folder under the scope root ``root`` (its session ended); True if
    there was one. ``root`` is the platform's; ``work/`` and ``work/sessions/`` below it are reached
    without following a symlink (a run may have made ``work/sessions`` a link to another scope or a
    home folder: then there is no state here to drop, and nothing there is touched). Symlinks inside
    are removed, never followed; the run may have nested the folder thousands of levels deep
    (``remove_at``: iterative and bounded)."""
    try:
        folder = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        for part in SESSIONS_DIR.split("/"):
            try:
                below = os.open(
                    part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder
                )
            except OSError as error:
                if error.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                    return False
                raise
            os.close(folder)
            folder = below
        return remove_at(folder, session_id, label=str(root / state_path(session_id)))
    finally:
        os.close(folder)
