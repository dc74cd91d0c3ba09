"""The ``file`` connector: a file under an allowed directory of this machine (local backend only:
on AWS a function or a Fargate task has no user files to read, so it has no roots there)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from alphaagent.connectors.base import ConnectorRequest, EnvVar, Fetched, FetchLimits
from alphaagent.errors import ToolError
from alphaagent.wording import shown_json, shown_typed

NAME = "file"

EXAMPLES_DIR = Path(__file__).resolve().parent.parent.parent / "examples"
"""The checkout's ``examples/``: the local default root, so the demo's inputs are readable."""


class Request(ConnectorRequest):
    """``{"path": absolute path, "name"?}``."""

    path: str = Field(description="An absolute path inside an allowed directory.")


def check_local_roots(roots: tuple[str, ...]) -> tuple[str, ...]:
    """The roots of ``ALPHAAGENT_FILE_ROOTS`` as meant: ``~`` expanded (a shell leaves it in a
    quoted value), each an absolute path to an existing directory. A relative root would be
    resolved against whatever directory a command starts in, and a missing one matches nothing:
    both would only show later as every path refused. Raises ``ValueError`` saying the rule."""
    meant = []
    for root in roots:
        path = Path(root).expanduser()
        if not path.is_absolute():
            raise ValueError(f"{shown_typed(root)} is not an absolute path (each root is /... or ~/...)")
        if not path.is_dir():
            raise ValueError(f"{shown_typed(root)} is not an existing directory")
        meant.append(str(path))
    return tuple(meant)


class Settings(BaseModel):
    """Where the ``file`` connector may read."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    file_roots: Annotated[
        tuple[Path, ...],
        EnvVar(
            local="ALPHAAGENT_FILE_ROOTS",
            aws=None,
            separator=os.pathsep,
            local_default=(EXAMPLES_DIR,),
            local_check=check_local_roots,
        ),
    ] = Field(
        (),
        description="Directories the file connector may read from (resolved; symlinks out refused);"
        " os.pathsep-separated, each an absolute path (~ expanded) to an existing directory. Local"
        " default: the checkout's examples/; setting it replaces the default.",
    )
    forbidden_roots: tuple[Path, ...] = Field(
        (), description="Never readable, even inside a file root (the backend's data directory)."
    )


def describe(settings: Settings) -> str:
    """The tool text's sentence about this connector."""
    roots = ", ".join(str(root) for root in settings.file_roots) or "none"
    return f"'file' reads an absolute path under: {roots}."


def check(request: Request, settings: Settings, limits: FetchLimits, *, typed: str | None = None) -> Path:
    """The resolved path ``fetch`` would read, checked without reading it: inside a root, outside
    every forbidden root, a regular file, within ``limits.max_bytes``. Raises ``ToolError``.
    ``typed`` is the path as its author wrote it when a caller made it absolute (the CLI, for a
    spec's relative path): a refusal shows that, and where it resolves."""
    raw = request.path
    if not raw:
        raise ToolError("request.path: the file connector needs an absolute 'path'")
    if "\x00" in raw:
        raise ToolError("request.path: must not contain NUL")
    requested = Path(raw)
    real = requested.resolve()
    shown = raw if typed is None else typed
    where = f" (resolves to {real})" if str(real) != shown else ""
    if any(
        real == hidden.resolve() or hidden.resolve() in real.parents for hidden in settings.forbidden_roots
    ):
        raise ToolError(f"request.path: {shown_json(shown)} is inside the platform's data directory")
    roots = [root.resolve() for root in settings.file_roots]
    if not any(real == root or root in real.parents for root in roots):
        allowed = ", ".join(str(r) for r in roots) or "none configured"
        raise ToolError(
            f"request.path: {shown_json(shown)}{where} is outside the file connector's allowed"
            f" directories ({allowed}; set ALPHAAGENT_FILE_ROOTS)"
        )
    if not real.is_file():
        raise ToolError(f"request.path: {shown_json(shown)}{where} is not a file")
    size = real.stat().st_size
    if size > limits.max_bytes:
        raise ToolError(
            f"request.path: {shown_json(shown)} is {size} bytes, over the connector cap of {limits.max_bytes}"
        )
    return real


def fetch(request: Request, settings: Settings, limits: FetchLimits) -> Fetched:
    """Read ``request.path`` if it resolves inside a root and outside every forbidden root."""
    real = check(request, settings, limits)
    fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(limits.max_bytes + 1)
    return Fetched(data, request.name or real.name, f"file://{real}")
