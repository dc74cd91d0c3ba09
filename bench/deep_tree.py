"""Benchmark of listing a deep directory chain: re-opening each directory from the root (the walk
``alphaagent files``/``export`` used before, O(depth²)) against ``pathsafe.walk_tree`` (each directory
opened once, relative to its parent's descriptor), side by side in one run (issue 10, item 8).

For each depth it prints the seconds each walk takes over a chain ``d/d/.../d`` with a file at the
bottom, and the directory opens each made; the descriptor walk runs twice: bounded (the product's
``MAX_WALK_DEPTH``, what users get) and unbounded (the cost per level, whatever the depth).

Usage, from the repository root::

    .venv/bin/python bench/deep_tree.py [--depths 500,1000,2000]

The former walk is quadratic: at 6,000 levels it takes minutes (324 s on 2 loaded cores), so the
default depths stay small.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from alphaagent.sandbox.pathsafe import MAX_WALK_DEPTH, walk_tree
from bench.machine import machine

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def make_chain(root: Path, depth: int) -> None:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        next_fd = os.open("d", _DIR_FLAGS, dir_fd=fd)
        os.close(fd)
        fd = next_fd
    os.close(os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    os.close(fd)


def remove_chain(root: Path) -> None:
    """Remove a chain in O(depth) without recursion (``shutil.rmtree`` recurses once per level):
    lift ``d/d`` into the root and remove the emptied ``d``, until the bottom is reached."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        while True:
            try:
                os.rename("d/d", "lifted", src_dir_fd=fd, dst_dir_fd=fd)
            except FileNotFoundError:
                break
            os.rmdir("d", dir_fd=fd)
            os.rename("lifted", "d", src_dir_fd=fd, dst_dir_fd=fd)
        os.unlink("d/bottom.txt", dir_fd=fd)
        os.rmdir("d", dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(root)


def reopen_from_root(root_fd: int) -> tuple[int, int]:
    """The former walk: every directory is reached from the root, one component at a time."""
    files = opens = 0
    pending: list[tuple[str, ...]] = [()]
    while pending:
        parts = pending.pop()
        current = os.dup(root_fd)
        for part in parts:
            next_fd = os.open(part, _DIR_FLAGS, dir_fd=current)
            opens += 1
            os.close(current)
            current = next_fd
        with os.scandir(current) as listing:
            for entry in listing:
                if entry.is_dir(follow_symlinks=False):
                    pending.append((*parts, entry.name))
                else:
                    files += 1
        os.close(current)
    return files, opens


def descriptor_walk(max_depth: int) -> Callable[[int], tuple[int, int]]:
    def walk(root_fd: int) -> tuple[int, int]:
        files = visits = 0
        for visit in walk_tree(root_fd, max_depth=max_depth):
            visits += 1
            files += sum(1 for _, st in visit.entries or () if not stat.S_ISDIR(st.st_mode))
        return files, visits - 1  # one open per directory below the root

    return walk


def timed(walk: Callable[[int], tuple[int, int]], root: Path) -> dict[str, float | int]:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        started = time.perf_counter()
        files, opens = walk(fd)
        return {"seconds": round(time.perf_counter() - started, 3), "files": files, "opens": opens}
    finally:
        os.close(fd)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depths", default="500,1000,2000", help="comma-separated chain depths")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    rows = []
    for depth in (int(d) for d in args.depths.split(",")):
        root = Path(tempfile.mkdtemp(prefix="alphaagent-deep-"))
        try:
            make_chain(root, depth)
            rows.append(
                {
                    "depth": depth,
                    "reopen_from_root": timed(reopen_from_root, root),
                    f"descriptors_bounded_{MAX_WALK_DEPTH}": timed(descriptor_walk(MAX_WALK_DEPTH), root),
                    "descriptors_unbounded": timed(descriptor_walk(10**9), root),
                }
            )
        finally:
            remove_chain(root)
        print(json.dumps(rows[-1]), file=sys.stderr)
    print(
        "| depth | re-open from root: s (opens) | descriptors, bounded: s (opens)"
        " | descriptors, unbounded: s (opens) |"
    )
    print("|---|---|---|---|")
    for row in rows:
        cells = [
            row["reopen_from_root"],
            row[f"descriptors_bounded_{MAX_WALK_DEPTH}"],
            row["descriptors_unbounded"],
        ]
        print(f"| {row['depth']} | " + " | ".join(f"{c['seconds']} ({c['opens']})" for c in cells) + " |")
    print(json.dumps({"machine": machine(load)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
