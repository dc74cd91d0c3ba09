"""The coder's evaluation: analysis tasks with known answers over public tables that ship with the
project (issue 17, item 4), and the checkers that score what a turn delivered.

A ``Task`` is a spec without steps (a goal, the tables it reads through the ``file`` connector, the
outputs it must register) plus a ``Check``. Checkers never trust the model's words: they read the
artifacts the turn registered, through the platform's records, and compare them with values
computed here from the same tables (so no expected number is typed in by hand). The answer of a
question is a report artifact ``answer`` at ``reports/answer.txt`` holding the value alone.

``bench/coder_eval.py`` runs the tasks with the configured model and prints the table; the test
suite drives the scorer with scripted transcripts (``tests/unit/test_coder_eval.py``).
"""

from __future__ import annotations

import io
import json
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import DefusedXMLParser

from alphaagent.errors import AlphaAgentError, NotFoundError
from alphaagent.models.common import ConversationScope, Scope

if TYPE_CHECKING:
    import pandas as pd

    from alphaagent.api import AlphaAgent
    from alphaagent.domain.reads import ScopeReads
    from alphaagent.models.records import TurnResult

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"
"""Where the tables live: ``penguins/`` (CC0) and ``eval/`` (public domain, see its LICENSE.md)."""

ANSWER = {"kind": "report", "name": "answer", "path": "reports/answer.txt"}
ANSWER_RULE = (
    " Write the answer alone (no words, no units) to reports/answer.txt and register it as the"
    " report named answer."
)
MAX_ARTIFACT_BYTES = 8 * 2**20
"""Artifacts larger than this are not parsed by a checker (a fail, with the size)."""


@dataclass(frozen=True)
class Verdict:
    """Whether a task passed, and why in one line."""

    passed: bool
    detail: str


@dataclass(frozen=True)
class Outcome:
    """What a turn delivered, as read back from the platform: its status, summary or error, and
    the bytes of the latest version of each artifact it registered, by name."""

    status: str
    summary: str = ""
    error: str | None = None
    artifacts: Mapping[str, bytes] = field(default_factory=dict)


Check = Callable[[Outcome], Verdict]


@dataclass(frozen=True)
class Task:
    """One evaluation task: ``goal`` for the model, ``tables`` (paths under ``examples/``) given
    as ``file`` connector inputs, the ``outputs`` it must register, and its ``check``."""

    name: str
    goal: str
    tables: tuple[str, ...]
    outputs: tuple[Mapping[str, str], ...]
    check: Check
    max_runs: int = 12

    def spec(self, conversation_id: str, user_id: str, examples: Path = EXAMPLES_DIR) -> dict[str, Any]:
        """The spec of this task in ``conversation_id``."""
        return {
            "spec_version": 1,
            "user_id": user_id,
            "scope": {"conversation_id": conversation_id},
            "goal": self.goal,
            "inputs": [
                {"kind": "connector", "connector": "file", "request": {"path": str(examples / table)}}
                for table in self.tables
            ],
            "outputs": [dict(o) for o in self.outputs],
            "constraints": {"max_runs": self.max_runs, "run_timeout_s": 120},
        }


def score(task: Task, outcome: Outcome) -> Verdict:
    """The task's verdict; a turn that did not complete fails with its error."""
    if outcome.status != "completed":
        return Verdict(False, f"turn {outcome.status}: {(outcome.error or 'no error recorded')[:300]}")
    return task.check(outcome)


# ----------------------------------------------------------------------------- reading artifacts


def _artifact(outcome: Outcome, name: str) -> bytes | Verdict:
    data = outcome.artifacts.get(name)
    if data is None:
        registered = ", ".join(sorted(outcome.artifacts)) or "none"
        return Verdict(False, f"no artifact {name!r} was registered (registered: {registered})")
    if len(data) > MAX_ARTIFACT_BYTES:
        return Verdict(False, f"artifact {name!r} is {len(data):,} bytes, over {MAX_ARTIFACT_BYTES:,}")
    return data


