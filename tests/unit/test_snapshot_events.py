"""The run's changes found from inotify's events at the ``namespaces`` level (``TreeState.update``
with ``trust_events``): every kind of write is reported without an lstat of every entry, and every
case events cannot vouch for (an overflowed queue, a new hard link, a watch that failed, the process
level) falls back to the walk, which still reports everything."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandboxes import light

from alphaagent.sandbox.snapshot import FileChanges, HashCache
from alphaagent.sandbox.supervisor import Sandbox
from alphaagent.sandbox.treestate import RACY_NS, TreeState, TreeStates

EXCLUDE = ("work/runs", "work/sessions")


def _past_racy() -> None:
    time.sleep(RACY_NS / 1e9 * 2)


def _scope(root: Path, dirs: int = 4, files: int = 25) -> None:
    for d in range(dirs):
        (root / f"d{d}").mkdir()
        for f in range(files):
            (root / f"d{d}/f{f:02d}.csv").write_bytes(b"a,b\n1,2\n")
    (root / "work/runs").mkdir(parents=True)
    (root / "work/sessions").mkdir(parents=True)


def _tree(sandbox: Sandbox, root: Path) -> TreeState:
    # The sandbox's kept states, read only: which way the last update found the run's changes.
    states = [state for state in sandbox._trees if state.root == os.path.abspath(root)]
    assert len(states) == 1, states
    return states[0]


@pytest.fixture(scope="module")
def namespaced() -> Iterator[Sandbox]:
    sandbox = Sandbox(light())
    sandbox.start()
    try:
        if sandbox.isolation != "namespaces":
            pytest.skip(f"namespaces not available here (isolation {sandbox.isolation})")
        yield sandbox
    finally:
        sandbox.close()


WRITES = {
    "write": ("open('d0/f00.csv', 'a').write('3,4\\n')", (), ("d0/f00.csv",), ()),
    # A write through a shared mapping queues no IN_MODIFY; the mapping is still alive when the run
    # reports (the module keeps it), so only the open for writing names the file.
    "shared mapping": (
        "import mmap, os\n"
        "fd = os.open('d0/f01.csv', os.O_RDWR)\n"
        "kept = mmap.mmap(fd, 0)\n"
        "os.close(fd)\n"
        "kept[0:1] = b'z'\n",
        (),
        ("d0/f01.csv",),
        (),
    ),
    "truncate(path)": ("import os; os.truncate('d0/f02.csv', 2)", (), ("d0/f02.csv",), ()),
    "fallocate": (
        "import os\nfd = os.open('d1/f00.csv', os.O_RDWR)\nos.posix_fallocate(fd, 0, 65536)\nos.close(fd)",
        (),
        ("d1/f00.csv",),
        (),
    ),
    "copy_file_range": (
        "import os\n"
        "src, dst = os.open('d1/f01.csv', os.O_RDONLY), os.open('d1/f02.csv', os.O_WRONLY)\n"
        "os.copy_file_range(src, dst, 4, 4, 0)\n",
        (),
        ("d1/f02.csv",),
        (),
    ),
    "utime": ("import os; os.utime('d1/f03.csv', ns=(10**9, 10**9))", (), ("d1/f03.csv",), ()),
    "chmod": ("import os; os.chmod('d1/f04.csv', 0o600)", (), ("d1/f04.csv",), ()),
    "rename over": (
        "import os; open('d2/new.tmp', 'w').write('x,y\\n'); os.rename('d2/new.tmp', 'd2/f00.csv')",
        (),
        ("d2/f00.csv",),
        (),
    ),
    "mkdir and write in it": (
        "import os; os.makedirs('d2/sub/deeper'); open('d2/sub/deeper/r.md', 'w').write('#')",
        ("d2/sub/deeper/r.md",),
        (),
        (),
    ),
    "write via /proc/self/fd": (
        "import os\n"
        "fd = os.open('d3/f00.csv', os.O_RDONLY)\n"
        "again = os.open(f'/proc/self/fd/{fd}', os.O_WRONLY | os.O_APPEND)\n"
        "os.write(again, b'5,6\\n')\n",
        (),
        ("d3/f00.csv",),
        (),
    ),
    "delete and move": (
        "import os; os.unlink('d3/f01.csv'); os.rename('d3/f02.csv', 'd0/moved.csv')",
        ("d0/moved.csv",),
        (),
        ("d3/f01.csv", "d3/f02.csv"),
    ),
}


@pytest.mark.parametrize("kind", list(WRITES))
def test_each_kind_of_write_is_found_from_events_at_the_namespaces_level(
    namespaced: Sandbox, tmp_path: Path, kind: str
) -> None:
    # Given a scope the sandbox has run in (its state kept, the excluded directories watched)
    code, created, modified, deleted = WRITES[kind]
    _scope(tmp_path)
    assert namespaced.run("print(1)", cwd=tmp_path).status == "ok"
    _past_racy()
    assert namespaced.run("print(1)", cwd=tmp_path).files.created == []
    assert _tree(namespaced, tmp_path).found_by == "events"
    _past_racy()

    # When a run writes to the scope in this way
    result = namespaced.run(code, cwd=tmp_path)

    # Then the result names exactly what it changed, found from the events, without an lstat of
    # every entry
    assert result.status == "ok", result.stderr
    files = result.files
    assert (tuple(files.created), tuple(files.modified), tuple(files.deleted)) == (created, modified, deleted)
    tree = _tree(namespaced, tmp_path)
    assert (tree.found_by, tree.fallback) == ("events", "")


def test_a_hard_link_made_by_a_run_falls_back_to_the_walk_and_is_then_always_looked_at(
    namespaced: Sandbox, tmp_path: Path
) -> None:
    # Given a scope the sandbox has run in
    _scope(tmp_path)
    namespaced.run("print(1)", cwd=tmp_path)
    _past_racy()
    namespaced.run("print(1)", cwd=tmp_path)
    _past_racy()

    # When a run gives a file a second name in an excluded directory (no watched directory hears of
    # writes through it) and writes through it
    result = namespaced.run(
        "import os; os.link('d0/f00.csv', 'work/runs/other'); open('work/runs/other', 'a').write('9')",
        cwd=tmp_path,
    )

    # Then that run walks, and reports the file written
    tree = _tree(namespaced, tmp_path)
    assert result.files.modified == ["d0/f00.csv"], result.stderr
    assert tree.found_by == "walk"
    assert tree.fallback.startswith("a new hard link"), tree.fallback

    # And a later run writing through that other name alone is found from events (the file has
    # two names: it is lstat'ed by every update)
    _past_racy()
    result = namespaced.run("open('work/runs/other', 'a').write('8')", cwd=tmp_path)
    assert result.files.modified == ["d0/f00.csv"], result.stderr
    assert _tree(namespaced, tmp_path).found_by == "events"


def test_the_process_level_walks_every_run(tmp_path: Path) -> None:
    # Given a sandbox at the process level (a run could link the scope's files from anywhere else
    # it can write on that filesystem)
    _scope(tmp_path)
    with Sandbox(light(isolation="process")) as sandbox:
        sandbox.run("print(1)", cwd=tmp_path)
        _past_racy()

        # When a run writes a file
        result = sandbox.run("open('d1/f00.csv', 'a').write('x')", cwd=tmp_path)

        # Then it is reported, by a walk of every entry
        assert result.files.modified == ["d1/f00.csv"], result.stderr
        assert _tree(sandbox, tmp_path).found_by == "walk"


def _trusted_state(root: Path) -> tuple[TreeStates, TreeState, HashCache]:
    states = TreeStates()
    state = states.checkout(root, exclude=EXCLUDE)
    cache = HashCache()
    state.prepare()
    _past_racy()
    state.update(report=True, trust_events=True, hash_cache=cache)
    state.prepare()
    state.settle()
    return states, state, cache


def _names(changes: FileChanges) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    return changes.created, changes.modified, changes.deleted


def test_an_overflowed_queue_falls_back_to_the_walk(tmp_path: Path) -> None:
    # Given a kept state that trusts events
    _scope(tmp_path)
    states, state, cache = _trusted_state(tmp_path)

    # When more events than the kernel queues happen before the update (opens of two files in turn:
    # inotify merges an event identical to the one before it), besides a write
    queued = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    for index in range(queued + 10):
        os.close(os.open(tmp_path / f"d0/f0{index % 2}.csv", os.O_RDONLY))
    (tmp_path / "d3/f24.csv").write_bytes(b"changed, longer\n")
    changes = state.update(report=True, trust_events=True, hash_cache=cache)

    # Then the update walks, and reports the write
    assert (state.found_by, state.fallback) == ("walk", "inotify queue overflowed")
    assert _names(changes) == ((), ("d3/f24.csv",), ())
    states.close()


def test_a_watch_that_could_not_be_added_falls_back_to_the_walk(tmp_path: Path) -> None:
    # Given a kept state whose inotify instance could not watch one directory (ENOSPC on
    # max_user_watches, forced here)
    _scope(tmp_path)
    states, state, cache = _trusted_state(tmp_path)
    assert state._watcher is not None
    state._watcher.complete = False

    # When a file is written and the state updated
    (tmp_path / "d2/f03.csv").write_bytes(b"longer content\n")
    changes = state.update(report=True, trust_events=True, hash_cache=cache)

    # Then it walks and reports the write
    assert (state.found_by, state.fallback) == ("walk", "a watch could not be added")
    assert _names(changes) == ((), ("d2/f03.csv",), ())
    states.close()


def test_a_rising_link_count_falls_back_to_the_walk(tmp_path: Path) -> None:
    # Given a kept state that trusts events, with a file that already has two names in the tree
    _scope(tmp_path)
    os.link(tmp_path / "d0/f00.csv", tmp_path / "d1/second.csv")
    states, state, cache = _trusted_state(tmp_path)

    # When a third name is made for it in an excluded directory (no watched directory hears of it)
    os.link(tmp_path / "d0/f00.csv", tmp_path / "work/sessions/third")
    changes = state.update(report=True, trust_events=True, hash_cache=cache)

    # Then the update walks (the file's link count rose), and a write through the third name is
    # then found from events
    assert (state.found_by, state.fallback) == ("walk", "a new hard link")
    assert "d0/f00.csv" in changes.modified and "d1/second.csv" in changes.modified
    state.prepare()
    state.settle()
    with open(tmp_path / "work/sessions/third", "ab") as third:
        third.write(b"7,8\n")
    changes = state.update(report=True, trust_events=True, hash_cache=cache)
    assert state.found_by == "events"
    assert _names(changes) == ((), ("d0/f00.csv", "d1/second.csv"), ())
    states.close()


def test_a_new_directory_below_an_excluded_prefix_is_watched_for_links(tmp_path: Path) -> None:
    # Given a kept state that trusts events
    _scope(tmp_path)
    states, state, cache = _trusted_state(tmp_path)

    # When a new directory appears below an excluded prefix (a session's state), holding only files
    # of its own
    (tmp_path / "work/sessions/s1").mkdir()
    (tmp_path / "work/sessions/s1/state.pkl").write_bytes(b"s")
    changes = state.update(report=True, trust_events=True, hash_cache=cache)

    # Then events still suffice (the new directory is watched from now on) and nothing is reported
    assert (state.found_by, state.fallback, _names(changes)) == ("events", "", ((), (), ()))

    # And a hard link made in it later to a file of the tree falls back to the walk
    state.prepare()
    state.settle()
    os.link(tmp_path / "d2/f00.csv", tmp_path / "work/sessions/s1/linked")
    changes = state.update(report=True, trust_events=True, hash_cache=cache)
    assert state.found_by == "walk", state.fallback
    assert changes.modified == ("d2/f00.csv",)
    states.close()


def test_a_state_whose_inotify_instance_was_released_watches_every_directory_again(tmp_path: Path) -> None:
    # Given a kept state whose inotify instance was released (dropped by a TreeStates), then used
    # again: the first update walks
    _scope(tmp_path)
    states, state, cache = _trusted_state(tmp_path)
    state.close()
    state.update(report=False, trust_events=True)
    assert state.found_by == "walk"
    state.prepare()
    state.settle()

    # When a file is written in a directory that did not change meanwhile
    (tmp_path / "d1/f07.csv").write_bytes(b"a longer line\n")
    changes = state.update(report=True, trust_events=True, hash_cache=cache)

    # Then events find it: every directory is watched by the new instance
    assert (state.found_by, _names(changes)) == ("events", ((), ("d1/f07.csv",), ()))
    states.close()


def test_replaced_and_moved_directories_are_found_from_events(tmp_path: Path) -> None:
    # Given a kept state that trusts events
    _scope(tmp_path, dirs=4, files=3)
    states, state, cache = _trusted_state(tmp_path)

    # When a directory is replaced by another of the same name, another moved below a third and
    # written there
    for name in os.listdir(tmp_path / "d0"):
        os.unlink(tmp_path / "d0" / name)
    os.rmdir(tmp_path / "d0")
    (tmp_path / "d0").mkdir()
    (tmp_path / "d0/fresh.csv").write_bytes(b"1")
    os.rename(tmp_path / "d1", tmp_path / "d2/d1")
    (tmp_path / "d2/d1/f00.csv").write_bytes(b"written after the move\n")
    changes = state.update(report=True, trust_events=True, hash_cache=cache)

    # Then each change is reported, without a walk of every entry
    assert state.found_by == "events", state.fallback
    assert _names(changes) == (
        ("d0/fresh.csv", "d2/d1/f00.csv", "d2/d1/f01.csv", "d2/d1/f02.csv"),
        (),
        ("d0/f00.csv", "d0/f01.csv", "d0/f02.csv", "d1/f00.csv", "d1/f01.csv", "d1/f02.csv"),
    )

    # And a later write in the moved directory is found too (its watch follows it)
    state.prepare()
    state.settle()
    (tmp_path / "d2/d1/f01.csv").write_bytes(b"and again, longer\n")
    changes = state.update(report=True, trust_events=True, hash_cache=cache)
    assert (state.found_by, _names(changes)) == ("events", ((), ("d2/d1/f01.csv",), ()))
    states.close()
