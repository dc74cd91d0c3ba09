"""A turn's declared inputs (DESIGN §3, prepare): resolved against the scope's artifacts and the
connectors, and brought into ``docs/`` under stable names with a version sidecar; the local driver
and the AWS Prepare step share these.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import PurePosixPath

from alphaagent.connectors import check, fetch
from alphaagent.domain.backend import Backend
from alphaagent.domain.tools import (
    TurnContext,
)
from alphaagent.errors import (
    InvalidSpecError,
    ToolError,
)
from alphaagent.models.common import NodeScope, Scope
from alphaagent.models.records import ArtifactVersion, PreparedInput
from alphaagent.models.spec import (
    ConnectorInput,
    DatasetInput,
    DocumentInput,
    NodeArtifactInput,
    Spec,
)
from alphaagent.ports import Workspace
from alphaagent.sandbox.session import is_session_state
from alphaagent.wording import shown_json

SIDECAR_SUFFIX = ".version.json"
"""A registered artifact copied into ``docs/`` gets a sidecar next to it, ``docs/NAME.EXT`` +
``.version.json``, naming the artifact version the copy holds (code can read it; people can too)."""


class ResolvedInput:
    """A declared input, resolved: where it goes in ``docs/`` and what to put there (``None``: a
    document already in the scope, used in place; ``blob``: a registered artifact version's
    content, copied under a stable name with a sidecar)."""

    def __init__(
        self,
        path: str,
        data: bytes | None,
        note: str,
        blob: str | None = None,
        artifact: ArtifactVersion | None = None,
    ) -> None:
        self.path, self.data, self.note, self.blob, self.artifact = path, data, note, blob, artifact

    def prepared(self) -> PreparedInput:
        """What the turn records of this input (its result's ``inputs``)."""
        found = self.artifact
        if found is None:
            return PreparedInput(path=self.path, note=self.note)
        return PreparedInput(
            path=self.path, note=self.note, artifact=found.name, version=found.version, sha256=found.sha256
        )

    def written_paths(self) -> list[str]:
        """The ``docs/`` paths bringing this input writes (none for a document used in place)."""
        if self.blob is not None:
            return [self.path, self.path + SIDECAR_SUFFIX]
        return [self.path] if self.data is not None else []


def copy_path(folder: str, found: ArtifactVersion, taken: set[str]) -> str:
    """``{folder}/NAME.EXT``: the same name for every version, so code that reads it never reads an
    older version by accident (the previous turn's copy is replaced; the sidecar names the version).
    A spec that asks for a second version of the same artifact (to compare them) gets that one as
    ``{folder}/NAME.vN.EXT``: a name it asked for by version, never one it could read by accident."""
    suffix = PurePosixPath(found.path).suffix
    stable = f"{folder}/{found.name}{suffix}"
    if stable not in taken:
        taken.add(stable)
        return stable
    return f"{folder}/{found.name}.v{found.version}{suffix}"


def check_connector_inputs(backend: Backend, spec: Spec) -> None:
    """Refuse the spec's connector inputs for what can be told without fetching or writing (a file
    outside the roots or missing, a host not allowed): they do not depend on the scope, so a turn
    for a busy scope is refused at once instead of after waiting for its lease. Raises
    ``InvalidSpecError`` naming ``inputs[i]``."""
    for i, item in enumerate(spec.inputs):
        if isinstance(item, ConnectorInput):
            try:
                check(backend.connectors, item.connector, item.request)
            except ToolError as exc:
                raise InvalidSpecError(f"inputs[{i}].{exc}") from None


def resolve_inputs(backend: Backend, spec: Spec) -> list[ResolvedInput]:
    """Check and fetch every declared input into memory; raise ``InvalidSpecError`` naming
    ``inputs[i]`` for the first that is missing, not allowed or too large. Nothing is written."""
    workspace, store, scope, user_id = backend.workspace, backend.store, spec.scope, spec.user_id
    owned = store.owner_of(scope.owner_key) == user_id
    resolved: list[ResolvedInput] = []
    stable_names: set[str] = set()
    for i, item in enumerate(spec.inputs):
        if isinstance(item, DocumentInput):
            if not owned or is_session_state(item.path) or workspace.stat(scope, item.path) is None:
                raise InvalidSpecError(
                    f"inputs[{i}].path: {shown_json(item.path)} is not a file of this scope"
                )
            resolved.append(ResolvedInput(item.path, None, f"using {item.path}"))
        elif isinstance(item, DatasetInput):
            found = store.get_artifact(user_id, scope.key, item.name, item.version) if owned else None
            if found is None or found.kind != "dataset":
                wanted = f"{item.name} v{item.version}" if item.version else item.name
                raise InvalidSpecError(f"inputs[{i}]: no registered dataset {wanted} in this scope")
            note = f"copied dataset {found.name} v{found.version}"
            target = copy_path("docs", found, stable_names)
            # copied one at a time later, so that only one blob is in memory at once
            resolved.append(ResolvedInput(target, None, note, blob=found.sha256, artifact=found))
        elif isinstance(item, ConnectorInput):
            try:
                target, data, source = fetch(backend.connectors, item.connector, item.request)
            except ToolError as exc:
                raise InvalidSpecError(f"inputs[{i}].{exc}") from None
            resolved.append(ResolvedInput(target, data, f"fetched from {source}"))
        elif isinstance(item, NodeArtifactInput):
            assert isinstance(scope, NodeScope)
            source_scope = NodeScope(workflow_execution_id=scope.workflow_execution_id, node_id=item.node_id)
            found = store.get_artifact(user_id, source_scope.key, item.artifact, item.version)
            if found is None:
                raise InvalidSpecError(f"inputs[{i}]: node {item.node_id} has no artifact {item.artifact}")
            target = copy_path(f"docs/{item.node_id}", found, stable_names)
            note = f"copied {item.node_id}/{found.name} v{found.version}"
            resolved.append(ResolvedInput(target, None, note, blob=found.sha256, artifact=found))
    seen: dict[str, int] = {}
    for i, resolved_input in enumerate(resolved):
        for path in resolved_input.written_paths():
            if path in seen:
                raise InvalidSpecError(
                    f"inputs[{i}]: would be written to {path}, as inputs[{seen[path]}] is; give one of"
                    " them another name"
                )
            seen[path] = i
    return resolved


def write_inputs(
    workspace: Workspace, scope: Scope, turn_id: str, inputs: Sequence[ResolvedInput]
) -> list[PreparedInput]:
    """Write resolved inputs into the scope's ``docs/`` (DESIGN §3 step 4): fetched bytes as they
    are, a registered version under its stable name (replacing the previous turn's copy) with its
    sidecar. Shared by the local driver and the AWS prepare step. Returns what was brought."""
    brought: list[PreparedInput] = []
    for item in inputs:
        if item.blob is not None:
            assert item.artifact is not None
            workspace.write_bytes(scope, item.path, workspace.read_blob(item.blob))
            workspace.write_bytes(scope, item.path + SIDECAR_SUFFIX, sidecar(item.artifact, turn_id))
        elif item.data is not None:
            workspace.write_bytes(scope, item.path, item.data)
        brought.append(item.prepared())
    return brought


def sidecar(found: ArtifactVersion, turn_id: str) -> bytes:
    document = {
        "artifact": found.name,
        "kind": found.kind,
        "version": found.version,
        "sha256": found.sha256,
        "size_bytes": found.size_bytes,
        "registered_path": found.path,
        "copied_by_turn": turn_id,
    }
    return (json.dumps(document, indent=2) + "\n").encode()


def bring_inputs(ctx: TurnContext, inputs: list[ResolvedInput]) -> None:
    """Write the resolved inputs into ``docs/`` (DESIGN §3 step 4)."""
    for item in write_inputs(ctx.backend.workspace, ctx.scope, ctx.turn_id, inputs):
        ctx.fetched.append(item.path)
        ctx.origins[item.path] = item.note
        ctx.inputs.append(item)
        ctx.progress(f"{item.note} -> {item.path}")
