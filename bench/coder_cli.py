"""What the coder's bundled Claude Code CLI costs per turn, and whether a switch makes it cheaper.

Every coder turn starts the Agent SDK's bundled CLI (``claude_agent_sdk/_bundled/claude``, a
Bun-compiled executable of ~400 MB) with the coder's flags and ``CLI_ENV`` in a fresh private
``CLAUDE_CONFIG_DIR``, as ``coder.agent.build_options`` does. This benchmark starts it against a
scripted Messages API on 127.0.0.1 (``tests/unit/scripted_api.py``), with one in-process tool, and
measures the CLI's CPU (user+sys of the reaped child) and wall time:

- **version**: ``claude --version`` (exec and page-in of the binary, no JavaScript start);
- **turn, 1 reply**: a turn whose model answers at once (the start and end of the CLI);
- **per model turn**: (a turn of 6 replies - a turn of 1) / 5 (tool call, tool result, next request).

Side by side, alternating, for the coder as it is and for variants that might remove work a
production coder does not need; each variant's first request is compared with the coder's (its
per-run parts aside: the private directory's name and ``metadata``): ``same requests`` says whether
the model is sent the same thing.

Usage, from the repository root::

    .venv/bin/python bench/coder_cli.py [--rounds 3] [--json] [--variant "no DFG" ...]

Figures (2 cores shared with other work, medians of alternating runs, CPU-s of a turn of one
reply; the spread is the min-max of the coder's own runs):

==========================================  ==========  ==========  =====================
variant                                     run A (5)   run B (5)   run C (7, min-max)
==========================================  ==========  ==========  =====================
coder (CLI_ENV)                             1.65        1.11        1.61 (1.15-1.87)
+ no DFG/FTL JIT                            1.52        -           1.63 (1.41-1.82)
+ seeded config dir (a whole .claude.json)  -           1.08        1.58 (1.06-2.06)
+ seeded, migration keys only               1.64        1.20        -
+ startup switches                          -           -           1.52 (1.28-1.71)
+ switches + no DFG                         1.47        1.10        1.47 (1.21-1.68)
+ seeded (keys) + switches + no DFG         1.27        1.23        1.52 (1.35-1.75)
+ seeded (no ids) + switches + no DFG       -           1.31        1.56 (1.37-1.78)
==========================================  ==========  ==========  =====================

(load 13-14 in run A, 3-6 in run B, 3-14 in run C; every variant sent the same requests). No
variant, alone or combined, is cheaper than the coder by more than its own spread: the differences
change sign from run to run. So ``CLI_ENV`` keeps only its traffic switches and a turn's config dir
starts empty: a seed would carry a previous turn's file into the next for no measured gain (and a
whole copy would carry its ``userID`` and ``machineID``). This VM has no hardware counters
(``perf stat -e instructions`` is not supported), so CPU time is the only measure here; a machine
with them can settle the last ~0.1 CPU-s.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO_ROOT / "bench"), str(REPO_ROOT / "tests" / "unit"), str(REPO_ROOT)]

import anyio  # noqa: E402
from claude_agent_sdk import ClaudeAgentOptions, create_sdk_mcp_server, query, tool  # noqa: E402
from machine import machine  # noqa: E402
from scripted_api import Reply, ScriptedMessagesAPI, text, tool_use  # noqa: E402

from coder.agent import CLI_ENV  # noqa: E402

BASE = "coder (CLI_ENV)"
SWITCHES = {
    # Each names work the coder never uses (no memory, skills, cron, background tasks,
    # checkpoints, feature flags, plugins from a marketplace, prompt history, MCP log files).
    "CLAUDE_CODE_DISABLE_AUTO_MEMORY": "1",
    "CLAUDE_CODE_DISABLE_BUNDLED_SKILLS": "1",
    "CLAUDE_CODE_DISABLE_CRON": "1",
    "CLAUDE_CODE_DISABLE_BACKGROUND_TASKS": "1",
    "CLAUDE_CODE_DISABLE_FILE_CHECKPOINTING": "1",
    "CLAUDE_CODE_DISABLE_FEATURE_FLAGS": "1",
    "CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL": "1",
    "CLAUDE_CODE_SKIP_PROMPT_HISTORY": "1",
    "CLAUDE_CODE_SKIP_MCP_DEBUG_LOG_FILES": "1",
    "DISABLE_AUTOUPDATER": "1",
}
NO_DFG = {"BUN_JSC_useDFGJIT": "0"}
VARIANTS: dict[str, dict[str, str]] = {
    "coder (CLI_ENV)": {},
    "+ CLAUDE_CODE_SIMPLE=1 (--bare)": {"CLAUDE_CODE_SIMPLE": "1"},
    "+ no DFG/FTL JIT (BUN_JSC_useDFGJIT=0)": {"BUN_JSC_useDFGJIT": "0"},
    "+ seeded config dir": {},
    "+ startup switches": SWITCHES,
    "+ seeded (migration keys only)": {},
    "+ switches + no DFG": {**SWITCHES, **NO_DFG},
    "+ seeded (keys) + switches + no DFG": {**SWITCHES, **NO_DFG},
    "+ seeded (no ids)": {},
    "+ seeded (no ids) + switches + no DFG": {**SWITCHES, **NO_DFG},
}
"""Variant name -> variables set over the coder's for the CLI."""
SEEDED = "+ seeded config dir"
"""The variant whose config dir starts as a copy of one a previous turn left (migrations done)."""
SEEDED_KEYS = ("+ seeded (migration keys only)", "+ seeded (keys) + switches + no DFG")
"""The variants whose config dir starts with only the migration markers of that copy."""
SEEDED_NO_IDS = ("+ seeded (no ids)", "+ seeded (no ids) + switches + no DFG")
"""The variants whose config dir starts with that copy less what names an install or a user."""
IDS = ("userID", "machineID")
MIGRATION_KEYS = ("migrationVersion", "opusProMigrationComplete", "hasResetAutoModeOptInForDefaultOffer")


