"""The coder evaluation's scorer (issue 17, item 4): checkers that cannot be trivially true.

Three layers: each checker against right and wrong artifacts; every task against an independent
reference solution (it must pass) and against an empty and a wrong delivery (they must fail); and the
whole path through the real Agent SDK and its CLI against the scripted Messages API, where a right
answer passes, a wrong number fails and a missing artifact fails.
"""

from __future__ import annotations

import importlib.util
import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from scripted_api import Reply, ScriptedMessagesAPI, text, tool_use

from alphaagent.api import AlphaAgent
from alphaagent.domain.backend import ConnectorSettings, TurnSettings
from coder.evaluation import (
    EXAMPLES_DIR,
    TASKS,
    Outcome,
    Task,
    chart_with,
    dataset_with,
    number_answer,
    parse_number,
    run_task,
    score,
    svg_texts,
    task_named,
)
from coder.settings import CoderSettings

pytestmark = pytest.mark.mcp_sdk  # imports the MCP SDK in this process (tests/conftest.py)

REPO = Path(__file__).resolve().parents[2]


def _answer(value: str) -> Outcome:
    return Outcome(status="completed", artifacts={"answer": value.encode()})


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, imported by the first test that draws (pandas and
    matplotlib cost ~1 CPU-s; a worker collecting this module may run none of these tests)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _svg(title: str | None, xlabel: str | None, ylabel: str | None, fonttype: str = "path") -> bytes:
    plt = _pyplot()
    with plt.rc_context({"svg.fonttype": fonttype}):
        fig, ax = plt.subplots()
        ax.plot([1, 2, 3], [3, 1, 2])
        if title:
            ax.set_title(title)
        if xlabel:
            ax.set_xlabel(xlabel)
        if ylabel:
            ax.set_ylabel(ylabel)
        out = io.BytesIO()
        fig.savefig(out, format="svg")
        plt.close(fig)
    return out.getvalue()


# ----------------------------------------------------------------------------- the checkers


def test_a_number_answer_passes_within_the_tolerance_only() -> None:
    check = number_answer(lambda: 189.95, 0.1)
    assert check(_answer("190.0\n")).passed
    assert not check(_answer("190.1")).passed
    assert not check(_answer("about 190 or 191")).passed, "two numbers are not an answer"
    assert not check(_answer("many")).passed
    assert not check(Outcome(status="completed")).passed, "no answer artifact"
    assert parse_number("1,139.2") == 1139.2


def test_a_dataset_needs_its_columns_its_rows_and_its_values() -> None:
    check = dataset_with("t", ("a", "b"), 2, lambda f: None if f["b"].sum() == 3 else "b should sum to 3")
    good = b"a,b\nx,1\ny,2\n"
    assert check(Outcome(status="completed", artifacts={"t": good})).passed
    assert "missing columns" in check(Outcome(status="completed", artifacts={"t": b"a\nx\ny\n"})).detail
    assert "rows" in check(Outcome(status="completed", artifacts={"t": good + b"z,0\n"})).detail
    assert "sum" in check(Outcome(status="completed", artifacts={"t": b"a,b\nx,1\ny,5\n"})).detail


@pytest.mark.parametrize("fonttype", ["path", "none"])
def test_a_chart_needs_its_title_words_and_both_axis_labels(fonttype: str) -> None:
    check = chart_with("c", ("bill",))
    whole = _svg("Bill length vs depth", "Bill length (mm)", "Bill depth (mm)", fonttype)
    titles, labels = svg_texts(whole)
    assert titles == ["Bill length vs depth"] and labels == ["Bill length (mm)", "Bill depth (mm)"]
    assert check(Outcome(status="completed", artifacts={"c": whole})).passed
    no_y = _svg("Bill length vs depth", "Bill length (mm)", None, fonttype)
    assert not check(Outcome(status="completed", artifacts={"c": no_y})).passed
    other_title = _svg("Penguins", "Bill length (mm)", "Bill depth (mm)", fonttype)
    assert not check(Outcome(status="completed", artifacts={"c": other_title})).passed
    # Tick labels are not axis labels: a chart without labels has ticks only
    bare = _svg("Bill length vs depth", None, None, fonttype)
    assert not check(Outcome(status="completed", artifacts={"c": bare})).passed


