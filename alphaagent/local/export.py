"""Export a scope's files as one zip archive, with a manifest of everything left out (DESIGN §4.3).

Rules, in the order a user would ask about them:

* **Per-file ceiling, inclusive.** A file of at most ``max_file_bytes`` bytes (25 MiB = 26,214,400 by
  default, DESIGN §4.3) is included; a larger one is omitted. So a file of exactly 25 MiB is in the
  archive and one of 25 MiB + 1 byte is not (case ZIP-01).
* **Never silently dropped.** Every omitted file is listed, with its workspace path, its size in bytes,
  the reason and the ceiling, in ``MANIFEST.json`` and ``MANIFEST.txt`` at the archive's root and in the
  returned ``ExportReport``. Besides ``too_large``, a file that vanished or became unreadable between
  the listing and the copy is omitted as ``unreadable``.
* **Regular files only.** The files are those of ``Workspace.list_files``, which never lists or follows
  a symlink, FIFO or device, and each is read through ``Workspace.open_file``, which never follows one
  either: a link to ``/proc/self/environ``, ``/etc/passwd`` or ``/usr`` contributes nothing (PATH-01).
* **The user's files only.** ``work/sessions/`` (the sessions' pickled live state, platform-owned,
  DESIGN §4.7) is neither exported nor listed as omitted.
* **Names safe to extract anywhere** (PATH-03, and Windows): see ``safe_archive_name``. Two files that
  would land on the same name, compared case-insensitively as Windows and macOS do, get distinct names
  by a ``~2``, ``~3``, ... before the extension (``report~2.md``); names that needed no change keep it,
  and the manifest maps every workspace path to its archive name.
* **Whole or nothing.** The archive is written to a temporary file next to ``out`` and renamed onto it
  at the end, so a failure leaves no half-written zip (and an older ``out`` untouched).
* **Streaming and ZIP64.** Contents are copied in 1 MiB blocks (constant memory); ZIP64 records are
  written when the archive passes 4 GiB or 65,535 entries. Entries are in sorted path order; the two
  manifests come last. Already-compressed formats (``.png``, ``.parquet``, ``.zip``, ...) and files
  of at most ``STORED_MAX_BYTES`` are stored, everything else deflated.

Example::

    report = export_scope(workspace, ConversationScope(conversation_id="c1"), Path("c1.zip"))
    report.omitted  # [OmittedFile(path='datasets/full.csv', size_bytes=31457280, reason='too_large')]
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import re
import stat
import tempfile
import zipfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, BinaryIO, Final, NamedTuple

from alphaagent.errors import PathRuleError
from alphaagent.models.common import Scope, printable_path, utcnow
from alphaagent.ports import FileInfo, Workspace
from alphaagent.sandbox.session import is_session_state
from alphaagent.wording import count

MiB: Final = 2**20
DEFAULT_MAX_FILE_BYTES: Final = 25 * MiB
"""Per-file ceiling of the workspace export, in bytes (25 MiB, DESIGN §4.3); inclusive."""

BLOCK_BYTES: Final = MiB
"""Contents are copied into the archive in blocks of 1 MiB."""

MANIFEST_JSON: Final = "MANIFEST.json"
MANIFEST_TXT: Final = "MANIFEST.txt"
MANIFEST_VERSION: Final = 1

REASON_TOO_LARGE: Final = "too_large"
"""Omitted: larger than the per-file ceiling."""
REASON_UNREADABLE: Final = "unreadable"
"""Omitted: listed, but gone, no longer a regular file, or not readable when it was to be copied."""

_REASON_TEXT: Final = {
    REASON_TOO_LARGE: "larger than the per-file export ceiling",
    REASON_UNREADABLE: "missing, no longer a regular file, or unreadable when it was to be copied",
}

# Characters Windows refuses in a name, plus '\\' (a separator there) and C0 controls and DEL.
_UNSAFE_CHARS: Final = re.compile(r'[<>:"|?*\\\x00-\x1f\x7f]')
_TRAILING_DOTS_SPACES: Final = re.compile(r"[. ]+$")
# Windows device names, reserved with or without an extension and in any case (Microsoft's "Naming
# Files, Paths, and Namespaces"); the superscript digits and the 0 variants are reserved too.
_RESERVED_NAMES: Final = frozenset(
    {"CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$"}
    | {f"{port}{digit}" for port in ("COM", "LPT") for digit in (*"0123456789", "¹", "²", "³")}
)
_STORED_SUFFIXES: Final = frozenset(
    {".png", ".jpg", ".jpeg", ".gif", ".webp", ".zip", ".gz", ".tgz", ".bz2", ".xz", ".zst", ".7z"}
    | {".parquet", ".feather", ".arrow", ".npz", ".mp3", ".mp4", ".woff2"}
)

STORED_MAX_BYTES: Final = 64
"""Files of at most this many bytes are stored, not deflated: deflate cannot save more than a few of
their bytes (an entry's own headers are 76 bytes plus twice its name), and each deflated entry
starts a compressor of its own (``bench/export.py``, 10,000 files of 12 bytes: 2.46 s of CPU
stored against 2.91 s deflated, an archive 2% larger; load 16-19 on 2 shared cores)."""


class IncludedFile(NamedTuple):
    """A file copied into the archive: workspace path and size in bytes (as copied)."""

    path: str
    size_bytes: int


class OmittedFile(NamedTuple):
    """A file left out: workspace path, size in bytes, and why: ``REASON_TOO_LARGE``,
    ``REASON_UNREADABLE``, or (size 0) the kind of a skipped entry (``symlink``, ``fifo``...) or an
    unaddressable name."""

    path: str
    size_bytes: int
    reason: str


@dataclass(frozen=True)
class ExportReport:
    """What ``export_scope`` wrote: the same facts as the archive's ``MANIFEST.json``, plus its location.

    Attributes:
        path: the archive.
        scope_key: the exported scope's key (``conversations/c1``).
        max_file_bytes: the per-file ceiling applied, in bytes (inclusive).
        included: files in the archive, sorted by path.
        omitted: files left out, sorted by path: every listed file that is not in the archive is here.
        archive_names: workspace path → entry name in the archive, for every included file.
        total_bytes: the sum of the included files' sizes, in bytes (uncompressed).
        archive_bytes: the size of the archive file, in bytes.
        exported_at: when the export started (UTC).
    """

    path: Path
    scope_key: str
    max_file_bytes: int
    included: list[IncludedFile]
    omitted: list[OmittedFile]
    archive_names: dict[str, str]
    total_bytes: int
    archive_bytes: int
    exported_at: datetime

    def manifest(self) -> dict[str, Any]:
        """The content of ``MANIFEST.json`` (JSON-ready; also a fitting export API response body)."""
        return {
            "manifest_version": MANIFEST_VERSION,
            "scope": self.scope_key,
            "exported_at": _iso(self.exported_at),
            "max_file_bytes": self.max_file_bytes,
            "ceiling_rule": (
                f"files of at most {self.max_file_bytes} bytes are included; larger files are omitted "
                "and listed here"
            ),
            "total_bytes": self.total_bytes,
            "included": [
                {
                    "path": item.path,
                    "archive_name": self.archive_names[item.path],
                    "size_bytes": item.size_bytes,
                }
                for item in self.included
            ],
            "omitted": [
                {
                    "path": item.path,
                    "size_bytes": item.size_bytes,
                    "reason": item.reason,
                    "detail": _REASON_TEXT.get(item.reason, item.reason),
                    "max_file_bytes": self.max_file_bytes,
                }
                for item in self.omitted
            ],
        }

    def manifest_text(self) -> str:
        """The content of ``MANIFEST.txt``: the manifest for a person opening the archive."""
        ceiling = self.max_file_bytes
        lines = [
            "alphaagent workspace export",
            f"scope: {self.scope_key}",
            f"exported at: {_iso(self.exported_at)}",
            f"per-file ceiling: {ceiling:,} bytes ({ceiling / MiB:g} MiB); a file of exactly this size is "
            "included, larger files are omitted and listed below",
            "",
            f"included: {count(len(self.included), 'file')}, {self.total_bytes:,} bytes",
            f"omitted: {count(len(self.omitted), 'file')}",
        ]
        for item in self.omitted:
            lines.append(
                f"  {printable_path(item.path)}  {item.size_bytes:,} bytes"
                f"  {_REASON_TEXT.get(item.reason, item.reason)}"
            )
        renamed = [(path, name) for path, name in self.archive_names.items() if path != name]
        if renamed:
            lines.append("renamed for safe extraction (workspace path -> archive name):")
            lines.extend(f"  {printable_path(path)} -> {name}" for path, name in sorted(renamed))
        return "\n".join(lines) + "\n"


def export_scope(
    workspace: Workspace, scope: Scope, out: Path, *, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
) -> ExportReport:
    """Write the scope's regular files to the zip archive ``out`` and report what was left out.

    See the module docstring for the rules (inclusive per-file ceiling, manifest, safe names, atomic
    replace of ``out``, streaming, ZIP64).

    Args:
        workspace: any ``Workspace``; only ``list_files`` and ``open_file`` are used.
        scope: the scope to export.
        out: where the archive goes; its folder must exist. Replaced atomically if it exists.
        max_file_bytes: per-file ceiling in bytes, inclusive (default 25 MiB, DESIGN §4.3).

    Returns:
        The ``ExportReport``: included and omitted files, archive names, sizes.

    Raises:
        ValueError: ``max_file_bytes`` is negative.
        OSError: the archive cannot be written, or a file fails while being copied (no archive is
            left behind, and an existing ``out`` is unchanged).
    """
    if max_file_bytes < 0:
        raise ValueError(f"max_file_bytes must not be negative, got {max_file_bytes}")
    out = Path(out)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w+b") as raw:
            report = _write_archive(raw, workspace, scope, out, max_file_bytes)
            raw.flush()
            os.fsync(raw.fileno())
            archive_bytes = os.fstat(raw.fileno()).st_size
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return dataclasses.replace(report, archive_bytes=archive_bytes)


def _write_archive(
    raw: IO[bytes], workspace: Workspace, scope: Scope, out: Path, max_file_bytes: int
) -> ExportReport:
    exported_at = utcnow()
    skipped: list[tuple[str, str]] = []
    # The sessions' live state is the platform's, not a file of the user's (DESIGN §4.7).
    listed = [
        info for info in workspace.list_files(scope, skipped=skipped) if not is_session_state(info.path)
    ]
    skipped = [(path, reason) for path, reason in skipped if not is_session_state(path)]
    files = sorted(listed, key=lambda item: item.path)
    names = assign_archive_names([info.path for info in files if info.size_bytes <= max_file_bytes])
    included: list[IncludedFile] = []
    omitted: list[OmittedFile] = []
    with zipfile.ZipFile(raw, "w", compression=zipfile.ZIP_DEFLATED, allowZip64=True) as archive:
        for info in files:
            if info.size_bytes > max_file_bytes:
                omitted.append(OmittedFile(info.path, info.size_bytes, REASON_TOO_LARGE))
                continue
            outcome = _copy_file(workspace, scope, info, archive, names[info.path], max_file_bytes)
            if isinstance(outcome, IncludedFile):
                included.append(outcome)
            else:
                omitted.append(outcome)
        # Never silently dropped: what could not be exported is named with the reason (PATH-01).
        omitted.extend(OmittedFile(path, 0, reason) for path, reason in skipped)
        omitted.sort(key=lambda item: item.path)
        report = ExportReport(
            path=out,
            scope_key=scope.key,
            max_file_bytes=max_file_bytes,
            included=included,
            omitted=omitted,
            archive_names={item.path: names[item.path] for item in included},
            total_bytes=sum(item.size_bytes for item in included),
            archive_bytes=0,  # known once the archive is closed; filled in by export_scope
            exported_at=exported_at,
        )
        # Compact (C-accelerated) JSON: a manifest may list many thousands of files; MANIFEST.txt is
        # the one for people.
        manifest = json.dumps(report.manifest(), ensure_ascii=False) + "\n"
        archive.writestr(_entry_info(MANIFEST_JSON, exported_at), manifest.encode("utf-8"))
        archive.writestr(_entry_info(MANIFEST_TXT, exported_at), report.manifest_text().encode("utf-8"))
    return report


def _copy_file(
    workspace: Workspace,
    scope: Scope,
    info: FileInfo,
    archive: zipfile.ZipFile,
    name: str,
    max_file_bytes: int,
) -> IncludedFile | OmittedFile:
    try:
        reader = workspace.open_file(scope, info.path)
    except (FileNotFoundError, PermissionError, PathRuleError):
        return OmittedFile(info.path, info.size_bytes, REASON_UNREADABLE)
    with reader:
        # The size when opened decides, and bounds the copy: a file growing meanwhile is cut there.
        size = _current_size(reader, info.size_bytes)
        if size > max_file_bytes:
            return OmittedFile(info.path, size, REASON_TOO_LARGE)
        entry_info = _entry_info(name, info.modified_at)
        entry_info.file_size = size  # lets zipfile choose ZIP64 headers up front if the entry needs them
        if size <= STORED_MAX_BYTES or os.path.splitext(name)[1].lower() in _STORED_SUFFIXES:
            entry_info.compress_type = zipfile.ZIP_STORED
        remaining = size
        with archive.open(entry_info, "w") as entry:
            while remaining > 0 and (chunk := reader.read(min(BLOCK_BYTES, remaining))):
                entry.write(chunk)
                remaining -= len(chunk)
    return IncludedFile(info.path, size - remaining)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _current_size(reader: BinaryIO | IO[bytes], listed: int) -> int:
    try:
        return os.fstat(reader.fileno()).st_size
    except (AttributeError, OSError, ValueError):
        return listed  # a reader without a descriptor (a remote stream): trust the listing


def _entry_info(name: str, modified_at: datetime) -> zipfile.ZipInfo:
    moment = modified_at.astimezone(UTC)
    # The zip format's DOS timestamps span 1980-2107; clamp rather than fail.
    if moment.year < 1980:
        date_time = (1980, 1, 1, 0, 0, 0)
    elif moment.year > 2107:
        date_time = (2107, 12, 31, 23, 59, 58)
    else:
        date_time = (moment.year, moment.month, moment.day, moment.hour, moment.minute, moment.second)
    entry = zipfile.ZipInfo(name, date_time=date_time)
    entry.external_attr = (stat.S_IFREG | 0o644) << 16
    entry.compress_type = zipfile.ZIP_DEFLATED
    return entry


def safe_archive_name(path: str) -> str:
    """Map a workspace path to a zip entry name that extracts safely on Windows, macOS and Linux.

    Segment by segment: empty segments (a leading, trailing or doubled '/') are dropped; each of
    ``< > : " | ? * \\`` and every control character becomes '_' (so a backslash never separates and a
    drive letter ``C:`` becomes ``C_``); trailing dots and spaces become '_' (so ``.`` and ``..`` become
    ``_`` and ``__``); a Windows device name (CON, PRN, AUX, NUL, COM0-9, LPT0-9, with or without an
    extension, any case) gets a '_' prefix. The result never starts with '/', never has a ``..``
    segment, and is the input unchanged when that was safe already. Distinctness is
    ``assign_archive_names``' job.

    Example::

        safe_archive_name("reports/con.txt")  # "reports/_con.txt"
        safe_archive_name("../x?.csv")        # "__/x_.csv"
    """
    segments = [_safe_segment(segment) for segment in path.split("/") if segment]
    return "/".join(segments) or "_"


@functools.lru_cache(maxsize=4096)  # folder names repeat on every path of a large export
def _safe_segment(segment: str) -> str:
    segment = _UNSAFE_CHARS.sub("_", segment)
    segment = _TRAILING_DOTS_SPACES.sub(lambda match: "_" * len(match.group()), segment)
    if segment.split(".", 1)[0].rstrip(" ").upper() in _RESERVED_NAMES:
        segment = "_" + segment
    return segment


def assign_archive_names(paths: list[str]) -> dict[str, str]:
    """Give each workspace path a distinct, safe entry name (``safe_archive_name``); return path → name.

    Names are compared case-insensitively (``str.casefold``), as a Windows or macOS extraction would,
    and a file never takes the name of a folder or the reverse (``MANIFEST.json`` and ``MANIFEST.txt``
    at the root are taken). Paths whose name needed no change are placed first, so they keep it; the
    others follow in sorted order, and a name already taken gets ``~2``, ``~3``, ... before its
    extension (``what_~2.csv``). A folder that collides with a file is renamed the same way; two folders
    that meet merge, since only their files need distinct names.
    """
    taken: dict[str, str] = {MANIFEST_JSON.casefold(): "file", MANIFEST_TXT.casefold(): "file"}
    folders: dict[str, str] = {"": ""}  # folder of a workspace path -> its folder in the archive
    names: dict[str, str] = {}

    next_counter: dict[str, int] = {}  # (parent/segment).casefold() -> the next counter to try

    def claim(parent: str, segment: str, kind: str) -> str:
        # Resume counting where the last collision on this name stopped: thousands of files that map
        # to one safe name must not cost a quadratic search.
        base = (f"{parent}/{segment}" if parent else segment).casefold()
        counter = next_counter.get(base, 1)
        while True:
            candidate_segment = segment if counter == 1 else _with_counter(segment, counter)
            candidate = f"{parent}/{candidate_segment}" if parent else candidate_segment
            holder = taken.get(candidate.casefold())
            if holder is None:
                taken[candidate.casefold()] = kind
                next_counter[base] = counter + 1
                return candidate
            if kind == "dir" and holder == "dir":
                return candidate
            counter += 1

    for path in sorted(set(paths), key=lambda item: (safe_archive_name(item) != item, item)):
        segments = [segment for segment in path.split("/") if segment] or [""]
        folder = ""
        for index, segment in enumerate(segments[:-1]):
            original = "/".join(segments[: index + 1])
            if original not in folders:
                folders[original] = claim(folders[folder], _safe_segment(segment), "dir")
            folder = original
        names[path] = claim(folders[folder], _safe_segment(segments[-1]) or "_", "file")
    return names


def _with_counter(segment: str, counter: int) -> str:
    dot = segment.rfind(".")
    if dot <= 0:
        return f"{segment}~{counter}"
    return f"{segment[:dot]}~{counter}{segment[dot:]}"
