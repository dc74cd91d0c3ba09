"""A session's live state, inside the sandboxed child: restore the user namespace before a run, save
what it holds after (DESIGN §4.7). Stdlib only: the zygote loads this file by its path
(``zygote._sibling("state")``) under every environment's interpreter, and nothing of ``alphaagent``.

Serialiser: ``cloudpickle`` when the environment has it (the builtin environment does, locally and
in its image), so functions, lambdas and classes defined in the code travel by value; otherwise the
standard ``pickle``, where functions defined in the code are still kept (their code by ``marshal``)
but classes defined in the code, and their instances, are skipped with that reason. Either way
pickle protocol 5, with the large contiguous buffers of numpy, pandas and pyarrow objects out of
band.

Layout of ``work/sessions/{session_id}/`` (a scope's platform-owned folder)::

    manifest.json          which generation is current: the names, the pickle file, the buffers
    g{N}-{token}.pkl       the in-band pickle stream: one ``dump`` per name, one shared memo
    g{N}-{token}.bin       the buffers first written by generation N, each at a page boundary

Why it is cheap to keep a large state:

- **Restore maps, it does not read.** Each buffer of at least ``MAP_MIN_BYTES`` is its own private
  copy-on-write ``mmap`` of the ``.bin`` file; numpy and pandas rebuild their arrays on it without a
  copy, so restoring a 100 MB frame costs page-table set-up, and only the pages the code touches are
  ever read.
- **Save writes only what changed.** After the run every name is pickled again with its buffers out
  of band (the pickle copies no array data). A buffer that is still exactly a restored mapping, at
  the same address and length, no page of which was written since (``/proc/self/pagemap``: a
  written page of a private file mapping is anonymous; where pagemap is closed to the process, its
  CRC-32 against the one recorded at write time), is not written again: the new manifest points at
  the old file. Anything else, including an array changed in place, is written anew. Buffers under
  ``MAP_MIN_BYTES`` are copied in and rewritten (cheaper than tracking them). When nothing changed
  at all (same names, same in-band bytes, every buffer clean), nothing is written.
- **Nothing is overwritten in place.** New generations get new file names and ``manifest.json`` is
  replaced by ``rename``, so a run killed while it saves leaves the previous state whole (and a file
  still mapped by a running process never changes under it).

Example (what the child does)::

    restored = restore(main.__dict__, "work/sessions/S1")
    exec(code, main.__dict__)
    report = save(main.__dict__, "work/sessions/S1", restored, max_bytes=512 << 20, max_save_s=10)
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import io
import json
import marshal
import mmap
import os
import pickle
import secrets
import sys
import time
import types
import zlib
from typing import Any

MANIFEST = "manifest.json"
FORMAT = 1
PAGE = mmap.PAGESIZE
MAP_MIN_BYTES = 1 << 20
"""Buffers from 1 MiB are mapped and change-tracked; smaller ones are copied in and rewritten."""
MAX_REPORTED_NAMES = 100
"""Names listed per field of the report (the rest are counted): the result is read by a model."""
MAX_REASON_CHARS = 300
MAX_NAME_CHARS = 200
_MAX_PASSES = 8

_serializer: tuple[str, Any] | None = None
_restore_globals: dict[str, Any] | None = None


def serializer() -> tuple[str, Any]:
    """``("cloudpickle", module)`` if the environment has cloudpickle, else ``("pickle", pickle)``.
    Imported once (the zygote calls this before it forks, so runs do not pay the import)."""
    global _serializer
    if _serializer is None:
        try:
            import cloudpickle

            _serializer = ("cloudpickle", cloudpickle)
        except Exception:
            _serializer = ("pickle", pickle)
    return _serializer


# ------------------------------------------------------------------ reducers


def _main_function(code: bytes, name: str, defaults: Any, closure: Any, attrs: dict[str, Any]) -> Any:
    """Rebuild a function defined in the code, bound to the restored ``__main__`` globals (so it sees
    later assignments, as it did in the run that defined it)."""
    glob = _restore_globals if _restore_globals is not None else sys.modules["__main__"].__dict__
    # The user's own code, saved by an earlier run of the session, loaded in its sandboxed child.
    func = types.FunctionType(marshal.loads(code), glob, name, defaults, closure)  # noqa: S302
    for key, value in attrs.items():
        setattr(func, key, value)
    return func


def _reduce_main_function(func: types.FunctionType) -> tuple[Any, ...]:
    attrs = {
        "__qualname__": func.__qualname__,
        "__kwdefaults__": func.__kwdefaults__,
        "__doc__": func.__doc__,
        "__module__": func.__module__,
        "__annotations__": func.__annotations__,
        "__dict__": func.__dict__,
    }
    return (
        _main_function,
        (marshal.dumps(func.__code__), func.__name__, func.__defaults__, func.__closure__, attrs),
    )


def _pickler_class(main_globals: dict[str, Any]) -> type:
    name, module = serializer()
    base = module.Pickler if name == "cloudpickle" else pickle.Pickler
    by_value = name == "cloudpickle"

    class StatePickler(base):  # type: ignore[misc, valid-type]
        def reducer_override(self, obj: Any) -> Any:
            if type(obj) is types.FunctionType and obj.__globals__ is main_globals:
                return _reduce_main_function(obj)
            if (
                isinstance(obj, types.ModuleType)
                and obj.__name__ != "__main__"
                and sys.modules.get(obj.__name__) is obj
            ):
                return (__import__("importlib").import_module, (obj.__name__,))
            if not by_value:
                kind = obj if isinstance(obj, type) else type(obj)
                if getattr(kind, "__module__", None) == "__main__":
                    raise pickle.PicklingError(
                        "a class defined in the code (or its instance) is kept only where the"
                        " environment has cloudpickle"
                    )
            if by_value:
                return super().reducer_override(obj)
            return NotImplemented

    return StatePickler


# ------------------------------------------------------------------ buffers and addresses


class _PyBuffer(ctypes.Structure):
    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.py_object),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


def _address(view: memoryview) -> int:
    """The address of a contiguous buffer's first byte (read-only ones included)."""
    buf = _PyBuffer()
    get = ctypes.pythonapi.PyObject_GetBuffer
    get.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
    if get(view, ctypes.byref(buf), 0) != 0:
        raise BufferError("no buffer")
    try:
        return int(buf.buf or 0)
    finally:
        release = ctypes.pythonapi.PyBuffer_Release
        release.argtypes = [ctypes.POINTER(_PyBuffer)]
        release(ctypes.byref(buf))


