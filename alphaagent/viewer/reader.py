"""The viewer's reads: one user's work, through the ``Store`` and ``Workspace`` Protocols of either
backend, with ownership checked first on every call.

Another user's scope, turn, run, artifact or file is answered exactly like a missing one: the same
``NotFoundError`` (the web layer turns every one into the same 404 page), raised before anything of
the scope is read, and no read writes anything (DESIGN §4.7).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import BinaryIO

from alphaagent.errors import NotFoundError, PathRuleError
from alphaagent.models.common import Scope, check_workspace_path, scope_from_key
from alphaagent.models.records import ArtifactVersion, RunRecord, ScopeSummary, Turn
from alphaagent.ports import FileInfo, Store, Workspace
from alphaagent.sandbox.session import is_session_state

Opener = Callable[[], tuple[Store, Workspace] | None]
"""Opens the backend's store and workspace, or answers None while there is no data at all (a local
data directory nobody has written yet: the viewer never creates it)."""


class WorkspaceReader:
    """Owner-checked reads of ``user_id``'s scopes. ``opener`` is called until it returns the
    adapters (then they are kept), so a viewer started before the first turn shows it once it exists.
    """

    def __init__(self, user_id: str, opener: Opener) -> None:
        self.user_id = user_id
        self._opener = opener
        self._opened: tuple[Store, Workspace] | None = None

    def _adapters(self) -> tuple[Store, Workspace] | None:
        if self._opened is None:
            self._opened = self._opener()
        return self._opened

    def _owned(self, scope: Scope) -> tuple[Store, Workspace]:
        adapters = self._adapters()
        if adapters is None:
            raise NotFoundError("not found")
        store, workspace = adapters
        if store.owner_of(scope.owner_key) != self.user_id or not workspace.scope_exists(scope):
            raise NotFoundError("not found")
        return adapters

    def scopes(self) -> list[tuple[Scope, ScopeSummary]]:
        """The user's scopes, the newest turn first (scopes whose keys no longer parse are left out)."""
        adapters = self._adapters()
        if adapters is None:
            return []
        listed = []
        for summary in adapters[0].list_scopes(self.user_id):
            try:
                listed.append((scope_from_key(summary.scope_key), summary))
            except ValueError:
                continue
        return listed

    def check(self, scope: Scope) -> None:
        """``NotFoundError`` unless the scope exists and is the user's."""
        self._owned(scope)

    def turns(self, scope: Scope) -> list[Turn]:
        """The scope's turns, newest first."""
        store, _ = self._owned(scope)
        return list(reversed(store.list_turns(self.user_id, scope.key)))

    def turn(self, scope: Scope, turn_id: str) -> Turn:
        """One turn of the scope."""
        store, _ = self._owned(scope)
        turn = store.get_turn(self.user_id, turn_id)
        if turn is None or turn.scope_key != scope.key:
            raise NotFoundError("not found")
        return turn

    def runs(self, scope: Scope, turn_id: str | None = None) -> list[RunRecord]:
        """The scope's runs (or one turn's), oldest first, with their stored outputs."""
        store, _ = self._owned(scope)
        runs = store.list_runs(self.user_id, scope.key)
        return runs if turn_id is None else [run for run in runs if run.turn_id == turn_id]

    def artifacts(self, scope: Scope) -> list[ArtifactVersion]:
        """Every version of every artifact of the scope, by name then version."""
        store, _ = self._owned(scope)
        return store.list_artifacts(self.user_id, scope.key)

    def artifact(self, scope: Scope, name: str, version: int) -> tuple[ArtifactVersion, bytes]:
        """One artifact version and its immutable bytes."""
        store, workspace = self._owned(scope)
        found = store.get_artifact(self.user_id, scope.key, name, version)
        if found is None:
            raise NotFoundError("not found")
        try:
            return found, workspace.read_blob(found.sha256)
        except FileNotFoundError:
            raise NotFoundError("not found") from None

    def files(self, scope: Scope) -> tuple[list[FileInfo], list[tuple[str, str]]]:
        """The scope's regular files by path, and what was left out (display path, reason); the
        sessions' state is platform-owned and in neither."""
        _, workspace = self._owned(scope)
        skipped: list[tuple[str, str]] = []
        files = [f for f in workspace.list_files(scope, "", skipped) if not is_session_state(f.path)]
        return files, [(path, why) for path, why in skipped if not is_session_state(path)]

    def file(self, scope: Scope, path: str) -> tuple[FileInfo, BinaryIO]:
        """A file's info and a reader of its bytes (the caller closes it)."""
        _, workspace = self._owned(scope)
        try:
            normal = check_workspace_path(path, prefix=scope.key + "/")
            info = None if is_session_state(normal) else workspace.stat(scope, normal)
            if info is None:
                raise FileNotFoundError(normal)
            return info, workspace.open_file(scope, normal)
        except (PathRuleError, FileNotFoundError):
            raise NotFoundError("not found") from None

    def file_bytes(self, scope: Scope, path: str, limit: int) -> bytes | None:
        """A file's bytes if it is at most ``limit`` bytes, else None."""
        info, reader = self.file(scope, path)
        with reader:
            return reader.read() if info.size_bytes <= limit else None