@tool("ping", "Answers pong.", {"n": int})
async def _ping(args: dict[str, Any]) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": "pong"}]}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _turn(
    api: ScriptedMessagesAPI, replies: int, extra: dict[str, str], seed: Path | None, keep: Path | None = None
) -> dict[str, Any]:
    """One CLI run of ``replies`` model replies (the last a plain answer): its CPU, wall and the
    first request's body. ``seed``: a config dir to start from; ``keep``: a directory to copy the
    config dir's ``.claude.json`` to afterwards."""
    script: list[Reply] = [Reply([tool_use("mcp__t__ping", {"n": i})]) for i in range(replies - 1)]
    api.load([*script, Reply([text("done")])])
    with tempfile.TemporaryDirectory(prefix="coder-cli-bench-") as private:
        config, cwd = Path(private) / "config", Path(private) / "cwd"
        if seed is not None:
            shutil.copytree(seed, config)
        else:
            config.mkdir()
        cwd.mkdir()
        options = ClaudeAgentOptions(
            tools=[],
            allowed_tools=["mcp__t__ping"],
            mcp_servers={"t": create_sdk_mcp_server("t", tools=[_ping])},
            strict_mcp_config=True,
            permission_mode="dontAsk",
            setting_sources=[],
            skills=[],
            system_prompt="You answer.",
            max_turns=20,
            model="claude-sonnet-4-5",
            cwd=str(cwd),
            env={
                "ANTHROPIC_API_KEY": "sk-ant-bench",
                "ANTHROPIC_BASE_URL": api.base_url,
                "CLAUDE_CODE_USE_BEDROCK": "",
                **CLI_ENV,
                "CLAUDE_CONFIG_DIR": str(config),
                "XDG_CACHE_HOME": str(config / "cache"),
                **extra,
            },
        )

        async def drive() -> None:
            async for _message in query(prompt="hello", options=options):
                pass

        cpu, started = _children_cpu(), time.monotonic()
        anyio.run(drive)
        wall, cpu = time.monotonic() - started, _children_cpu() - cpu
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copy2(config / ".claude.json", keep / ".claude.json")
    assert len(api.message_requests()) == replies, "the CLI did not make one request per reply"
    # The first request as the model gets it, its per-run parts aside: the private directory's
    # name (in the environment reminder) and ``metadata`` (device and session ids).
    body = {k: v for k, v in api.message_requests()[0].body.items() if k != "metadata"}
    first = json.dumps(body, sort_keys=True).replace(private, "<private>")
    return {"cpu_s": cpu, "wall_s": wall, "first": first}


