"""matplotlib's font list, built once per supervisor process and interpreter rather than at every
zygote start.

A zygote gets a config dir of its own (``MPLCONFIGDIR``, in its fresh scratch root), so a preload
with matplotlib scanned every system font to build ``fontlist-v*.json`` at every start (~0.3-0.5
CPU-s of the builtin preload's ~2, ``bench/zygote_start.py``). The first zygote of an interpreter
builds it; the supervisor reads it when that zygote is ready -- before any run was handed to it,
so no user code has written it -- and every later zygote of the same interpreter starts with a copy
(``Sandbox._start_zygote``). matplotlib checks the version the file names and holds, and rebuilds a
list it does not accept; fonts installed while the process runs are seen by its next process.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

from alphaagent.sandbox.scratch import write_all

MAX_FONT_LIST_BYTES = 4 * 2**20
"""A font list larger than this is not kept (matplotlib's is ~100 KiB for a few hundred fonts)."""

_lists: dict[str, tuple[tuple[str, bytes], ...]] = {}
_lock = threading.Lock()


def _is_font_list(name: str) -> bool:
    return name.startswith("fontlist-") and name.endswith(".json") and "/" not in name


def seed(config_dir: Path, python: str) -> int:
    """Write the font lists kept for ``python`` into a new, empty ``config_dir``; how many."""
    with _lock:
        kept = _lists.get(python, ())
    for name, content in kept:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(config_dir / name, flags, 0o600)
        try:
            write_all(fd, content)
        finally:
            os.close(fd)
    return len(kept)


def remember(config_dir: Path, python: str) -> None:
    """Keep the font lists of ``config_dir`` for ``python`` (once: the first ready zygote's). Call it
    only before any run can have written there."""
    with _lock:
        if python in _lists:
            return
    found: list[tuple[str, bytes]] = []
    try:
        with os.scandir(config_dir) as entries:
            names = sorted(entry.name for entry in entries if _is_font_list(entry.name))
        for name in names:
            fd = os.open(config_dir / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_FONT_LIST_BYTES:
                    continue
                with os.fdopen(os.dup(fd), "rb") as fh:
                    content = fh.read(MAX_FONT_LIST_BYTES + 1)
            finally:
                os.close(fd)
            if len(content) <= MAX_FONT_LIST_BYTES:
                found.append((name, content))
    except OSError:
        return  # no list kept: the next zygote builds its own, as every zygote did
    if found:
        with _lock:
            _lists.setdefault(python, tuple(found))


def forget() -> None:
    """Drop every kept list (``bench/zygote_start.py`` measures a start without one)."""
    with _lock:
        _lists.clear()
