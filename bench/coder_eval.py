"""The coder's evaluation with your model: analysis tasks with known answers (``coder.evaluation``).

Each task is one turn of a spec without steps in a new conversation of a fresh data directory; its
checker reads the artifacts the turn registered and compares them with values computed from the same
public tables (``examples/penguins``, ``examples/eval``). Prints one row per task as it finishes
(pass/fail, runs, model turns, tokens, cost, wall time, and the checker's answer-versus-expected),
then a summary line and the machine; ``--json`` prints one JSON object instead.

Usage, from the repository root::

    ANTHROPIC_API_KEY=sk-ant-... .venv/bin/python bench/coder_eval.py [--task NAME ...] [--json]
    CLAUDE_CODE_USE_BEDROCK=1 AWS_REGION=us-east-1 .venv/bin/python bench/coder_eval.py
    .venv/bin/python bench/coder_eval.py --list

``ALPHAAGENT_MODEL`` picks the model; ``ALPHAAGENT_MAX_BUDGET_USD`` caps each turn's spend.
Exit status: 0 every task passed, 1 some failed, 2 no model is configured or bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine

from alphaagent.errors import ModelConfigError
from coder.evaluation import EXAMPLES_DIR, TASKS, TaskReport, run_task, task_named
from coder.settings import CoderSettings

USER = "eval"
NO_MODEL = (
    "coder_eval: no model is configured; set ANTHROPIC_API_KEY (optionally ALPHAAGENT_MODEL), or"
    " CLAUDE_CODE_USE_BEDROCK=1 with AWS_REGION and AWS credentials"
)


def _row(report: TaskReport) -> str:
    tokens = (
        f"{report.input_tokens:,} / {report.output_tokens:,}"
        if report.input_tokens is not None and report.output_tokens is not None
        else "-"
    )
    cost = f"${report.cost_usd:.4f}" if report.cost_usd is not None else "-"
    turns = str(report.model_turns) if report.model_turns is not None else "-"
    verdict = "pass" if report.passed else "FAIL"
    return (
        f"| {report.task} | {verdict} | {report.runs} | {turns} | {tokens} | {cost} | {report.wall_s:.1f} s"
        f" | {report.detail.replace('|', '/')} |"
    )


def _summary(reports: list[TaskReport], wall_s: float) -> str:
    passed = sum(r.passed for r in reports)
    cost = sum(r.cost_usd or 0.0 for r in reports)
    tokens_in = sum(r.input_tokens or 0 for r in reports)
    tokens_out = sum(r.output_tokens or 0 for r in reports)
    runs = sum(r.runs for r in reports)
    return (
        f"{passed}/{len(reports)} passed · {runs} runs · {tokens_in:,} in / {tokens_out:,} out tokens ·"
        f" ${cost:.4f} · {wall_s:.0f} s"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="list the tasks and exit")
    parser.add_argument("--task", action="append", metavar="NAME", help="run only this task (repeatable)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--home", type=Path, help="data directory (default: a new temporary one)")
    args = parser.parse_args(argv)

    try:
        tasks = [task_named(n) for n in args.task] if args.task else list(TASKS)
    except KeyError as exc:
        print(f"coder_eval: {exc.args[0]}", file=sys.stderr)
        return 2
    if args.list:
        for task in tasks:
            tables = ", ".join(task.tables)
            outputs = ", ".join(f"{o['kind']} {o['name']}" for o in task.outputs)
            print(f"{task.name:26} {tables:28} -> {outputs}\n    {task.goal}")
        print(f"{len(tasks)} tasks")
        return 0
    try:
        settings = CoderSettings.from_env(os.environ)
    except ModelConfigError as exc:
        print(f"coder_eval: {exc}", file=sys.stderr)
        return 2
    if settings is None:
        print(NO_MODEL, file=sys.stderr)
        return 2

    # The platform and the Agent SDK are imported only once a model is configured: `--list` and the
    # "no model" answer are then instant (the SDK's import alone is ~2 CPU-s).
    from alphaagent.api import AlphaAgent
    from alphaagent.domain.backend import ConnectorSettings
    from coder.agent import make_coder

    load = os.getloadavg()[0]
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    reports: list[TaskReport] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="alphaagent-eval-") as scratch:
        home = args.home or Path(scratch)
        connectors = ConnectorSettings(file_roots=(EXAMPLES_DIR,))
        with AlphaAgent(home, connectors=connectors, coder=make_coder(settings)) as agent:
            if not args.json:
                print(
                    f"model: {settings.model or '(the CLI default)'} via {settings.provider}; data: {home}\n"
                )
                print("| task | verdict | runs | model turns | tokens in / out | cost | wall | checker |")
                print("|---|---|---|---|---|---|---|---|")
            for task in tasks:
                report = run_task(agent, task, user_id=USER, conversation_id=f"eval-{task.name}-{stamp}")
                reports.append(report)
                if not args.json:
                    print(_row(report), flush=True)
    wall_s = time.monotonic() - started
    if args.json:
        print(
            json.dumps(
                {
                    "model": settings.model,
                    "provider": settings.provider,
                    "tasks": [asdict(r) for r in reports],
                    "summary": _summary(reports, wall_s),
                    "machine": machine(load),
                },
                indent=2,
            )
        )
    else:
        print(f"\n{_summary(reports, wall_s)}")
        print(f"machine: {machine(load)}")
    return 0 if all(r.passed for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
