"""One naming rule for what a run leaves behind, on both backends (DESIGN §4.2).

A file is stored, listed, read, exported and registered under its NFC name. Code may write a file
under any spelling (``cafe\u0301.txt``, decomposed, is what macOS-made data and many libraries
produce), so after each run, and before anything else looks at its files, every created or modified
path is settled here:

- a valid name already in NFC is kept as it is;
- a valid name in another form is renamed in the working tree to its NFC form and reported under it;
- if that NFC name is already another file's (two spellings of one name), the second one (in sorted
  order, after any file already spelled in NFC) is skipped, with the reason naming the NFC name;
- a name that breaks a path rule is skipped with the rule and the measured value
  (``check_workspace_path``: "the full key is 1100 UTF-8 bytes, over S3's 1024-byte key limit").

Locally the working tree is the scope itself; on AWS it is the function's working copy, synced up
afterwards. A skipped file is left where it is, untouched: nothing addresses it, and locally it is
still the user's file on disk.

Example::

    result = settle_run_names(root, result, key_prefix=f"{scope.key}/")
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Final

from alphaagent.errors import PathRuleError
from alphaagent.models.common import check_workspace_path
from alphaagent.models.run import FileChangeReport, RunResult, SkippedPath

NOT_STORED: Final = "not stored: "
"""Prefix of the reason of a file a run wrote but the workspace does not keep."""


def settle_names(root: Path, files: FileChangeReport, *, key_prefix: str) -> FileChangeReport:
    """Apply the naming rule (module docstring) to the created and modified files of ``files``
    under ``root``; return the report as it is now true. ``key_prefix`` is the scope's key and
    ``/`` (the full key must stay within S3's 1,024 bytes); ``""`` checks the relative path alone.

    Raises:
        OSError: a rename failed for a reason other than the file having gone (a platform failure).
    """
    skipped = list(files.skipped)
    kept: dict[str, list[str]] = {"created": [], "modified": []}
    taken = {path for path in [*files.created, *files.modified] if _nfc_or_none(path, key_prefix) == path}
    renamed: set[str] = set()
    # NFC spellings first (they keep their name), then the others in sorted order.
    ordered = sorted(
        [(kind, path) for kind in kept for path in getattr(files, kind)],
        key=lambda item: (item[1] not in taken, item[1]),
    )
    for kind, path in ordered:
        try:
            normal = check_workspace_path(path, prefix=key_prefix)
        except PathRuleError as exc:
            skipped.append(SkippedPath(path=path, reason=f"{NOT_STORED}{exc}"))
            continue
        if normal == path:
            kept[kind].append(path)
            continue
        if normal in taken or normal in renamed or os.path.lexists(root / normal):
            skipped.append(
                SkippedPath(
                    path=path,
                    reason=(
                        f"{NOT_STORED}its NFC name {normal!r} is another file's (two spellings of one"
                        " name; files are stored under their NFC name)"
                    ),
                )
            )
            continue
        target = root / normal
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(root / path, target)
        except FileNotFoundError:
            skipped.append(SkippedPath(path=path, reason=f"{NOT_STORED}the file is gone"))
            continue
        with contextlib.suppress(OSError):
            # The decomposed spelling's folders, if now empty, go too: nothing else can address them.
            parent = (root / path).parent
            while parent != root and not any(parent.iterdir()):
                parent.rmdir()
                parent = parent.parent
        renamed.add(normal)
        kept["created"].append(normal)  # new under its NFC name, whatever it was under the other
    return files.model_copy(
        update={
            "created": sorted(kept["created"]),
            "modified": sorted(kept["modified"]),
            "skipped": sorted(skipped, key=lambda item: (item.path, item.reason)),
        }
    )


def settle_run_names(root: Path, result: RunResult, *, key_prefix: str) -> RunResult:
    """``result`` with ``settle_names`` applied to its files, and ``files_changed`` made to match
    (every path kept, created, modified or deleted; none of the skipped ones)."""
    files = settle_names(root, result.files, key_prefix=key_prefix)
    changed = sorted({*files.created, *files.modified, *files.deleted})
    return result.model_copy(update={"files": files, "files_changed": changed})


def path_rule_broken(path: str, *, key_prefix: str) -> str:
    """The rule ``path`` breaks as a stored name, with the measured value (``check_workspace_path``'s
    message), or that it is not in NFC; ``""`` for a name that breaks none."""
    try:
        normal = check_workspace_path(path, prefix=key_prefix)
    except PathRuleError as exc:
        return str(exc)
    except UnicodeError:
        return "the name is not UTF-8"
    return "" if normal == path else f"the name is not in NFC (its NFC form is {normal!r})"


def unaddressable_reason(path: str, *, key_prefix: str) -> str:
    """The reason a listing gives for a stored name no method can address: the rule it breaks,
    with the measured value."""
    return f"name cannot be addressed: {path_rule_broken(path, key_prefix=key_prefix) or 'a path rule'}"


def _nfc_or_none(path: str, key_prefix: str) -> str | None:
    try:
        return check_workspace_path(path, prefix=key_prefix)
    except PathRuleError:
        return None