def test_a_hostile_svg_fails_the_check_without_expanding_anything() -> None:
    bomb = (
        b'<?xml version="1.0"?><!DOCTYPE svg [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;">]>'
        b'<svg xmlns="http://www.w3.org/2000/svg"><g id="axes_1"><g id="text_1"><text>&b;</text></g></g></svg>'
    )
    verdict = chart_with("c", ("a",))(Outcome(status="completed", artifacts={"c": bomb}))
    assert not verdict.passed and "not an SVG" in verdict.detail


def test_a_turn_that_failed_fails_whatever_it_registered() -> None:
    task = task_named("adelie-flipper")
    verdict = score(task, Outcome(status="failed", error="MissingOutputsError: ...", artifacts={}))
    assert not verdict.passed and "failed" in verdict.detail


# ----------------------------------------------------------------------------- every task

REFERENCE = {
    # Independent solutions, written as a careful analyst would, run on the shipped tables.
    "heaviest-species": "a = p.groupby('species').body_mass_g.mean().sort_values().index[-1]",
    "adelie-flipper": "a = round(p[p.species == 'Adelie'].flipper_length_mm.dropna().mean(), 1)",
    "biggest-island": "a = p.island.mode()[0]",
    "flipper-mass-correlation": "a = round(p.dropna(subset=['flipper_length_mm','body_mass_g'])"
    "[['flipper_length_mm','body_mass_g']].corr().iloc[0,1], 3)",
    "seattle-rain-2015": "a = round(w[w.date.str.startswith('2015')].precipitation.sum(), 1)",
    "seattle-weather-type": "a = w.weather.mode()[0]",
    "seattle-hottest-day": "a = w.sort_values('temp_max').date.iloc[-1].replace('/', '-')",
    "iowa-renewables-share": "y = e[e.year.str.startswith('2017')]; "
    "a = round(100 * y[y.source == 'Renewables'].net_generation.sum() / y.net_generation.sum(), 1)",
    "employment-trough": "a = u.sort_values('nonfarm').month.iloc[0][:7]",
    "anscombe-slope": "import numpy as np; d = q[q.dataset == 'III']; a = round(np.polyfit(d.x, d.y, 1)[0], 3)",
}


def _reference_outcome(name: str) -> Outcome:
    import pandas as pd

    plt = _pyplot()

    frames = {
        "p": pd.read_csv(EXAMPLES_DIR / "penguins/penguins.csv"),
        "w": pd.read_csv(EXAMPLES_DIR / "eval/seattle-weather.csv"),
        "e": pd.read_csv(EXAMPLES_DIR / "eval/iowa-electricity.csv"),
        "u": pd.read_csv(EXAMPLES_DIR / "eval/us-employment.csv"),
        "q": pd.read_csv(EXAMPLES_DIR / "eval/anscombe.csv"),
    }
    if name in REFERENCE:
        namespace: dict[str, object] = dict(frames)
        exec(REFERENCE[name], namespace)  # the test's own reference code
        return _answer(str(namespace["a"]))
    p = frames["p"]
    if name == "species-summary":
        summary = p.dropna(subset=["body_mass_g"]).groupby("species").body_mass_g.agg(["count", "mean"])
        csv = summary.rename(columns={"mean": "mean_body_mass_g"}).reset_index().to_csv(index=False)
        return Outcome(status="completed", artifacts={"species_summary": csv.encode()})
    fig, ax = plt.subplots()
    if name == "bill-scatter":
        for species, group in p.groupby("species"):
            ax.scatter(group.bill_length_mm, group.bill_depth_mm, label=species)
        ax.set(title="Penguin bill length vs depth", xlabel="Bill length (mm)", ylabel="Bill depth (mm)")
        chart = "bill"
    else:
        u = frames["u"]
        ax.plot(pd.to_datetime(u.month), u.nonfarm)
        ax.set(title="US nonfarm employment", xlabel="Month", ylabel="Employees (thousands)")
        chart = "nonfarm"
    out = io.BytesIO()
    fig.savefig(out, format="svg")
    plt.close(fig)
    return Outcome(status="completed", artifacts={chart: out.getvalue()})


