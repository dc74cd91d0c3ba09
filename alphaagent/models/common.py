"""Identifiers and scopes (DESIGN §4.1, §4.2): the vocabulary every other contract uses."""

from __future__ import annotations

import re
import unicodedata
from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, StringConstraints

from alphaagent.errors import PathRuleError
from alphaagent.models.bounds import ENVIRONMENT_ID_PATTERN, SCOPE_ID_PATTERN

UserId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._@:-]{1,128}$")]
"""Opaque user id: 1–128 chars of ``[A-Za-z0-9._@:-]`` (DESIGN §4.1)."""

ConversationId = Annotated[str, StringConstraints(pattern=SCOPE_ID_PATTERN)]
WorkflowExecutionId = Annotated[str, StringConstraints(pattern=SCOPE_ID_PATTERN)]
NodeId = Annotated[str, StringConstraints(pattern=SCOPE_ID_PATTERN)]
Ulid = Annotated[str, StringConstraints(pattern=r"^[0-9A-HJKMNP-TV-Z]{26}$")]
"""A ULID: 26 Crockford base32 characters (turn and run ids)."""

EnvironmentId = Annotated[str, StringConstraints(pattern=ENVIRONMENT_ID_PATTERN)]
"""1–32 chars of ``[a-z0-9-]`` starting with a letter; ``builtin`` is the default."""

ArtifactName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")]
"""1–64 chars of ``[a-z0-9][a-z0-9._-]*``."""

SessionId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{22,64}$")]
"""At least 128 random bits, URL-safe base64 (``secrets.token_urlsafe(24)``: 192 bits)."""

MAX_KEY_BYTES = 1024
"""S3's maximum object key length in UTF-8 bytes (DESIGN §4.2)."""

SCOPE_FOLDERS = ("spec", "docs", "datasets", "charts", "reports", "work")
"""The six folders of every scope (DESIGN §4.2)."""


_BIDI_CONTROLS = frozenset(
    "\u200e\u200f\u061c"  # the directional marks
    "\u202a\u202b\u202c\u202d\u202e"  # embeddings and overrides
    "\u2066\u2067\u2068\u2069"  # isolates
    "\u206a\u206b\u206c\u206d\u206e\u206f"  # the deprecated shaping and direction controls
)

MAX_SEGMENT_BYTES = 255
"""Longest path segment, in UTF-8 bytes: NAME_MAX of Linux file systems (ext4, tmpfs, overlayfs)."""


def printable_path(path: str) -> str:
    """``path`` as one line a terminal shows as it is: control characters (C0, DEL, C1), line and
    paragraph separators and bidirectional controls are written as ``\\xNN``/``\\uNNNN`` escapes,
    and bytes that were not UTF-8 as ``\\xNN``. For names that code created (which need not follow
    the path rules) in text for people: a name must not clear a screen, set a window title, start a
    forged line or reverse the text after it."""
    text = path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if text.isprintable() and not any(ch in _BIDI_CONTROLS for ch in text):
        return text
    return "".join(
        ch.encode("unicode_escape").decode("ascii")
        if unicodedata.category(ch) in ("Cc", "Zl", "Zp") or ch in _BIDI_CONTROLS
        else ch
        for ch in text
    )


_UNSAFE_IN_TEXT = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029" + "".join(sorted(_BIDI_CONTROLS)) + "]"
)


