"""What one spare costs at each way of making it: the zygote's own spare code, side by side in one run
(issue 11, item 4).

A driver process (the environment's interpreter, the zygote's environment, the builtin preload and
warm-up, ``gc.freeze`` as ``zygote.main`` does) builds one ``zygote.Zygote`` per variant and, round
robin so the machine's load weighs on all alike, makes a spare with the real ``_fork_spare``, waits
until it says ``ready`` (prewarmed, waiting for a request), then kills it with ``_drop_spare`` and
waits until every process of it is reaped. Variants:

- ``process``: ``isolation="process"``, one fork;
- ``namespaces-helper``: the namespaces level with ``clone_spares`` off: a fork, a helper that
  unshares and forks the namespace's init, which forks the spare (the path before this change);
- ``namespaces-clone``: the default namespaces level: one ``clone(2)`` into the fresh namespaces
  (the namespace's init), which forks the spare.

Printed per variant (Markdown, or one JSON object with ``--json``): p50/p95 of the wall time from
the fork to ``ready`` ("creation"), and the CPU of the whole spare's life per spare (the driver's
own time, which includes the page-table copy of the fork, plus every process it reaped: the zygote
is a subreaper). Kernel work done in kernel threads (a network namespace's teardown) is in neither:
the system-wide busy time per spare is printed too, with other users' load in it.

Usage, from the repository root::

    .venv/bin/python bench/spare.py [--spares 30] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from machine import machine  # noqa: E402

from alphaagent.sandbox.cgroup import RunCgroups  # noqa: E402
from alphaagent.sandbox.config import SandboxConfig  # noqa: E402
from alphaagent.sandbox.environment import zygote_environment  # noqa: E402
from alphaagent.sandbox.supervisor import ZYGOTE_PATH  # noqa: E402

VARIANTS = {
    "process": {"isolation": "process"},
    "namespaces-helper": {"isolation": "namespaces", "clone_spares": False},
    "namespaces-clone": {"isolation": "namespaces", "clone_spares": True},
}

# Runs in the driver process, under the environment's interpreter; imports the zygote by its path.
DRIVER = r"""
import gc, importlib.util, json, os, resource, select, socket, statistics, sys, time
spec = importlib.util.spec_from_file_location("_bench_zygote", sys.argv[1])
z = importlib.util.module_from_spec(spec); spec.loader.exec_module(z)
args = json.loads(sys.argv[2])
z._preload(args["preload"]); z._STATE = z._load_state_module(); z._warm_up(args["warmup"])
z._prctl(z.PR_SET_CHILD_SUBREAPER, 1)
zygotes, peers = {}, []
for name, extra in args["variants"].items():
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    peers.append(ours)
    config = {"control_fd": theirs.detach(), "pool_size": 0, "cgroup_parents": args["cgroups"], **extra}
    zygotes[name] = z.Zygote(config)
gc.collect(); gc.freeze()
tick = os.sysconf("SC_CLK_TCK")
def busy():
    with open("/proc/stat") as fh:
        v = [int(x) for x in fh.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / tick
def cpu():
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
def reap_all(deadline):
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            time.sleep(0.001)
    return False
out = {name: {"creation_ms": [], "cpu_ms": [], "busy_ms": [], "failed": 0} for name in zygotes}
for _ in range(args["spares"]):
    for name, zy in zygotes.items():
        b0, c0, t0 = busy(), cpu(), time.monotonic()
        spare = zy._fork_spare(False)
        ready = spare is not None
        while ready and spare not in zy.spares:
            if spare not in zy.pending.values() or time.monotonic() - t0 > 20:
                ready = False
                break
            select.select([spare.sock], [], [], 0.05)
            zy._on_spare_message(spare.sock)
        created = time.monotonic()
        if spare is not None:
            zy._drop_spare(spare)
        reap_all(time.monotonic() + 10)
        zy._remove_doomed_cgroups(force=True)
        if not ready:
            out[name]["failed"] += 1
            continue
        out[name]["creation_ms"].append((created - t0) * 1000)
        out[name]["cpu_ms"].append((cpu() - c0) * 1000)
        out[name]["busy_ms"].append((busy() - b0) * 1000)
ready = {n: {"spares": zy.spare_path(), "clone_refused": zy.clone_refused} for n, zy in zygotes.items()}
print(json.dumps({"results": out, "ready": ready}))
"""


def pct(samples: list[float], q: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def bench(spares: int) -> dict[str, Any]:
    load_at_start = os.getloadavg()[0]
    config = SandboxConfig()
    cgroups = RunCgroups.detect(("pids", "memory"))
    with tempfile.TemporaryDirectory(prefix="bench-spare-") as scratch:
        mpl = Path(scratch) / "mplconfig"
        mpl.mkdir()
        args = {
            "preload": list(config.preload),
            "warmup": config.warmup,
            "spares": spares,
            "variants": VARIANTS,
            "cgroups": {c: str(p) for c, p in cgroups.parents.items()} if cgroups else {},
        }
        try:
            done = subprocess.run(
                [config.python, "-c", DRIVER, str(ZYGOTE_PATH), json.dumps(args)],
                env=zygote_environment(config, mpl),
                cwd=scratch,
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
        finally:
            if cgroups is not None:
                cgroups.close()
    if done.returncode != 0:
        raise SystemExit(f"bench/spare.py: the driver failed: {done.stderr[-2000:]}")
    raw = json.loads(done.stdout.strip().splitlines()[-1])
    rows = {}
    for name, figures in raw["results"].items():
        rows[name] = {
            "spares": raw["ready"][name]["spares"],
            "clone_refused": raw["ready"][name]["clone_refused"],
            "made": len(figures["creation_ms"]),
            "failed": figures["failed"],
            "creation_p50_ms": round(pct(figures["creation_ms"], 0.5), 1),
            "creation_p95_ms": round(pct(figures["creation_ms"], 0.95), 1),
            "cpu_p50_ms": round(pct(figures["cpu_ms"], 0.5), 1),
            "system_busy_p50_ms": round(pct(figures["busy_ms"], 0.5), 1),
        }
    return {
        "machine": machine(load_at_start),
        "load_1m_after": round(os.getloadavg()[0], 2),
        "variants": rows,
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "## One spare, fork to ready and its whole life's CPU (bench/spare.py)",
        "",
        "| variant | made with | spares | creation p50 / p95 ms | CPU p50 ms per spare "
        "| system busy p50 ms per spare (others' load in it) |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in report["variants"].items():
        lines.append(
            f"| {name} | {row['spares']} | {row['made']} ({row['failed']} failed) "
            f"| {row['creation_p50_ms']} / {row['creation_p95_ms']} | {row['cpu_p50_ms']} "
            f"| {row['system_busy_p50_ms']} |"
        )
    ns, proc = report["variants"]["namespaces-clone"], report["variants"]["process"]
    helper = report["variants"]["namespaces-helper"]
    lines += [
        "",
        f"CPU per spare, namespaces ÷ process: clone {ns['cpu_p50_ms'] / proc['cpu_p50_ms']:.2f}, "
        f"helper {helper['cpu_p50_ms'] / proc['cpu_p50_ms']:.2f}. Machine: "
        f"{json.dumps(report['machine'])}; 1-minute load after: {report['load_1m_after']}.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spares", type=int, default=30, help="spares per variant (default 30)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    options = parser.parse_args(argv)
    report = bench(max(1, options.spares))
    print(json.dumps(report, indent=2) if options.json else markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
