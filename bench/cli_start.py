"""Benchmark: what one ``alphaagent`` command costs before it does its work, before and after the CLI
imports only what the command needs (issue 16, the suite's CLI subprocesses), side by side in one run.

Each command kind runs ``--runs`` times as a fresh ``python -m alphaagent.cli ...`` process, and the
figures are the medians of the child's CPU seconds (the two sides alternate run by run, so both
see the same load) (user + system, ``RUSAGE_CHILDREN``) and wall
seconds:

- ``--version``;
- ``--help`` (the top-level help, which says where the data directory is: it reads the settings);
- ``files --help`` (a command's help);
- a usage error (``files --bogus``);
- ``files`` of a conversation in an empty data directory (a read: the backend is imported);
- ``run`` of a refused spec (``spec_version: 9``: refused before anything is written);
- ``mcp`` with a model configured (``ANTHROPIC_API_KEY``) and stdin closed: the server starts, reads
  the end of its input and exits (the coder's Agent SDK is imported only by a turn that needs it).

"before" is the code of ``--before`` (a git revision, default ``main``), taken with ``git archive``
and put first on ``PYTHONPATH``; "after" is the working tree; both run with this interpreter and its
installed dependencies. The machine (and its load: other work skews every figure) is printed too.

Usage, from the repository root::

    .venv/bin/python bench/cli_start.py [--before main] [--runs 9]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine

REPO_ROOT = Path(__file__).resolve().parent.parent

REFUSED_SPEC = {"spec_version": 9, "scope": {"conversation_id": "bench"}, "goal": "x", "steps": []}


MODEL_ENV = {"ANTHROPIC_API_KEY": "sk-bench-not-a-key"}
"""What configures a model for the kinds that say so (nothing is sent: no turn runs)."""


def _kinds(folder: Path) -> dict[str, list[str]]:
    spec = folder / "refused.json"
    spec.write_text(json.dumps(REFUSED_SPEC))
    home = str(folder / "empty-home")
    return {
        "--version": ["--version"],
        "--help": ["--help"],
        "files --help": ["files", "--help"],
        "usage error": ["files", "--bogus"],
        "files (empty home)": ["files", "--home", home, "--conversation", "c1"],
        "run (refused spec)": ["run", str(spec), "--home", home],
        "mcp (model configured)": ["mcp", "--user", "bench@example.com", "--home", home],
    }


def _with_model(name: str, env: dict[str, str]) -> dict[str, str]:
    return {**env, **MODEL_ENV} if "model configured" in name else env


def _once(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, int]:
    """One fresh process: its CPU seconds (user + system), wall seconds and exit code."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "alphaagent.cli", *argv],
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        check=False,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, done.returncode


def _env_for(code_root: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALPHAAGENT_")}
    if code_root is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(code_root), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _measure(
    sides: dict[str, Path | None], kinds: dict[str, list[str]], runs: int, cwd: Path
) -> dict[str, dict[str, Any]]:
    """Each side's figures per kind, the sides alternating run by run (the same load for both)."""
    envs = {side: _env_for(root) for side, root in sides.items()}
    figures: dict[str, dict[str, Any]] = {side: {} for side in sides}
    for name, argv in kinds.items():
        samples: dict[str, list[tuple[float, float, int]]] = {side: [] for side in sides}
        for _ in range(runs):
            for side in sides:
                samples[side].append(_once(argv, _with_model(name, envs[side]), cwd))
        for side, taken in samples.items():
            figures[side][name] = {
                "cpu_s": statistics.median(s[0] for s in taken),
                "wall_s": statistics.median(s[1] for s in taken),
                "exit": sorted({s[2] for s in taken}),
            }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="main", help="git revision of 'before' (default main)")
    parser.add_argument("--runs", type=int, default=9, help="processes per command kind (median)")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="alphaagent-cli-start-") as tmp:
        folder = Path(tmp)
        old = folder / "before"
        old.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "archive", args.before, "alphaagent"],
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
        kinds = _kinds(folder)
        figures = _measure({"before": old, "after": None}, kinds, args.runs, folder)
        before, after = figures["before"], figures["after"]
    print(f"alphaagent command start-up: median of {args.runs} fresh processes per kind")
    header = (
        f"{'command':22} {'before CPU s':>12} {'after CPU s':>12} {'before wall s':>14} {'after wall s':>13}"
    )
    print(header + "  exit")
    for name in kinds:
        b, a = before[name], after[name]
        same = "" if b["exit"] == a["exit"] else f"  (before exit {b['exit']})"
        print(
            f"{name:22} {b['cpu_s']:12.3f} {a['cpu_s']:12.3f} {b['wall_s']:14.3f} {a['wall_s']:13.3f}"
            f"  {a['exit']}{same}"
        )
    print(f"before: {args.before}; after: the working tree")
    print("machine:", json.dumps(machine(load)))


if __name__ == "__main__":
    main()