def test_there_are_at_least_twelve_tasks_over_shipped_public_tables() -> None:
    assert len(TASKS) >= 12 and len({t.name for t in TASKS}) == len(TASKS)
    for task in TASKS:
        for table in task.tables:
            assert (EXAMPLES_DIR / table).is_file(), table
            assert (EXAMPLES_DIR / table).parent.joinpath("LICENSE.md").is_file(), f"{table}: no licence"


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
def test_every_task_passes_its_reference_and_fails_an_empty_or_wrong_delivery(
    task: Task, tmp_path: Path
) -> None:
    right = score(task, _reference_outcome(task.name))
    assert right.passed, right.detail
    assert not score(task, Outcome(status="completed")).passed
    wrong = {name: b"0\n" if name == "answer" else b"x\n1\n" for name in right_names(task)}
    assert not score(task, Outcome(status="completed", artifacts=wrong)).passed


def right_names(task: Task) -> list[str]:
    return [str(o["name"]) for o in task.outputs]


def test_the_benchmark_lists_its_tasks_and_says_what_to_set_without_a_model(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_CODE_"))}
    env["PYTHONPATH"] = str(REPO)
    # --list in this process (its module puts bench/ on sys.path: a copy here, restored after)...
    monkeypatch.setattr(sys, "path", list(sys.path))
    loaded = importlib.util.spec_from_file_location("coder_eval_bench", REPO / "bench" / "coder_eval.py")
    assert loaded is not None and loaded.loader is not None
    bench = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(bench)
    assert bench.main(["--list"]) == 0
    listed = capsys.readouterr()
    assert all(task.name in listed.out for task in TASKS) and not listed.err
    # ...and without a model as the script it is, exit status and all
    bare = subprocess.run(
        [sys.executable, "bench/coder_eval.py"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert bare.returncode == 2 and "ANTHROPIC_API_KEY" in bare.stderr and not bare.stdout


# ----------------------------------------------------------------------------- through the real SDK


@pytest.fixture(scope="module")
def api() -> Iterator[ScriptedMessagesAPI]:
    with ScriptedMessagesAPI() as server:
        yield server


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory, api: ScriptedMessagesAPI) -> Iterator[AlphaAgent]:
    from coder.agent import make_coder

    settings = CoderSettings(
        provider="anthropic", anthropic_api_key="sk-ant-test", anthropic_base_url=api.base_url, max_retries=0
    )
    with AlphaAgent(
        tmp_path_factory.mktemp("home"),
        connectors=ConnectorSettings(file_roots=(EXAMPLES_DIR,)),
        turns=TurnSettings(lock_wait_s=30),
        coder=make_coder(settings),
    ) as shared:
        yield shared


def _call(tool: str, **arguments: object) -> dict[str, object]:
    return tool_use(f"mcp__alphaagent__{tool}", dict(arguments))


def _script(api: ScriptedMessagesAPI, code: str, *, register: bool) -> None:
    register_call = _call("register_artifact", kind="report", path="reports/answer.txt", name="answer")
    api.load(
        [
            Reply([_call("run_in_env", code=code)]),
            *([Reply([register_call])] if register else []),
            Reply([text("The mean Adelie flipper length is in reports/answer.txt.")]),
        ]
    )


SOLVE = """\
import pandas as pd
p = pd.read_csv("docs/penguins.csv")
open("reports/answer.txt", "w").write(f"{p[p.species == 'Adelie'].flipper_length_mm.mean():.1f}")
"""


def test_through_the_sdk_a_right_answer_passes(agent: AlphaAgent, api: ScriptedMessagesAPI) -> None:
    _script(api, SOLVE, register=True)
    report = run_task(agent, task_named("adelie-flipper"), user_id="eval", conversation_id="sdk-right")
    assert report.passed, report.detail
    assert report.runs == 1 and report.model_turns == 3
    assert report.input_tokens and report.output_tokens and report.wall_s > 0


def test_through_the_sdk_a_wrong_number_fails(agent: AlphaAgent, api: ScriptedMessagesAPI) -> None:
    _script(api, SOLVE.replace(".mean()", ".max()"), register=True)
    report = run_task(agent, task_named("adelie-flipper"), user_id="eval", conversation_id="sdk-wrong")
    assert not report.passed and "expected" in report.detail


def test_through_the_sdk_a_missing_artifact_fails(agent: AlphaAgent, api: ScriptedMessagesAPI) -> None:
    _script(api, SOLVE, register=False)
    report = run_task(agent, task_named("adelie-flipper"), user_id="eval", conversation_id="sdk-missing")
    assert not report.passed and "MissingOutputsError" in report.detail