def _version_cpu(cli: str) -> tuple[float, float]:
    cpu, started = _children_cpu(), time.monotonic()
    subprocess.run([cli, "--version"], capture_output=True, check=True)
    return _children_cpu() - cpu, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="runs of each variant (alternating)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--variant", action="append", default=[], help="only the variants whose name has this (repeatable)"
    )
    args = parser.parse_args(argv)
    chosen = {
        name: extra
        for name, extra in VARIANTS.items()
        if name == BASE or not args.variant or any(part in name for part in args.variant)
    }
    load = os.getloadavg()[0]
    import claude_agent_sdk

    cli = str(Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude")
    samples: dict[str, dict[str, list[float]]] = {name: {"one": [], "six": [], "wall": []} for name in chosen}
    firsts: dict[str, str] = {}
    versions: list[tuple[float, float]] = []
    with ScriptedMessagesAPI() as api, tempfile.TemporaryDirectory(prefix="coder-cli-seed-") as seed_root:
        seed = Path(seed_root) / "config"
        _turn(api, 1, {}, None, keep=seed)  # a warm-up (page cache) that leaves the seed
        keys = Path(seed_root) / "keys"
        keys.mkdir()
        left = json.loads((seed / ".claude.json").read_text())
        (keys / ".claude.json").write_text(json.dumps({k: left[k] for k in MIGRATION_KEYS if k in left}))
        no_ids = Path(seed_root) / "no-ids"
        no_ids.mkdir()
        (no_ids / ".claude.json").write_text(json.dumps({k: v for k, v in left.items() if k not in IDS}))
        for _ in range(args.rounds):
            versions.append(_version_cpu(cli))
            for name, extra in chosen.items():
                use = {
                    SEEDED: seed,
                    **dict.fromkeys(SEEDED_KEYS, keys),
                    **dict.fromkeys(SEEDED_NO_IDS, no_ids),
                }.get(name)
                one = _turn(api, 1, extra, use)
                six = _turn(api, 6, extra, use)
                samples[name]["one"].append(one["cpu_s"])
                samples[name]["six"].append(six["cpu_s"])
                samples[name]["wall"].append(one["wall_s"])
                firsts.setdefault(name, one["first"])
    base = firsts[BASE]
    rows: list[dict[str, Any]] = []
    for name, got in samples.items():
        one_s, six_s = statistics.median(got["one"]), statistics.median(got["six"])
        rows.append(
            {
                "variant": name,
                "turn_1_reply_cpu_s": round(one_s, 2),
                "turn_1_reply_cpu_range_s": [round(min(got["one"]), 2), round(max(got["one"]), 2)],
                "turn_1_reply_wall_s": round(statistics.median(got["wall"]), 2),
                "per_model_turn_cpu_s": round((six_s - one_s) / 5, 3),
                "same_requests": firsts[name] == base,
            }
        )
    result = {
        "version_cpu_s": round(statistics.median(v[0] for v in versions), 3),
        "version_wall_s": round(statistics.median(v[1] for v in versions), 3),
        "rounds": args.rounds,
        "rows": rows,
        "machine": machine(load),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"claude --version: {result['version_cpu_s']} CPU-s, {result['version_wall_s']} s wall")
    print(f"medians of {args.rounds} alternating runs (CPU-s of the CLI)\n")
    print("| variant | turn of 1 reply, CPU-s | min-max | wall s | per model turn, CPU-s | same requests |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['variant']} | {row['turn_1_reply_cpu_s']} |"
            f" {row['turn_1_reply_cpu_range_s'][0]}-{row['turn_1_reply_cpu_range_s'][1]} |"
            f" {row['turn_1_reply_wall_s']} |"
            f" {row['per_model_turn_cpu_s']} | {'yes' if row['same_requests'] else 'NO'} |"
        )
    print(f"\nmachine: {json.dumps(result['machine'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