_PM_PRESENT, _PM_SWAPPED, _PM_FILE = 0x80, 0x40, 0x20
"""Bits 63, 62 and 61 of a ``/proc/self/pagemap`` entry, in its most significant byte."""
_PAGE_WRITTEN = bytes(
    1 if (b & _PM_SWAPPED) or ((b & _PM_PRESENT) and not (b & _PM_FILE)) else 0 for b in range(256)
)


_pagemap_fd: int | None = None
"""This process's ``/proc/self/pagemap``, once ``open_pagemap`` opened it."""


def open_pagemap(set_dumpable: Any = None) -> bool:
    """Open ``/proc/self/pagemap`` for the change tracking of ``save``; True if it is open.

    A process that is not dumpable has its ``/proc/self`` files owned by root, so a non-root one
    (Lambda's sandbox user) cannot open its own pagemap. ``set_dumpable(bool)``, when given, lets it
    be dumpable for the one ``open`` (the descriptor stays usable after): the caller passes it only
    where no other process could reach this one in that moment (a run alone with its uid, or in its
    own pid namespace), and before any user code runs. The entries' page frame numbers are hidden
    from a process without ``CAP_SYS_ADMIN`` at open time; only the flag bits are read here.
    """
    global _pagemap_fd
    if _pagemap_fd is not None:
        return True
    if os.environ.get("ALPHAAGENT_STATE_NO_PAGEMAP") == "1":
        return False  # the bench measures the CRC-32 fallback this way
    try:
        _pagemap_fd = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
        return True
    except OSError:
        if set_dumpable is None:
            return False
    try:
        set_dumpable(True)
        try:
            _pagemap_fd = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
        finally:
            set_dumpable(False)
    except Exception:
        return False
    return True


