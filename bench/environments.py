"""Benchmark of local execution environments (issue 12): what `alphaagent env add` costs, and what
one warm zygote per environment saves when a machine's runs alternate between two environments,
side by side with stopping the zygote whenever the environment changes (one zygote at a time).

It makes a virtual environment with the standard library only (`bare`), registers it in a
temporary data directory, then runs ``--runs`` tiny runs alternating builtin / bare, twice: with
both zygotes kept warm (the executor as shipped), and with every zygote stopped after each run
(``reap_idle`` on a clock moved past the idle time). It prints the median and worst wall time per
run for each, the registration time, and the first (uncached) registry lookup of ``builtin``, which
lists this interpreter's distributions.

Usage, from the repository root::

    .venv/bin/python bench/environments.py [--runs 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import venv
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from alphaagent.environments import builtin_local
from alphaagent.ids import new_ulid
from alphaagent.local.environments import LocalEnvironmentRegistry, register_environment
from alphaagent.local.executor import SandboxExecutor
from alphaagent.local.store import SqliteStore
from alphaagent.models.common import ConversationScope
from alphaagent.models.run import RunLimits, RunOrigin
from alphaagent.sandbox.config import SandboxConfig
from bench.machine import machine


def _alternate(executor: SandboxExecutor, workdir: Path, runs: int, after_each: object = None) -> list[float]:
    """Wall ms of ``runs`` runs alternating builtin and bare; ``after_each()`` after every run."""
    times = []
    for i in range(runs):
        origin = RunOrigin(
            turn_id=new_ulid(),
            session_id="bench",
            user_id="bench",
            scope=ConversationScope(conversation_id="bench"),
            environment_id=("builtin", "bare")[i % 2],
        )
        started = time.perf_counter()
        result = executor.run(workdir, "print(1)", limits=RunLimits(), run_id=new_ulid(), origin=origin)
        times.append((time.perf_counter() - started) * 1000)
        assert result.status == "ok", result
        if callable(after_each):
            after_each()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="alphaagent-bench-env-") as scratch:
        root = Path(scratch)
        venv.EnvBuilder(with_pip=False, symlinks=True).create(root / "bare")
        store = SqliteStore(root / "alphaagent.db")
        config = SandboxConfig(hidden_paths=(str(Path.home()), str(root)))

        registry = LocalEnvironmentRegistry(store, builtin_local(config.python))
        started = time.perf_counter()
        registry.get("builtin")
        builtin_lookup_ms = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        registry.get("builtin")
        cached_lookup_ms = (time.perf_counter() - started) * 1000

        started = time.perf_counter()
        register_environment(registry, config, environment_id="bare", python=str(root / "bare/bin/python"))
        add_ms = (time.perf_counter() - started) * 1000

        workdir = root / "scope"
        workdir.mkdir()
        warm = SandboxExecutor(config, environments=registry)
        try:
            _alternate(warm, workdir, 2)  # both zygotes up before timing
            pooled = _alternate(warm, workdir, args.runs)
        finally:
            warm.close()

        now = [0.0]
        single = SandboxExecutor(config, environments=registry, idle_s=1, clock=lambda: now[0])

        def stop_all() -> None:
            now[0] += 10
            single.reap_idle()

        try:
            restarted = _alternate(single, workdir, args.runs, after_each=stop_all)
        finally:
            single.close()
        store.close()

    def summary(times: list[float]) -> dict[str, float]:
        return {"median_ms": round(statistics.median(times), 1), "max_ms": round(max(times), 1)}

    print(
        json.dumps(
            {
                "env_add_ms": round(add_ms),
                "builtin_lookup_first_ms": round(builtin_lookup_ms, 1),
                "builtin_lookup_cached_ms": round(cached_lookup_ms, 3),
                "alternating_runs": args.runs,
                "one_warm_zygote_per_environment": summary(pooled),
                "zygote_stopped_on_every_switch": summary(restarted),
                "machine": machine(load),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