_NUMBER = re.compile(r"[-+]?(?:\d+(?:[.,]\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def parse_number(text: str) -> float | None:
    """The one number in ``text`` (``1,139.2`` and ``1139.2`` alike), or None if there is none or
    more than one (an answer must be the value alone)."""
    found = _NUMBER.findall(text.replace(",", "").strip())
    if len(found) != 1:
        return None
    return float(found[0])


def number_answer(expected: Callable[[], float], tolerance: float) -> Check:
    """The answer is a number within ``tolerance`` of ``expected()``."""

    def check(outcome: Outcome) -> Verdict:
        data = _artifact(outcome, "answer")
        if isinstance(data, Verdict):
            return data
        text = data.decode("utf-8", "replace")
        value, want = parse_number(text), expected()
        if value is None:
            return Verdict(False, f"the answer is not one number: {text[:80]!r}")
        ok = abs(value - want) <= tolerance
        return Verdict(ok, f"answer {value:g}, expected {want:g} ± {tolerance:g}")

    return check


def category_answer(expected: Callable[[], str]) -> Check:
    """The answer names ``expected()`` (case and surrounding space and quotes ignored)."""

    def check(outcome: Outcome) -> Verdict:
        data = _artifact(outcome, "answer")
        if isinstance(data, Verdict):
            return data
        given = data.decode("utf-8", "replace").strip().strip("\"'`.").strip().casefold()
        want = expected()
        return Verdict(given == want.casefold(), f"answer {given[:80]!r}, expected {want!r}")

    return check


def dataset_with(
    name: str, columns: tuple[str, ...], rows: int, values: Callable[[pd.DataFrame], str | None] | None = None
) -> Check:
    """A CSV dataset artifact ``name`` with at least ``columns`` and exactly ``rows`` rows;
    ``values(frame)`` returns a problem with its contents, or None."""

    def check(outcome: Outcome) -> Verdict:
        data = _artifact(outcome, name)
        if isinstance(data, Verdict):
            return data
        import pandas as pd  # here, not at import: listing the tasks needs no pandas (~1 CPU-s)

        try:
            frame = pd.read_csv(io.BytesIO(data))
        except (ValueError, UnicodeDecodeError) as exc:
            return Verdict(False, f"{name}: not a CSV pandas reads ({str(exc)[:120]})")
        missing = [c for c in columns if c not in frame.columns]
        if missing:
            return Verdict(False, f"{name}: missing columns {missing} (has {list(frame.columns)[:12]})")
        if len(frame) != rows:
            return Verdict(False, f"{name}: {len(frame)} rows, expected {rows}")
        problem = values(frame) if values is not None else None
        if problem:
            return Verdict(False, f"{name}: {problem}")
        return Verdict(True, f"{name}: columns {list(columns)}, {rows} rows")

    return check


def svg_texts(svg: bytes) -> tuple[list[str], list[str]]:
    """The titles and the axis labels of a matplotlib SVG: the texts drawn directly in an axes
    (its title) and directly in an axis outside its ticks (its label). Matplotlib writes each text
    as a comment before its glyph paths (``svg.fonttype: path``) or as ``<text>`` (``none``)."""
    # The SVG is the model's output: parsed without entities or external references (defusedxml; a
    # plain DOCTYPE, which matplotlib writes, is allowed), and size-capped above.
    parser = DefusedXMLParser(target=ET.TreeBuilder(insert_comments=True))
    parser.feed(svg)
    root = parser.close()

    def words(group: ET.Element) -> str:
        parts = [str(node.text or "") for node in group.iter() if node.tag is ET.Comment]  # type: ignore[comparison-overlap]
        parts += ["".join(node.itertext()) for node in group.iter() if str(node.tag).endswith("}text")]
        return " ".join(p.strip() for p in parts if p.strip())

    def is_group(node: ET.Element, prefix: str) -> bool:
        return str(node.tag).endswith("}g") and node.get("id", "").startswith(prefix)

    titles, labels = [], []
    for axes in (g for g in root.iter() if is_group(g, "axes_")):
        for child in axes:
            if is_group(child, "text_"):
                titles.append(words(child))
            elif is_group(child, "matplotlib.axis_"):
                labels += [words(g) for g in child if is_group(g, "text_")]
    return [t for t in titles if t], [label for label in labels if label]


def chart_with(name: str, title_words: tuple[str, ...]) -> Check:
    """An SVG chart artifact ``name`` with a title holding each of ``title_words`` (any case)
    and both axes labelled."""

    def check(outcome: Outcome) -> Verdict:
        data = _artifact(outcome, name)
        if isinstance(data, Verdict):
            return data
        try:
            titles, labels = svg_texts(data)
        except (ET.ParseError, DefusedXmlException) as exc:
            return Verdict(False, f"{name}: not an SVG ({exc})")
        title = " ".join(titles).casefold()
        absent = [w for w in title_words if w.casefold() not in title]
        if absent:
            return Verdict(False, f"{name}: title {' / '.join(titles)[:80]!r} lacks {absent}")
        if len(labels) < 2:
            return Verdict(False, f"{name}: axis labels {labels}, expected both axes labelled")
        return Verdict(True, f"{name}: title {titles[0][:60]!r}, axes {labels[:2]}")

    return check


def all_of(*checks: Check) -> Check:
    """Passes when every check passes; the first failure is the verdict."""

    def check(outcome: Outcome) -> Verdict:
        verdicts = [c(outcome) for c in checks]
        failed = [v for v in verdicts if not v.passed]
        return failed[0] if failed else Verdict(True, "; ".join(v.detail for v in verdicts))

    return check


# ----------------------------------------------------------------------------- the tables


@cache
def _table(path: str) -> pd.DataFrame:
    import pandas as pd  # here, not at import (see dataset_with)

    return pd.read_csv(EXAMPLES_DIR / path)


def penguins() -> pd.DataFrame:
    return _table("penguins/penguins.csv")


def weather() -> pd.DataFrame:
    import pandas as pd

    frame = _table("eval/seattle-weather.csv").copy()
    frame["date"] = pd.to_datetime(frame["date"])
    return frame


def electricity() -> pd.DataFrame:
    import pandas as pd

    frame = _table("eval/iowa-electricity.csv").copy()
    frame["year"] = pd.to_datetime(frame["year"]).dt.year
    return frame


def employment() -> pd.DataFrame:
    return _table("eval/us-employment.csv")


def anscombe() -> pd.DataFrame:
    return _table("eval/anscombe.csv")


def _renewable_share(year: int) -> float:
    frame = electricity()
    in_year = frame[frame["year"] == year]
    renewables = in_year.loc[in_year["source"] == "Renewables", "net_generation"].sum()
    return float(100 * renewables / in_year["net_generation"].sum())


def _slope(series: str) -> float:
    frame = anscombe()[anscombe()["dataset"] == series]
    x, y = frame["x"], frame["y"]
    return float(((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum())


def _species_summary_values(frame: pd.DataFrame) -> str | None:
    want = penguins().groupby("species")["body_mass_g"].mean()
    if "species" not in frame.columns:
        return "no species column"
    got = frame.set_index("species")["mean_body_mass_g"]
    for species, mean in want.items():
        if species not in got.index or abs(float(got[species]) - float(mean)) > 1.0:
            return f"mean_body_mass_g of {species} should be {mean:.1f}"
    return None


PENGUINS, WEATHER, ELECTRICITY, EMPLOYMENT, ANSCOMBE = (
    "penguins/penguins.csv",
    "eval/seattle-weather.csv",
    "eval/iowa-electricity.csv",
    "eval/us-employment.csv",
    "eval/anscombe.csv",
)

TASKS: tuple[Task, ...] = (
    Task(
        "heaviest-species",
        "Which penguin species has the highest mean body mass? Answer with the species name." + ANSWER_RULE,
        (PENGUINS,),
        (ANSWER,),
        category_answer(lambda: str(penguins().groupby("species")["body_mass_g"].mean().idxmax())),
    ),
    Task(
        "adelie-flipper",
        "What is the mean flipper length of Adelie penguins, in mm, to one decimal?" + ANSWER_RULE,
        (PENGUINS,),
        (ANSWER,),
        number_answer(
            lambda: float(penguins().query("species == 'Adelie'")["flipper_length_mm"].mean()), 0.1
        ),
    ),
    Task(
        "biggest-island",
        "On which island were the most penguins measured? Answer with the island's name." + ANSWER_RULE,
        (PENGUINS,),
        (ANSWER,),
        category_answer(lambda: str(penguins()["island"].value_counts().idxmax())),
    ),
    Task(
        "flipper-mass-correlation",
        "What is the Pearson correlation between flipper length and body mass across all penguins"
        " (rows with either missing left out), to three decimals?" + ANSWER_RULE,
        (PENGUINS,),
        (ANSWER,),
        number_answer(lambda: float(penguins()["flipper_length_mm"].corr(penguins()["body_mass_g"])), 0.002),
    ),
    Task(
        "species-summary",
        "Summarise the penguins by species: a dataset with one row per species and the columns species,"
        " count (penguins with a body mass) and mean_body_mass_g. Save it as datasets/species_summary.csv"
        " and register it as the dataset named species_summary.",
        (PENGUINS,),
        ({"kind": "dataset", "name": "species_summary", "path": "datasets/species_summary.csv"},),
        dataset_with("species_summary", ("species", "count", "mean_body_mass_g"), 3, _species_summary_values),
    ),
    Task(
        "bill-scatter",
        "Plot bill length against bill depth for the penguins, coloured by species, with a title that"
        " contains the word 'bill' and both axes labelled with their units. Save it with matplotlib as"
        " charts/bill.svg and register it as the chart named bill.",
        (PENGUINS,),
        ({"kind": "chart", "name": "bill", "path": "charts/bill.svg"},),
        chart_with("bill", ("bill",)),
    ),
    Task(
        "seattle-rain-2015",
        "What was Seattle's total precipitation in 2015, in mm, to one decimal?" + ANSWER_RULE,
        (WEATHER,),
        (ANSWER,),
        number_answer(
            lambda: float(weather().loc[weather()["date"].dt.year == 2015, "precipitation"].sum()), 0.15
        ),
    ),
    Task(
        "seattle-weather-type",
        "Which weather type was recorded on the most days in Seattle? Answer with the type as it is"
        " written in the data." + ANSWER_RULE,
        (WEATHER,),
        (ANSWER,),
        category_answer(lambda: str(weather()["weather"].value_counts().idxmax())),
    ),
    Task(
        "seattle-hottest-day",
        "On which date was Seattle's highest maximum temperature recorded? Answer as YYYY-MM-DD."
        + ANSWER_RULE,
        (WEATHER,),
        (ANSWER,),
        category_answer(lambda: f"{weather().loc[weather()['temp_max'].idxmax(), 'date']:%Y-%m-%d}"),
    ),
    Task(
        "iowa-renewables-share",
        "What share of Iowa's net electricity generation came from renewables in 2017, in percent,"
        " to one decimal?" + ANSWER_RULE,
        (ELECTRICITY,),
        (ANSWER,),
        number_answer(lambda: _renewable_share(2017), 0.1),
    ),
    Task(
        "employment-trough",
        "In which month was total nonfarm employment in the United States lowest? Answer as YYYY-MM."
        + ANSWER_RULE,
        (EMPLOYMENT,),
        (ANSWER,),
        category_answer(lambda: str(employment().loc[employment()["nonfarm"].idxmin(), "month"])[:7]),
    ),
    Task(
        "employment-chart",
        "Draw total nonfarm employment by month as a line chart with a title containing 'nonfarm' and"
        " both axes labelled. Save it with matplotlib as charts/nonfarm.svg and register it as the chart"
        " named nonfarm.",
        (EMPLOYMENT,),
        ({"kind": "chart", "name": "nonfarm", "path": "charts/nonfarm.svg"},),
        chart_with("nonfarm", ("nonfarm",)),
    ),
    Task(
        "anscombe-slope",
        "Fit an ordinary least-squares line y = a + b x to dataset III of Anscombe's quartet. What is"
        " the slope b, to three decimals?" + ANSWER_RULE,
        (ANSCOMBE,),
        (ANSWER,),
        number_answer(lambda: _slope("III"), 0.002),
    ),
)
"""The tasks, by name (``bench/coder_eval.py --list``)."""


def task_named(name: str) -> Task:
    """The task called ``name``; ``KeyError`` naming the known ones."""
    for task in TASKS:
        if task.name == name:
            return task
    raise KeyError(f"no task {name!r} (known: {', '.join(t.name for t in TASKS)})")


# ----------------------------------------------------------------------------- running a task


@dataclass(frozen=True)
class TaskReport:
    """One task's row: the verdict, and what the turn cost (from its ``usage.json``; ``None``
    where the turn recorded none, e.g. a spec refused before the coder started)."""

    task: str
    passed: bool
    detail: str
    turn_id: str | None
    runs: int
    model_turns: int | None
    input_tokens: int | None
    output_tokens: int | None
    cost_usd: float | None
    wall_s: float


def outcome_of(agent: ScopeReads, user_id: str, scope: Scope, result: TurnResult) -> Outcome:
    """Read back what a turn delivered: the latest bytes of every artifact it registered."""
    artifacts = {}
    for ref in result.artifacts:
        _version, data = agent.artifact(user_id, scope, ref.name, ref.version)
        artifacts[ref.name] = data
    error = None if result.error is None else f"{result.error.name}: {result.error.value}"
    return Outcome(status=result.status, summary=result.summary, error=error, artifacts=artifacts)


def run_task(
    agent: AlphaAgent, task: Task, *, user_id: str, conversation_id: str, examples: Path = EXAMPLES_DIR
) -> TaskReport:
    """Run ``task`` as one turn of ``agent`` (which has the coder) in a new conversation and
    score it. ``examples`` must be inside the agent's ``file`` connector roots."""
    scope = ConversationScope(conversation_id=conversation_id)
    started = time.monotonic()
    try:
        result = agent.run_analysis(task.spec(conversation_id, user_id, examples))
    except AlphaAgentError as exc:
        verdict = Verdict(False, f"refused: {type(exc).__name__}: {exc}"[:300])
        return TaskReport(task.name, False, verdict.detail, None, 0, None, None, None, None, 0.0)
    wall_s = time.monotonic() - started
    verdict = score(task, outcome_of(agent, user_id, scope, result))
    usage: dict[str, Any] = {}
    try:
        raw = agent.read_file(user_id, scope, f"work/turns/{result.turn_id}/usage.json")
        usage = json.loads(raw)
    except (NotFoundError, FileNotFoundError, ValueError):
        pass
    tokens_in = usage.get("input_tokens")
    if tokens_in is not None:
        tokens_in += usage.get("cache_read_input_tokens", 0) + usage.get("cache_creation_input_tokens", 0)
    return TaskReport(
        task=task.name,
        passed=verdict.passed,
        detail=verdict.detail,
        turn_id=result.turn_id,
        runs=len(result.run_ids),
        model_turns=usage.get("model_turns"),
        input_tokens=tokens_in,
        output_tokens=usage.get("output_tokens"),
        cost_usd=usage.get("cost_usd"),
        wall_s=wall_s,
    )
