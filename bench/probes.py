"""Benchmark of the answer to a probe: another user's thing against one that does not exist.

A request for another user's conversation, run or session must get the answer a nonexistent one gets,
in the same timing class (DESIGN §4.7, ISO-01), while the probe is recorded in the audit trail
(``alphaagent.domain.audit``). This prints, side by side for each kind, the latency of the
not-found answer for alice's thing (asked by mallory: recorded) and for a missing one (not recorded),
as median and p90 over ``ROUNDS`` interleaved requests, and the ratio of the medians; then the
machine.

Usage, from the repository root::

    .venv/bin/python bench/probes.py [--rounds N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from machine import machine  # noqa: E402

from alphaagent.api import AlphaAgent  # noqa: E402
from alphaagent.errors import NotFoundError  # noqa: E402
from alphaagent.models.common import ConversationScope  # noqa: E402

ROUNDS = 300
ALICE, MALLORY = "alice", "mallory"


def _latency_us(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    try:
        call()
    except NotFoundError:
        pass
    else:
        raise AssertionError("a probe was answered with something other than NotFoundError")
    return (time.perf_counter() - started) * 1e6


def _figures(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_us": round(statistics.median(ordered), 1),
        "p90_us": round(ordered[int(len(ordered) * 0.9) - 1], 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as home, AlphaAgent(Path(home)) as agent:
        spec = {
            "spec_version": 1,
            "user_id": ALICE,
            "scope": {"conversation_id": "c-owned"},
            "goal": "bench",
            "steps": [{"title": "one", "code": "print(1)"}],
        }
        assert agent.run_analysis(spec).status == "completed"
        owned = ConversationScope(conversation_id="c-owned")
        missing = ConversationScope(conversation_id="c-missing")
        (run,) = agent.history(ALICE, owned)
        (session,) = agent.sessions(ALICE, owned)
        kinds: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
            "conversation": (lambda: agent.history(MALLORY, owned), lambda: agent.history(MALLORY, missing)),
            "run": (
                lambda: agent.run_record(MALLORY, run.run_id),
                lambda: agent.run_record(MALLORY, "01" + "0" * 24),
            ),
            "session": (
                lambda: agent.session(MALLORY, session.session_id),
                lambda: agent.session(MALLORY, "s" * 43),
            ),
        }
        results: dict[str, Any] = {}
        for kind, (foreign, nonexistent) in kinds.items():
            samples: dict[str, list[float]] = {"foreign": [], "missing": []}
            for _ in range(args.rounds):  # interleaved, so drift in load hits both alike
                samples["foreign"].append(_latency_us(foreign))
                samples["missing"].append(_latency_us(nonexistent))
            figures = {label: _figures(values) for label, values in samples.items()}
            ratio = figures["foreign"]["median_us"] / figures["missing"]["median_us"]
            results[kind] = {**figures, "median_ratio": round(ratio, 2)}
        recorded = len(agent.audit_trail.read())
    report = {"rounds": args.rounds, "results": results, "audit_lines": recorded, "machine": machine(load)}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"Not-found answers, {args.rounds} interleaved requests per column (µs)\n")
    print("| kind | foreign median | foreign p90 | missing median | missing p90 | ratio of medians |")
    print("|---|---|---|---|---|---|")
    for kind, row in results.items():
        f, m = row["foreign"], row["missing"]
        print(
            f"| {kind} | {f['median_us']} | {f['p90_us']} | {m['median_us']} | {m['p90_us']} |"
            f" {row['median_ratio']} |"
        )
    print(f"\naudit lines written: {recorded} (expected {args.rounds * len(results)})")
    print("\nmachine:", json.dumps(report["machine"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