def _clean_keys(restored: Restored) -> set[tuple[int, int]]:
    """(address, length) of the restored mapped buffers no page of which was written since restore.

    A write to a private file mapping replaces the page by an anonymous copy: in
    ``/proc/self/pagemap`` the page is then present (or swapped) without the file-page bit. Reading
    the entries of a 100 MB buffer is 200 KB. Where pagemap cannot be opened (a non-root process
    that is not dumpable, as on Lambda) the buffer's CRC-32 is compared with the one recorded when
    it was written (~0.4 ms per MB): slower, equally exact for what pickle would write.
    """
    clean: set[tuple[int, int]] = set()
    if not restored.maps:
        return clean
    pagemap = _pagemap_fd if open_pagemap() else None
    for address, _file, _offset, length, crc, view in restored.maps.values():
        if pagemap is not None:
            first, last = address // PAGE, (address + length - 1) // PAGE
            try:
                entries = os.pread(pagemap, (last - first + 1) * 8, first * 8)
            except OSError:
                continue  # counted as written: rewritten, never lost
            if len(entries) == (last - first + 1) * 8 and 1 not in entries[7::8].translate(_PAGE_WRITTEN):
                clean.add((address, length))
        elif crc is not None and zlib.crc32(view) == crc:
            clean.add((address, length))
    return clean


# ------------------------------------------------------------------ restore