def printable_text(text: str) -> str:
    """Untrusted text (a run's output) made safe to write to a terminal by the rule of
    ``printable_path``, keeping its lines: line feeds and tabs stay, every other control character
    (C0, DEL, C1: so ESC, and with it every escape sequence), line and paragraph separator and
    bidirectional control is written as a ``\\xNN``/``\\uNNNN`` escape. A carriage return is
    escaped too: it could overwrite what the line showed before it.

    Example: ``printable_text("ok\\x1b]0;title\\x07\\n")`` is ``"ok\\\\x1b]0;title\\\\x07\\n"``.
    """
    return _UNSAFE_IN_TEXT.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def check_workspace_path(path: str, *, prefix: str = "") -> str:
    """Validate and NFC-normalise a workspace-relative path handed in by code, the coder or a user.

    Rejected (``PathRuleError``): empty; absolute; ``..`` or ``.`` segments; NUL or other control
    characters (C0, DEL and C1: U+0080-U+009F holds the terminal's CSI) and the line and paragraph
    separators (U+2028, U+2029: ``splitlines()`` splits on them); the bidirectional marks,
    overrides and isolates (U+200E-F, U+061C, U+202A-E, U+2066-F: ``report\u202egnp.exe`` shows
    as ``reportexe.png``); a backslash; leading, trailing or doubled ``/``; a segment over 255 UTF-8
    bytes (NAME_MAX of Linux filesystems: such a file could not be synced to a working copy); a key
    (``prefix`` + path) over 1,024 UTF-8 bytes (S3's key limit). Percent-encoding is not decoded:
    ``..%2F`` is a literal name.
    """
    if not isinstance(path, str) or path == "":
        raise PathRuleError("path must not be empty")
    normal = unicodedata.normalize("NFC", path)
    if any(unicodedata.category(ch) in ("Cc", "Zl", "Zp") for ch in normal):
        raise PathRuleError("path must not contain NUL, control characters or line separators")
    if any(ch in _BIDI_CONTROLS for ch in normal):
        raise PathRuleError(
            "path must not contain bidirectional control characters (U+200E-F, U+202A-E, U+2066-F)"
        )
    if normal.startswith("/"):
        raise PathRuleError("path must be relative to the scope (no leading '/')")
    if "\\" in normal:
        raise PathRuleError("path must use '/' as separator (no '\\')")
    if normal.endswith("/") or "//" in normal:
        raise PathRuleError("path must not contain empty segments (trailing or doubled '/')")
    if any(part in ("..", ".") for part in normal.split("/")):
        raise PathRuleError("path must stay inside the scope ('.' and '..' segments are not allowed)")
    longest = max(len(part.encode("utf-8")) for part in normal.split("/"))
    if longest > MAX_SEGMENT_BYTES:
        raise PathRuleError(
            f"path has a segment of {longest} UTF-8 bytes, over the {MAX_SEGMENT_BYTES}-byte limit"
            " of a file name (NAME_MAX)"
        )
    key_bytes = len((prefix + normal).encode("utf-8"))
    if key_bytes > MAX_KEY_BYTES:
        raise PathRuleError(
            f"path is too long: the full key is {key_bytes} UTF-8 bytes, over S3's"
            f" {MAX_KEY_BYTES}-byte key limit"
        )
    return normal


WorkspacePath = Annotated[str, AfterValidator(check_workspace_path)]


class ConversationScope(BaseModel):
    """A conversation: ``conversations/{conversation_id}/``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    conversation_id: ConversationId

    @property
    def key(self) -> str:
        """The scope's prefix in the bucket and under ``$ALPHAAGENT_HOME``, without a trailing '/'."""
        return f"conversations/{self.conversation_id}"

    @property
    def owner_key(self) -> str:
        """What ownership is claimed on: the conversation."""
        return self.key


class NodeScope(BaseModel):
    """One node of a workflow run: ``workflows/{workflow_execution_id}/nodes/{node_id}/``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workflow_execution_id: WorkflowExecutionId
    node_id: NodeId

    @property
    def key(self) -> str:
        """The scope's prefix, without a trailing '/'."""
        return f"workflows/{self.workflow_execution_id}/nodes/{self.node_id}"

    @property
    def owner_key(self) -> str:
        """What ownership is claimed on: the whole workflow execution (its nodes share an owner)."""
        return f"workflows/{self.workflow_execution_id}"


Scope = ConversationScope | NodeScope


def scope_from_key(key: str) -> Scope:
    """Inverse of ``Scope.key``; raises ``ValueError`` for anything else."""
    parts = key.split("/")
    if len(parts) == 2 and parts[0] == "conversations":
        return ConversationScope(conversation_id=parts[1])
    if len(parts) == 4 and parts[0] == "workflows" and parts[2] == "nodes":
        return NodeScope(workflow_execution_id=parts[1], node_id=parts[3])
    raise ValueError(f"not a scope key: {key!r}")


def utcnow() -> datetime:
    """The current time, timezone-aware UTC (every timestamp in records and events)."""
    return datetime.now(UTC)


ArtifactKind = Literal["dataset", "chart", "report"]

KIND_SUFFIXES: dict[str, tuple[str, ...]] = {
    "dataset": (".csv", ".parquet", ".json", ".xlsx"),
    "chart": (".png", ".svg", ".jpg", ".jpeg", ".html"),
    "report": (".md", ".html", ".pdf", ".txt"),
}
"""File types each artifact kind accepts (issue 3 §9): checked on a spec's outputs before any code
and again when a file is registered."""

ARTIFACT_FOLDERS = ("datasets", "charts", "reports", "work")
"""Where a registered file may live (case PATH-03): never spec/ (the platform's) nor docs/ (inputs)."""


def unknown_field(stray: str, known: list[str] | tuple[str, ...]) -> str:
    """The one wording for a field a model refuses: ``unknown field``, with ``(did you mean
    'path'?)`` when one of the ``known`` field names is close to ``stray`` (``difflib`` ratio at
    least ``CLOSE_MATCH_CUTOFF``), used by the spec and the connector requests alike."""
    from alphaagent.suggest import did_you_mean

    return "unknown field" + did_you_mean(stray, known)