class Restored:
    """What ``restore`` brought back: the names, and per mapped buffer where it lives, so ``save``
    can tell an unchanged buffer from a changed one."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.skipped: dict[str, str] = {}
        self.ms = 0
        self.maps: dict[int, tuple[int, str, int, int, int | None, memoryview]] = {}
        """mapping start address -> (buffer address, file, offset, length, CRC-32, the buffer)"""
        self.generation = 0
        self.files: set[str] = set()
        self.pickle: bytes | None = None
        self.buffer_keys: list[tuple[int, int]] = []
        """(address, length) of every restored buffer, in order"""
        self.clean: set[tuple[int, int]] | None = None
        """the mapped buffers found unwritten at save time (computed once)"""
        self.small: dict[int, bytes] = {}
        """the restored content of each buffer too small to be mapped, by position"""
        self.bytes = 0
        self._keep: list[Any] = []


def _safe_name(name: str) -> bool:
    return bool(name) and "/" not in name and not name.startswith(".") and len(name) <= 100


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_state_dir(root: str, relative: str, *, create: bool) -> int | None:
    """Open the state folder ``relative`` (``work/sessions/{id}``) below the scope root ``root`` and
    return its descriptor; None when it does not exist (and ``create`` is false).

    Each component is opened relative to its parent with ``O_NOFOLLOW``: the run writes its scope,
    so it may have made ``work``, ``work/sessions`` or the session's folder a symlink (to another
    scope, to a home folder) before the platform made them. A link anywhere on the way raises
    ``OSError`` (``ELOOP``/``ENOTDIR``) instead of reading or writing state elsewhere; with
    ``create`` missing folders are made (mode 0700).
    """
    parts = [part for part in relative.split("/") if part]
    if not parts or any(part in (".", "..") for part in parts):
        raise ValueError(f"state folder {relative!r}: must be a relative path without . or ..")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for depth, part in enumerate(parts, 1):
            try:
                try:
                    below = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        os.close(fd)
                        return None
                    with contextlib.suppress(FileExistsError):  # made meanwhile: opened or refused below
                        os.mkdir(part, 0o700, dir_fd=fd)
                    below = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as error:
                if error.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                raise OSError(
                    error.errno,
                    f"{'/'.join(parts[:depth])} is a symlink or not a folder: a session's state is"
                    " never read or written through one",
                ) from None
            os.close(fd)
            fd = below
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_in(directory: int, name: str) -> int:
    """Open the file ``name`` of the state folder ``directory`` for reading, never through a link."""
    return os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)


def read_manifest(directory: int) -> dict[str, Any] | None:
    """The current manifest of the state folder ``directory`` (a descriptor, ``open_state_dir``),
    or None when there is none (or it is unreadable, or a link)."""
    try:
        with os.fdopen(_open_in(directory, MANIFEST), "rb") as fh:
            manifest = json.loads(fh.read(1 << 22))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return None
    return manifest


def restore(namespace: dict[str, Any], directory: int) -> Restored:
    """Load the state saved in the state folder ``directory`` (a descriptor, ``open_state_dir``)
    into ``namespace`` (the run's ``__main__`` globals).

    A name that cannot be loaded (a module the environment lacks, a class that changed) is left out
    and reported in ``skipped``; a missing or unreadable state restores nothing. Never raises for
    what is in the state files: they are the user's own, written by earlier runs of the session.
    """
    global _restore_globals
    started = time.perf_counter()
    restored = Restored()
    manifest = read_manifest(directory)
    if manifest is None:
        return restored
    restored.generation = int(manifest.get("generation", 0))
    try:
        name_kind, _ = serializer()
        if manifest.get("serializer") == "cloudpickle" and name_kind != "cloudpickle":
            restored.skipped["*"] = "the state was saved with cloudpickle, which this environment lacks"
            return restored
        if not _safe_name(str(manifest.get("pickle", ""))):
            restored.skipped["*"] = "the state's manifest names its pickle outside the session's folder"
            return restored
        buffers = _map_buffers(directory, manifest, restored)
        with os.fdopen(_open_in(directory, str(manifest["pickle"])), "rb") as fh:
            restored.pickle = fh.read()
        stream = io.BytesIO(restored.pickle)
        restored.bytes = int(manifest.get("bytes", 0))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        restored.skipped["*"] = _reason(f"the saved state could not be read: {exc}")
        return restored
    restored.files = {str(manifest["pickle"]), *(str(b["file"]) for b in manifest.get("buffers", []))}
    # The user's own objects, saved by an earlier run of the session, loaded in its sandboxed child:
    # nothing it could do here is more than the code of the run itself may do.
    unpickler = pickle.Unpickler(stream, buffers=iter(buffers))  # noqa: S301
    _restore_globals = namespace
    try:
        for entry in manifest.get("names", []):
            name = str(entry["name"])
            try:
                stream.seek(int(entry["start"]))
                obj = unpickler.load()
            except BaseException as exc:  # a user object's __setstate__ may raise anything
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                restored.skipped[name] = _reason(f"not restored: {type(exc).__name__}: {exc}")
                continue
            namespace[name] = obj
            restored.names.append(name)
    finally:
        _restore_globals = None
    restored.ms = round((time.perf_counter() - started) * 1000)
    return restored


def _map_buffers(directory: int, manifest: dict[str, Any], restored: Restored) -> list[Any]:
    buffers: list[Any] = []
    fds: dict[str, int] = {}
    try:
        for ref in manifest.get("buffers", []):
            file, offset, length = str(ref["file"]), int(ref["offset"]), int(ref["length"])
            crc = int(ref["crc"]) if isinstance(ref.get("crc"), int) else None
            if not _safe_name(file) or offset < 0 or length < 0:
                raise ValueError(f"bad buffer reference {ref!r}")
            if file not in fds:
                fds[file] = _open_in(directory, file)
            fd = fds[file]
            if length < MAP_MIN_BYTES:
                data = bytearray(length)
                got = os.preadv(fd, [data], offset) if length else 0
                if got != length:
                    raise ValueError(f"{file} is shorter than its manifest says")
                buffers.append(data)
                restored.buffer_keys.append((_address(memoryview(data)), length))
                restored.small[len(restored.buffer_keys) - 1] = bytes(data)
                continue
            aligned = offset - offset % PAGE
            mapping = mmap.mmap(fd, length + offset - aligned, access=mmap.ACCESS_COPY, offset=aligned)
            view = memoryview(mapping)[offset - aligned :]
            start = _address(memoryview(mapping))
            restored.maps[start] = (_address(view), file, offset, length, crc, view)
            restored._keep.append(mapping)
            restored.buffer_keys.append((_address(view), length))
            buffers.append(view)
    finally:
        for fd in fds.values():
            os.close(fd)
    return buffers


# ------------------------------------------------------------------ save


def _reason(text: str) -> str:
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


def candidates(namespace: dict[str, Any]) -> list[str]:
    """The names a run's state holds: every global but the dunder ones (``__name__``, ``__builtins__``)."""
    return [n for n in namespace if isinstance(n, str) and not (n.startswith("__") and n.endswith("__"))]


class _Pass:
    def __init__(self) -> None:
        self.stream = io.BytesIO()
        self.buffers: list[pickle.PickleBuffer] = []
        self.entries: list[dict[str, Any]] = []
        self.failed: tuple[str, BaseException] | None = None


def _pickle_pass(namespace: dict[str, Any], names: list[str]) -> _Pass:
    result = _Pass()
    pickler = _pickler_class(namespace)(result.stream, protocol=5, buffer_callback=result.buffers.append)
    for name in names:
        start, first = result.stream.tell(), len(result.buffers)
        try:
            pickler.dump(namespace[name])
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            result.failed = (name, exc)
            return result
        end = result.stream.tell()
        size = end - start + sum(b.raw().nbytes for b in result.buffers[first:])
        result.entries.append(
            {"name": name, "start": start, "buffers": [first, len(result.buffers)], "bytes": size}
        )
    return result


def _trial(namespace: dict[str, Any], name: str) -> BaseException | None:
    sink = io.BytesIO()
    try:
        _pickler_class(namespace)(sink, protocol=5, buffer_callback=lambda b: None).dump(namespace[name])
    except BaseException as exc:
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return exc
    return None


def _why(exc: BaseException, value: object = None) -> str:
    text = f"{type(exc).__name__}: {exc}"
    kind = _kind_of(value)
    if kind:
        return _reason(f"{kind} ({text}); {_RECREATE}")
    return _reason(f"cannot be serialised ({text})")


_RECREATE = "recreate it in the next run"


def _kind_of(value: object) -> str:
    """What an object that does not pickle is, in the README's words ("Not kept"); "" when it is
    none of the kinds named there. In-memory ``io.StringIO``/``io.BytesIO`` pickle, and cloudpickle
    keeps a text file open for reading as an ``io.StringIO`` of its contents: only the rest of the
    files and streams reach here."""
    import threading  # the zygote has it loaded already; here so a stdlib-only import stays small

    if isinstance(value, io.IOBase):
        return "an open file or stream"
    if isinstance(value, types.GeneratorType | types.CoroutineType | types.AsyncGeneratorType):
        return "a generator (its position cannot be saved)"
    if isinstance(value, threading.Thread):
        return "a thread"
    locks = (type(threading.Lock()), type(threading.RLock()), threading.Condition, threading.Event)
    if isinstance(value, locks):
        return "a lock or event"
    module = type(value).__module__
    if module in ("socket", "ssl"):
        return "a socket"
    if module == "sqlite3":
        return "a database connection"
    return ""


def save(
    namespace: dict[str, Any],
    directory: int,
    restored: Restored | None,
    *,
    max_bytes: int,
    max_save_s: float,
) -> dict[str, Any]:
    """Save ``namespace`` as the session's new state in the state folder ``directory`` (a
    descriptor, ``open_state_dir``: every file is created, replaced and removed relative to it,
    none through a link); return the report fields
    ``saved``, ``skipped`` (name -> reason), ``bytes`` (the whole state's size) and ``save_ms``.

    Objects that cannot be serialised are skipped by name with the reason. Past ``max_bytes`` (the
    environment's ``state_mb``) or ``max_save_s``, the largest objects are dropped, with that reason,
    until the rest fits. Raises ``OSError`` only when the state directory cannot be written (the
    previous state is then left as it was).
    """
    started = time.perf_counter()
    skipped: dict[str, str] = {}
    names = candidates(namespace)
    work = _pickle_pass(namespace, names)
    if work.failed is not None:
        # One bad object: find every bad one on its own (no data is copied), then pickle the rest.
        for name in names:
            exc = _trial(namespace, name)
            if exc is not None:
                skipped[name] = _why(exc, namespace[name])
        names = [n for n in names if n not in skipped]
        work = _pickle_pass(namespace, names)
    passes = 0
    while work.failed is not None:
        # Fails only together with another object (a shared one): drop it too, a bounded number of times.
        name, exc = work.failed
        skipped[name] = _why(exc, namespace[name])
        names = [n for n in names if n != name]
        passes += 1
        if passes > _MAX_PASSES:
            skipped.update({n: "not saved: the namespace could not be pickled consistently" for n in names})
            names = []
        work = _pickle_pass(namespace, names)
    total = sum(e["bytes"] for e in work.entries)
    if total > max_bytes:
        by_size = sorted(work.entries, key=lambda e: e["bytes"], reverse=True)
        for entry in by_size:
            if total <= max_bytes:
                break
            total -= entry["bytes"]
            skipped[entry["name"]] = _reason(
                f"dropped: the state would be {_mib(sum(e['bytes'] for e in work.entries))}, over its cap"
                f" of {_mib(max_bytes)} (the environment's state_mb); the largest objects go first"
            )
        names = [n for n in names if n not in skipped]
        work = _pickle_pass(namespace, names)
    deadline = started + max_save_s
    generation = (restored.generation if restored else 0) + 1
    token = secrets.token_hex(4)
    if restored is not None and _unchanged(work, restored):
        return _report(work, skipped, restored.bytes, started, written=0)
    if not work.entries and (restored is None or read_manifest(directory) is None):
        return _report(work, skipped, 0, started, written=0)  # nothing to keep, nothing kept before
    written, known = _write_buffers(directory, generation, token, work, restored, deadline)
    refs, missing = _refs(work, known)
    passes = 0
    while missing:
        # The save time cap stopped the writes: what is not written is dropped (the largest objects,
        # written last), and the rest is pickled again without it.
        for name in missing:
            skipped[name] = _reason(
                f"dropped: saving took longer than the save time cap of {max_save_s:g} s;"
                " the largest objects go first"
            )
        names = [n for n in names if n not in skipped]
        passes += 1
        if passes > _MAX_PASSES:
            skipped.update({n: "dropped: the save time cap was reached" for n in names})
            names = []
        work = _pickle_pass(namespace, names)
        refs, missing = _refs(work, known)
    pickle_file = f"g{generation}-{token}.pkl"
    _write_file(directory, pickle_file, work.stream.getbuffer())
    manifest = {
        "format": FORMAT,
        "generation": generation,
        "serializer": serializer()[0],
        "python": sys.version.split()[0],
        "pickle": pickle_file,
        "names": [{"name": e["name"], "start": e["start"], "bytes": e["bytes"]} for e in work.entries],
        "buffers": refs,
        "bytes": sum(e["bytes"] for e in work.entries),
    }
    tmp = f".{MANIFEST}.{token}"
    _write_file(directory, tmp, json.dumps(manifest).encode())
    os.replace(tmp, MANIFEST, src_dir_fd=directory, dst_dir_fd=directory)  # a link named so is replaced
    keep = {MANIFEST, pickle_file, *(r["file"] for r in refs)}
    _remove_others(directory, keep)
    return _report(work, skipped, int(manifest["bytes"]), started, written=written)


def _unchanged(work: _Pass, restored: Restored) -> bool:
    """Whether ``work`` would save exactly the restored state: the same names, the same in-band
    stream, and every buffer still the clean restored mapping it came from (nothing to write)."""
    if restored.pickle is None or work.stream.getbuffer() != restored.pickle:
        return False
    if [e["name"] for e in work.entries] != restored.names or restored.skipped:
        return False
    if len(work.buffers) != len(restored.buffer_keys):
        return False
    restored.clean = _clean_keys(restored)
    for i, buffer in enumerate(work.buffers):
        if i in restored.small:
            if buffer.raw() != restored.small[i]:
                return False
        elif _key(buffer) != restored.buffer_keys[i] or restored.buffer_keys[i] not in restored.clean:
            return False
    return True


def _report(
    work: _Pass, skipped: dict[str, str], size: int, started: float, *, written: int
) -> dict[str, Any]:
    return {
        "saved": [e["name"] for e in work.entries],
        "skipped": skipped,
        "bytes": size,
        "save_ms": round((time.perf_counter() - started) * 1000),
        "written_bytes": written,
    }


def _key(buffer: pickle.PickleBuffer) -> tuple[int, int]:
    raw = buffer.raw()
    return (_address(raw), raw.nbytes)


def _refs(work: _Pass, known: dict[tuple[int, int], dict[str, Any]]) -> tuple[list[Any], list[str]]:
    """One reference per buffer of ``work`` (from ``known``: written or reused, by address and
    length), and the names owning a buffer that has none."""
    refs: list[Any] = [known.get(_key(b)) for b in work.buffers]
    missing = [e["name"] for e in work.entries if any(refs[i] is None for i in range(*e["buffers"]))]
    return refs, missing


def _write_buffers(
    directory: int,
    generation: int,
    token: str,
    work: _Pass,
    restored: Restored | None,
    deadline: float,
) -> tuple[int, dict[tuple[int, int], dict[str, Any]]]:
    """Write the buffers that changed; reuse the references of those that did not. Returns (bytes
    written, a reference per buffer by (address, length)); past ``deadline`` nothing more is written."""
    known: dict[tuple[int, int], dict[str, Any]] = {}
    if restored is not None and restored.maps:
        clean = restored.clean if restored.clean is not None else _clean_keys(restored)
        for address, file, offset, length, crc, _view in restored.maps.values():
            if (address, length) in clean:
                known[(address, length)] = {"file": file, "offset": offset, "length": length, "crc": crc}
    owner_size = [0] * len(work.buffers)
    for entry in work.entries:
        for i in range(*entry["buffers"]):
            owner_size[i] = entry["bytes"]
    pending: list[tuple[int, tuple[int, int], memoryview]] = []
    for i, buffer in enumerate(work.buffers):
        raw = buffer.raw()
        key = (_address(raw), raw.nbytes)
        if key in known and raw.nbytes >= MAP_MIN_BYTES:
            continue
        pending.append((i, key, raw))
    if not pending:
        return 0, known
    data_file = f"g{generation}-{token}.bin"
    # Smallest owners first, so a save cut by its time cap drops the largest objects.
    pending.sort(key=lambda item: owner_size[item[0]])
    written, offset = 0, 0
    fd = os.open(
        data_file,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
        dir_fd=directory,
    )
    try:
        for _, key, raw in pending:
            if key in known:
                continue  # the same memory twice (two views of one array): written once
            if time.perf_counter() > deadline:
                break
            done = 0
            while done < raw.nbytes:
                done += os.pwrite(fd, raw[done:], offset + done)
            crc = zlib.crc32(raw) if raw.nbytes >= MAP_MIN_BYTES else None
            known[key] = {"file": data_file, "offset": offset, "length": raw.nbytes, "crc": crc}
            written += raw.nbytes
            offset += -(-raw.nbytes // PAGE) * PAGE
    finally:
        os.close(fd)
    return written, known


def _write_file(directory: int, name: str, data: Any) -> None:
    # O_EXCL: every name written is new (a random token), so a file or link already there is the
    # run's, and is refused rather than written through.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, 0o600, dir_fd=directory)
    try:
        view = memoryview(data).cast("B")
        done = 0
        while done < view.nbytes:
            done += os.write(fd, view[done:])
    finally:
        os.close(fd)


def _remove_others(directory: int, keep: set[str]) -> None:
    """Remove what the new manifest does not name: earlier generations, and leftovers of a killed
    save. A file another process still maps stays readable to it until it unmaps it."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if name not in keep:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=directory)  # a link is removed, never followed


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def cap_names(names: list[str]) -> list[str]:
    """At most ``MAX_REPORTED_NAMES`` names, each at most ``MAX_NAME_CHARS`` characters."""
    return [n[:MAX_NAME_CHARS] for n in names[:MAX_REPORTED_NAMES]]
