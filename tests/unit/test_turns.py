"""The turn driver on the local backend (issue 3, items 7-9 and Bad input).

Steps driver, run history, artifacts, inputs, bad specs, concurrency, idempotency (IDEM-01), a
crashed turn, and the workspace export through the CLI (ZIP-01). One ``AlphaAgent`` in a temporary
home serves the whole module (a sandbox start costs ~1.5 s); every test works in its own
conversation. Specs are tiny: one or two short steps.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
import re
import signal
import sqlite3
import stat
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from assertions import assert_status
from cli_runner import run_cli
from sandboxes import register_light

from alphaagent.api import AlphaAgent
from alphaagent.domain.artifacts import MAX_XLSX_UNPACKED_BYTES
from alphaagent.domain.backend import ConnectorSettings, TurnSettings
from alphaagent.domain.tools import TurnContext, register_artifact, run_in_env
from alphaagent.errors import ArtifactError, InvalidSpecError, NotFoundError, ScopeBusyError
from alphaagent.ids import new_ulid
from alphaagent.models.common import ConversationScope, utcnow
from alphaagent.models.records import TurnResult
from alphaagent.models.spec import parse_spec

USER = "analyst@example.com"
CONNECTOR_CAP_BYTES = 4096
CONNECTOR_TIMEOUT_S = 0.5
HISTORY_CAP_BYTES = 16 * 1024
MiB = 2**20
MARKER = re.compile(r"\[\.\.\. truncated: \d+ bytes omitted, kept \d+ of \d+ bytes \.\.\.\]")


# ----------------------------------------------------------------------------- fixtures and helpers


class ScriptedCoder:
    """A fake of the ``Coder`` protocol: a spec without steps runs the test's script on the turn's
    context, so a test can call the very tool functions the model would call."""

    def __init__(self) -> None:
        self.script: Callable[[TurnContext], str] | None = None

    def __call__(self, ctx: TurnContext) -> str:
        assert self.script is not None, "this test set no coder script"
        return self.script(ctx)


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A directory the file connector may read, and one it may not."""
    allowed = tmp_path_factory.mktemp("connector-root")
    outside = tmp_path_factory.mktemp("outside")
    (allowed / "penguins.csv").write_text("species,mass\nAdelie,3700\nGentoo,5076\n")
    (allowed / "huge.csv").write_bytes(b"x" * (CONNECTOR_CAP_BYTES + 1))
    (outside / "secret.csv").write_text("password\nhunter2\n")
    (allowed / "escape.csv").symlink_to(outside / "secret.csv")
    return {"allowed": allowed, "outside": outside}


@pytest.fixture(scope="module")
def coder() -> ScriptedCoder:
    return ScriptedCoder()


@pytest.fixture(scope="module")
def agent(
    tmp_path_factory: pytest.TempPathFactory, roots: dict[str, Path], coder: ScriptedCoder
) -> Iterator[AlphaAgent]:
    home = tmp_path_factory.mktemp("home")
    with AlphaAgent(
        home,
        connectors=ConnectorSettings(
            file_roots=(roots["allowed"],),
            http_hosts=("127.0.0.1",),
            max_bytes=CONNECTOR_CAP_BYTES,
            timeout_s=CONNECTOR_TIMEOUT_S,
        ),
        turns=TurnSettings(lock_wait_s=30),
        coder=coder,
    ) as shared:
        yield shared


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/slow.csv":
            time.sleep(CONNECTOR_TIMEOUT_S * 4)
        body = {
            "/rates.csv": b"currency,rate\nEUR,1.08\n",
            "/huge.csv": b"y" * (CONNECTOR_CAP_BYTES + 1),
            "/slow.csv": b"late\n",
        }.get(self.path)
        with contextlib.suppress(OSError):  # the client of /slow.csv has given up already
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/csv")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def http_base() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def _conversation() -> str:
    """A fresh conversation id per test (tests share one home)."""
    return "c-" + new_ulid().lower()


def _spec(conversation: str, *steps: str, **fields: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "spec_version": 1,
        "user_id": USER,
        "scope": {"conversation_id": conversation},
        "goal": "test the turn driver",
    }
    if steps:
        spec["steps"] = [{"title": f"step {i}", "code": code} for i, code in enumerate(steps, start=1)]
    spec.update(fields)
    return spec


def _scope(spec: dict[str, Any]) -> ConversationScope:
    return ConversationScope(conversation_id=spec["scope"]["conversation_id"])


def _store_dump(agent: AlphaAgent) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of the store: none where the store was never created (it is created on
    its first write, so a module whose earlier tests did not run yet has no file)."""
    if not Path(agent.store.path).exists():
        return {}
    with contextlib.closing(sqlite3.connect(f"file:{agent.store.path}?mode=ro", uri=True)) as db:
        tables = [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {table: db.execute(f"SELECT * FROM {table} ORDER BY rowid").fetchall() for table in tables}


def _tree(home: Path) -> dict[str, tuple[int, int]]:
    """Every entry under the home (database files aside): its type and, for a file, its size."""
    entries: dict[str, tuple[int, int]] = {}
    if not home.exists():
        return entries
    for dirpath, dirnames, filenames in os.walk(home):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(home).as_posix()
            if rel.startswith("alphaagent.db"):
                continue
            info = path.lstat()
            entries[rel] = (stat.S_IFMT(info.st_mode), 0 if stat.S_ISDIR(info.st_mode) else info.st_size)
    return entries


def _left_behind(
    agent: AlphaAgent, records: dict[str, list[tuple[Any, ...]]], files: dict[str, tuple[int, int]]
) -> dict[str, Any]:
    """What changed since ``records`` and ``files`` were taken: new or changed rows per table, new
    or changed paths under the home."""
    now_records, now_files = _store_dump(agent), _tree(agent.home)
    changed: dict[str, Any] = {}
    for table, rows in now_records.items():
        new_rows = [row for row in rows if row not in records.get(table, [])]
        if new_rows or len(rows) != len(records.get(table, [])):
            changed[table] = new_rows or f"{len(records.get(table, []))} rows, now {len(rows)}"
    paths = sorted(path for path, entry in now_files.items() if files.get(path) != entry)
    paths += sorted(f"removed {path}" for path in files if path not in now_files)
    if paths:
        changed["files"] = paths
    return changed


def _turn_events(agent: AlphaAgent, turn_id: str) -> list[str]:
    return [event.detail_type for event in agent.store.list_events(turn_id)]


def _interval(agent: AlphaAgent, conversation: str, label: str) -> tuple[float, float]:
    raw = agent.read_file(USER, ConversationScope(conversation_id=conversation), f"work/interval-{label}.txt")
    start, end = raw.decode().split()
    return float(start), float(end)


def _timed_step(label: str, seconds: float) -> str:
    """A step that records when it started and ended (wall clock) in ``work/interval-{label}.txt``."""
    return (
        "import time\n"
        f"start = time.time(); time.sleep({seconds}); end = time.time()\n"
        f"open('work/interval-{label}.txt', 'w').write(f'{{start}} {{end}}')\n"
    )


def _run_in_threads(agent: AlphaAgent, specs: list[dict[str, Any]]) -> list[TurnResult | BaseException]:
    """Start every spec at the same moment, each from its own thread; results in order."""
    outcomes: list[TurnResult | BaseException] = [RuntimeError("did not finish")] * len(specs)
    barrier = threading.Barrier(len(specs))

    def submit(index: int) -> None:
        barrier.wait()
        try:
            outcomes[index] = agent.run_analysis(specs[index])
        except BaseException as exc:
            outcomes[index] = exc

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(len(specs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return outcomes


def _cli(*args: str, home: Path, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_CODE_"))}
    env.update({"ALPHAAGENT_HOME": str(home), **extra_env})
    return run_cli(args, env=env, text=True, timeout=120)


# ----------------------------------------------------------------------------- steps driver (item 7)


@pytest.fixture(scope="module")
def two_step_turn(agent: AlphaAgent) -> tuple[dict[str, Any], TurnResult]:
    """A completed turn: step 1 writes a file, step 2 builds on it; three outputs declared, two
    without a path."""
    spec = _spec(
        _conversation(),
        "open('work/first.txt', 'w').write('from step 1')\n"
        "open('datasets/sales.csv', 'w').write('region,revenue\\nnorth,10\\nsouth,20\\n')\n",
        "seen = open('work/first.txt').read()\n"
        "open('reports/summary.md', 'w').write(f'# Summary\\n{seen}, then step 2\\n')\n"
        "open('charts/revenue.svg', 'w').write('<svg xmlns=\"http://www.w3.org/2000/svg\"/>')\n",
        outputs=[
            {"kind": "dataset", "name": "sales", "path": "datasets/sales.csv", "description": "by region"},
            {"kind": "report", "name": "summary"},
            {"kind": "chart", "name": "revenue"},
        ],
    )
    return spec, agent.run_analysis(spec)


def test_steps_run_in_order_and_later_steps_see_earlier_files(
    agent: AlphaAgent, two_step_turn: tuple[dict[str, Any], TurnResult]
) -> None:
    # Given a turn whose second step reads what the first wrote (see the fixture)
    spec, result = two_step_turn
    # Then the turn completed with one run per step, in order
    assert_status(result, "completed")
    runs = agent.history(USER, _scope(spec))
    assert [run.run_id for run in runs] == result.run_ids and len(runs) == 2
    assert [run.code for run in runs] == [step["code"] for step in spec["steps"]]
    # And the second step saw the first step's file
    assert (
        agent.read_file(USER, _scope(spec), "reports/summary.md") == b"# Summary\nfrom step 1, then step 2\n"
    )


def test_every_declared_output_is_registered_with_or_without_a_path(
    agent: AlphaAgent, two_step_turn: tuple[dict[str, Any], TurnResult]
) -> None:
    # Given the completed two-step turn
    spec, result = two_step_turn
    # Then each declared output is version 1 of an artifact; without a path, the single NAME.* file
    # in the kind's folder was found
    assert [(a.kind, a.name, a.version, a.path) for a in result.artifacts] == [
        ("dataset", "sales", 1, "datasets/sales.csv"),
        ("report", "summary", 1, "reports/summary.md"),
        ("chart", "revenue", 1, "charts/revenue.svg"),
    ]
    stored = {v.name: v for v in agent.artifacts(USER, _scope(spec))}
    assert stored["sales"].description == "by region"
    version, data = agent.artifact(USER, _scope(spec), "summary")
    assert data == b"# Summary\nfrom step 1, then step 2\n"
    assert version.sha256 == hashlib.sha256(data).hexdigest() and version.size_bytes == len(data)


def test_result_json_and_spec_are_written_into_the_scope(
    agent: AlphaAgent, two_step_turn: tuple[dict[str, Any], TurnResult]
) -> None:
    # Given the completed two-step turn
    spec, result = two_step_turn
    scope = _scope(spec)
    # Then work/turns/{turn_id}/result.json holds the turn's result
    written = json.loads(agent.read_file(USER, scope, f"work/turns/{result.turn_id}/result.json"))
    assert written == result.model_dump(mode="json")
    # And spec/{turn_id}.json holds the spec, with the turn id it was given
    saved = parse_spec(agent.read_file(USER, scope, f"spec/{result.turn_id}.json"))
    assert saved.turn_id == result.turn_id
    assert saved.model_dump(exclude={"turn_id"}) == parse_spec(json.dumps(spec)).model_dump(
        exclude={"turn_id"}
    )
    # And the turn record agrees
    (turn,) = agent.turns(USER, scope)
    assert_status(turn, "completed")
    assert turn.result == result and turn.finished_at is not None


def test_events_of_a_completed_turn_come_in_order(
    agent: AlphaAgent, two_step_turn: tuple[dict[str, Any], TurnResult]
) -> None:
    # Given the completed two-step turn
    _, result = two_step_turn
    # When its events are read back from the store's log
    lifecycle = [
        kind
        for kind in _turn_events(agent, result.turn_id)
        if kind in ("TurnStarted", "RunCompleted", "ArtifactRegistered", "TurnCompleted", "TurnFailed")
    ]
    # Then they are TurnStarted, the runs, the registrations, TurnCompleted
    assert lifecycle == [
        "TurnStarted",
        "RunCompleted",
        "RunCompleted",
        "ArtifactRegistered",
        "ArtifactRegistered",
        "ArtifactRegistered",
        "TurnCompleted",
    ]


def test_a_failing_step_fails_the_turn_with_its_error_and_later_steps_do_not_run(agent: AlphaAgent) -> None:
    # Given three steps, the second of which raises from a function of its own
    spec = _spec(
        _conversation(),
        "open('work/one.txt', 'w').write('1')",
        "def load(region):\n    raise ValueError(f'no data for {region}')\n\nload('north')\n",
        "open('work/three.txt', 'w').write('3')",
        outputs=[{"kind": "report", "name": "never", "path": "reports/never.md"}],
    )
    spec["steps"][1]["title"] = "load the regions"
    # When the turn runs
    result = agent.run_analysis(spec)
    # Then it failed with that step's error: name, value and a traceback of the user's frames
    assert_status(result, "failed")
    assert result.failed_step == "load the regions"
    assert result.error is not None
    assert (result.error.name, result.error.value) == ("ValueError", "no data for north")
    assert "in load" in result.error.traceback and "load('north')" in result.error.traceback
    assert "zygote" not in result.error.traceback and "alphaagent" not in result.error.traceback
    # And the third step never ran
    scope = _scope(spec)
    assert len(result.run_ids) == 2
    assert "work/three.txt" not in {f.path for f in agent.files(USER, scope)}
    assert agent.artifacts(USER, scope) == []
    # And the failure is on record: result.json, the turn record, and TurnFailed last in the log
    written = json.loads(agent.read_file(USER, scope, f"work/turns/{result.turn_id}/result.json"))
    assert_status(written, "failed")
    assert written["failed_step"] == "load the regions"
    assert [t.status for t in agent.turns(USER, scope)] == ["failed"]
    events = _turn_events(agent, result.turn_id)
    assert events[-1] == "TurnFailed" and "TurnCompleted" not in events
    assert events.count("RunCompleted") == 2


def test_an_output_without_path_needs_exactly_one_matching_file(agent: AlphaAgent) -> None:
    # Given a step that leaves two files named summary.* in reports/ and an output without a path
    spec = _spec(
        _conversation(),
        "open('reports/summary.md', 'w').write('a')\nopen('reports/summary.txt', 'w').write('b')",
        outputs=[{"kind": "report", "name": "summary"}],
    )
    # When the turn runs
    result = agent.run_analysis(spec)
    # Then it fails naming the output and both candidates, and registers nothing
    assert_status(result, "failed")
    assert result.error is not None
    assert result.failed_step == "outputs[0]" and result.error.value.startswith("path: not given")
    assert "reports/summary.md" in result.error.value and "reports/summary.txt" in result.error.value
    assert agent.artifacts(USER, _scope(spec)) == []


def test_max_runs_is_enforced(agent: AlphaAgent) -> None:
    # Given two steps and a budget of one run
    spec = _spec(
        _conversation(),
        "open('work/one.txt', 'w').write('1')",
        "open('work/two.txt', 'w').write('2')",
        constraints={"max_runs": 1},
    )
    # When the turn is run
    with pytest.raises(InvalidSpecError) as raised:
        agent.run_analysis(spec)
    # Then it is refused before any code, naming the budget (issue 14: checks that need no code
    # come first); nothing ran and nothing was written
    assert str(raised.value).startswith("constraints.max_runs: 1 is fewer than the 2 steps")
    with pytest.raises(NotFoundError):
        agent.history(USER, _scope(spec))


# ----------------------------------------------------------------------------- run history (item 8)


def test_a_100_kb_output_is_stored_truncated_with_the_full_output_in_a_spill_file(agent: AlphaAgent) -> None:
    # Given a step printing 100,001 bytes of two-byte characters
    spec = _spec(_conversation(), "print('é' * 50_000)")
    # When the turn runs
    result = agent.run_analysis(spec)
    assert_status(result, "completed")
    # Then its run record keeps at most 16 KiB of UTF-8, with the marker and the true byte count
    (run,) = agent.history(USER, _scope(spec))
    assert run == agent.run_record(USER, result.run_ids[0])
    assert len(run.stdout.encode("utf-8")) <= HISTORY_CAP_BYTES
    assert MARKER.search(run.stdout), run.stdout[:200]
    assert run.stdout_truncated and run.stdout_bytes == 100_001
    assert run.stdout.startswith("éééé") and run.stdout.rstrip("\n").endswith("éééé")
    # And the spill file it names holds the whole output
    assert run.stdout_path == f"work/runs/{run.run_id}/stdout.txt"
    assert agent.read_file(USER, _scope(spec), run.stdout_path) == ("é" * 50_000 + "\n").encode()


# ----------------------------------------------------------------------------- artifacts (item 9)


def _xlsx_bytes(filler_rows: int = 0) -> bytes:
    """A minimal workbook (region, revenue; two rows, then ``filler_rows`` identical rows of one
    cell), built with the standard library only."""
    main = "http://schemas.openxmlformats.org"
    parts = {
        "[Content_Types].xml": (
            f'<Types xmlns="{main}/package/2006/content-types">'
            '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
            '<Default Extension="xml" ContentType="application/xml"/>'
            '<Override PartName="/xl/workbook.xml" ContentType="application/vnd.openxmlformats-officedocument'
            '.spreadsheetml.sheet.main+xml"/>'
            '<Override PartName="/xl/worksheets/sheet1.xml" ContentType="application/vnd.openxmlformats'
            '-officedocument.spreadsheetml.worksheet+xml"/></Types>'
        ),
        "_rels/.rels": (
            f'<Relationships xmlns="{main}/package/2006/relationships"><Relationship Id="rId1" '
            f'Type="{main}/officeDocument/2006/relationships/officeDocument" Target="xl/workbook.xml"/>'
            "</Relationships>"
        ),
        "xl/workbook.xml": (
            f'<workbook xmlns="{main}/spreadsheetml/2006/main" '
            f'xmlns:r="{main}/officeDocument/2006/relationships">'
            '<sheets><sheet name="Sheet1" sheetId="1" r:id="rId1"/></sheets></workbook>'
        ),
        "xl/_rels/workbook.xml.rels": (
            f'<Relationships xmlns="{main}/package/2006/relationships"><Relationship Id="rId1" '
            f'Type="{main}/officeDocument/2006/relationships/worksheet" Target="worksheets/sheet1.xml"/>'
            "</Relationships>"
        ),
        "xl/worksheets/sheet1.xml": (
            f'<worksheet xmlns="{main}/spreadsheetml/2006/main"><sheetData>'
            '<row r="1"><c r="A1" t="inlineStr"><is><t>region</t></is></c>'
            '<c r="B1" t="inlineStr"><is><t>revenue</t></is></c></row>'
            '<row r="2"><c r="A2" t="inlineStr"><is><t>north</t></is></c><c r="B2"><v>10</v></c></row>'
            '<row r="3"><c r="A3" t="inlineStr"><is><t>south</t></is></c><c r="B3"><v>20</v></c></row>'
            + '<row><c t="inlineStr"><is><t>filler</t></is></c></row>' * filler_rows
            + "</sheetData></worksheet>"
        ),
    }
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, text in parts.items():
            archive.writestr(name, '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>' + text)
    return buffer.getvalue()


KIND_FILES = [
    ("dataset", "datasets/sales.csv"),
    ("dataset", "datasets/sales.parquet"),
    ("dataset", "datasets/sales.json"),
    ("dataset", "datasets/sales.xlsx"),
    ("chart", "charts/revenue.png"),
    ("chart", "charts/revenue.svg"),
    ("chart", "charts/revenue.jpg"),
    ("chart", "charts/revenue.html"),
    ("report", "reports/summary.md"),
    ("report", "reports/summary.html"),
    ("report", "reports/summary.pdf"),
    ("report", "reports/summary.txt"),
]


@pytest.fixture(scope="module")
def every_file_type(agent: AlphaAgent) -> tuple[dict[str, Any], TurnResult]:
    """One turn writing a file of every accepted type and registering each."""
    code = (
        "import base64\nimport matplotlib.pyplot as plt\nimport pandas as pd\n"
        "frame = pd.DataFrame({'region': ['north', 'south'], 'revenue': [10, 20]})\n"
        "frame.to_csv('datasets/sales.csv', index=False)\n"
        "frame.to_parquet('datasets/sales.parquet', index=False)\n"
        "frame.to_json('datasets/sales.json', orient='records')\n"
        f"open('datasets/sales.xlsx', 'wb').write(base64.b64decode({base64.b64encode(_xlsx_bytes())!r}))\n"
        "fig, ax = plt.subplots()\nax.bar(frame['region'], frame['revenue'])\n"
        "for ext in ('png', 'svg', 'jpg'):\n    fig.savefig(f'charts/revenue.{ext}')\n"
        "fig.savefig('reports/summary.pdf')\n"
        "open('charts/revenue.html', 'w').write('<html><body>chart</body></html>')\n"
        "open('reports/summary.md', 'w').write('# Revenue\\n')\n"
        "open('reports/summary.html', 'w').write('<h1>Revenue</h1>')\n"
        "open('reports/summary.txt', 'w').write('Revenue\\n')\n"
    )
    outputs = [
        {"kind": kind, "name": path.replace("/", "-").replace("_", "-"), "path": path}
        for kind, path in KIND_FILES
    ]
    spec = _spec(_conversation(), code, outputs=outputs)
    return spec, agent.run_analysis(spec)


@pytest.mark.parametrize(("kind", "path"), KIND_FILES, ids=[path for _kind, path in KIND_FILES])
def test_every_kind_accepts_its_file_types(
    agent: AlphaAgent, every_file_type: tuple[dict[str, Any], TurnResult], kind: str, path: str
) -> None:
    # Given a turn that registered a file of every accepted type (see the fixture)
    spec, result = every_file_type
    assert_status(result, "completed")
    # Then this file is an artifact of its kind, with the file's exact bytes
    (version,) = [v for v in agent.artifacts(USER, _scope(spec)) if v.path == path]
    assert version.kind == kind and version.version == 1
    _found, data = agent.artifact(USER, _scope(spec), version.name, 1)
    assert data == agent.read_file(USER, _scope(spec), path) and len(data) > 0
    # And a dataset carries its schema, row count and first rows
    if kind == "dataset":
        assert version.metadata.get("profiled") is True, version.metadata
        assert list(version.metadata["schema"]) == ["region", "revenue"]
        assert version.metadata["row_count"] == 2
        assert version.metadata["preview"] == [
            {"region": "north", "revenue": 10},
            {"region": "south", "revenue": 20},
        ]


@pytest.mark.parametrize(
    ("code", "output", "message"),
    [
        pytest.param(
            # No path declared (a declared path of the wrong type is refused before any code)
            "open('charts/summary.md', 'w').write('x')",
            {"kind": "chart", "name": "summary"},
            "'charts/summary.md': a chart must be one of .png, .svg",
            id="wrong-type",
        ),
        pytest.param(
            "pass",
            {"kind": "report", "name": "missing", "path": "reports/missing.md"},
            "'reports/missing.md': no regular file there",
            id="missing",
        ),
        pytest.param(
            "import os\nos.makedirs('reports/folder.md')",
            {"kind": "report", "name": "folder", "path": "reports/folder.md"},
            "'reports/folder.md': no regular file there",
            id="directory",
        ),
        pytest.param(
            "import os\nos.symlink('/etc/hostname', 'reports/outside.md')",
            {"kind": "report", "name": "outside", "path": "reports/outside.md"},
            "'reports/outside.md': no regular file there",
            id="symlink-out-of-scope",
        ),
        pytest.param(
            "import os\nopen('reports/real.md', 'w').write('x')\nos.symlink('real.md', 'reports/inside.md')",
            {"kind": "report", "name": "inside", "path": "reports/inside.md"},
            "'reports/inside.md': no regular file there",
            id="symlink-inside-scope",
        ),
    ],
)
def test_a_registration_breaking_a_rule_fails_naming_the_path(
    agent: AlphaAgent, code: str, output: dict[str, Any], message: str
) -> None:
    # Given a step leaving a file that does not fit the declared output
    spec = _spec(_conversation(), code, outputs=[output])
    # When the turn runs
    result = agent.run_analysis(spec)
    # Then the turn fails with an error naming the output and the path, and nothing is registered
    assert_status(result, "failed")
    assert result.error is not None
    # (the output named once, as the failed step, which every reader shows before the error)
    assert result.failed_step == "outputs[0]", result.failed_step
    assert message in result.error.value and "outputs[0]" not in result.error.value, result.error.value
    assert agent.artifacts(USER, _scope(spec)) == []


PATH_03 = {
    "../../conv-OTHER/reports/leak.md": "report",
    "charts/../../../spec/override.json": "dataset",
    "..%2F..%2Fconv-OTHER%2Fdatasets%2Fx.csv": "dataset",
    "/etc/hosts": "report",
}


def test_register_artifact_refuses_paths_leaving_the_scope(agent: AlphaAgent, coder: ScriptedCoder) -> None:
    # Given a coder that, like a confused model, registers the PATH-03 paths (and first creates a
    # file literally named like the percent-encoded one, so "missing" cannot be the reason)
    refusals: dict[str, str | None] = {}

    def script(ctx: TurnContext) -> str:
        run_in_env(ctx, "open('..%2F..%2Fconv-OTHER%2Fdatasets%2Fx.csv', 'w').write('a\\n1\\n')")
        for path, kind in PATH_03.items():
            try:
                register_artifact(ctx, kind, path)  # type: ignore[arg-type]
                refusals[path] = None
            except ArtifactError as exc:
                refusals[path] = str(exc)
        return "tried every path"

    coder.script = script
    spec = _spec(_conversation())
    try:
        # When the turn runs
        result = agent.run_analysis(spec)
    finally:
        coder.script = None
    assert_status(result, "completed")
    # Then every registration was refused with a message naming the path and saying it must stay inside
    for path in PATH_03:
        refusal = refusals[path]
        assert refusal is not None, f"{path!r} was registered"
        assert repr(path) in refusal and "must stay inside" in refusal, refusal
    # And nothing was registered, and nothing was written next to the conversation
    assert agent.artifacts(USER, _scope(spec)) == []
    assert not (agent.home / "conversations" / "conv-OTHER").exists()


def test_artifact_versions_are_immutable(agent: AlphaAgent) -> None:
    # Given a report registered as v1, then overwritten and registered again as v2 by a second turn
    conversation = _conversation()
    output = [{"kind": "report", "name": "notes", "path": "reports/notes.md"}]
    first = agent.run_analysis(
        _spec(conversation, "open('reports/notes.md', 'w').write('first')", outputs=output)
    )
    second = agent.run_analysis(
        _spec(conversation, "open('reports/notes.md', 'w').write('second draft')", outputs=output)
    )
    assert_status(first, "completed")
    assert_status(second, "completed")
    scope = ConversationScope(conversation_id=conversation)
    # When v1 is read back
    v1, v1_bytes = agent.artifact(USER, scope, "notes", 1)
    # Then it has the original bytes and hash, though the file now holds other bytes
    assert v1_bytes == b"first" and v1.sha256 == hashlib.sha256(b"first").hexdigest()
    assert agent.read_file(USER, scope, "reports/notes.md") == b"second draft"
    # And the latest is v2, with the new bytes
    latest, latest_bytes = agent.artifact(USER, scope, "notes")
    assert latest.version == 2 and latest_bytes == b"second draft"
    assert latest.sha256 == hashlib.sha256(b"second draft").hexdigest()
    assert [(v.name, v.version) for v in agent.artifacts(USER, scope)] == [("notes", 1), ("notes", 2)]


def test_an_artifact_name_keeps_its_kind(agent: AlphaAgent) -> None:
    # Given a dataset "tiny" registered as v1
    conversation = _conversation()
    first = agent.run_analysis(
        _spec(
            conversation,
            "open('datasets/tiny.csv', 'w').write('a\\n1\\n')",
            outputs=[{"kind": "dataset", "name": "tiny", "path": "datasets/tiny.csv"}],
        )
    )
    assert_status(first, "completed")
    scope = ConversationScope(conversation_id=conversation)
    # When a later spec declares a report under the same name
    with pytest.raises(InvalidSpecError) as refused:
        agent.run_analysis(
            _spec(
                conversation,
                "open('reports/tiny.md', 'w').write('# not a dataset')",
                outputs=[{"kind": "report", "name": "tiny", "path": "reports/tiny.md"}],
            )
        )
    # Then it is refused before its code runs, naming the output and the name's kind
    assert str(refused.value) == (
        'outputs[0].name: "tiny" is already a dataset in this scope; give the report another name'
    )
    assert not (agent.home / scope.key / "reports/tiny.md").exists()
    # And a registration under that name at run time (the coder's register_artifact) is refused too
    from alphaagent.domain.artifacts import register_artifact

    agent.workspace.write_bytes(scope, "reports/tiny.md", b"# not a dataset")
    with pytest.raises(ArtifactError, match=r"^name 'tiny': already a dataset in this scope"):
        register_artifact(
            agent.store,
            agent.workspace,
            scope=scope,
            user_id=USER,
            turn_id=first.turn_id,
            kind="report",
            path="reports/tiny.md",
            name="tiny",
        )
    # And the latest "tiny" is still the dataset
    latest, _data = agent.artifact(USER, scope, "tiny")
    assert (latest.kind, latest.version) == ("dataset", 1)


def test_an_xlsx_that_unpacks_to_megabytes_is_registered_without_parsing_it(agent: AlphaAgent) -> None:
    # Given a small xlsx that unpacks to more than the profiling cap (a decompression bomb: 200,000
    # rows of one cell; built here, as pandas' to_excel took ~10 s of CPU to write as many)
    bomb = _xlsx_bytes(filler_rows=200_000)
    unpacked = sum(entry.file_size for entry in zipfile.ZipFile(io.BytesIO(bomb)).infolist())
    assert len(bomb) < 256 * 2**10 and unpacked > MAX_XLSX_UNPACKED_BYTES
    code = (
        f"import base64\nopen('datasets/bomb.xlsx', 'wb').write(base64.b64decode({base64.b64encode(bomb)!r}))\n"
        "import os; print(os.path.getsize('datasets/bomb.xlsx'))\n"
    )
    output = [{"kind": "dataset", "name": "bomb", "path": "datasets/bomb.xlsx"}]
    # When it is registered
    spec = _spec(_conversation(), code, outputs=output, constraints={"run_timeout_s": 120})
    result = agent.run_analysis(spec)
    # Then it is a dataset version without a profile, saying why, and nothing parsed it
    assert_status(result, "completed")
    [version] = [a for a in agent.artifacts(USER, _scope(spec)) if a.name == "bomb"]
    assert version.metadata == {"profiled": False, "reason": "unpacks to more than 4 MiB"}


# ----------------------------------------------------------------------------- inputs


def test_a_document_input_must_be_in_the_scope_and_is_cited(agent: AlphaAgent) -> None:
    # Given a conversation holding docs/brief.md (written by an earlier turn)
    conversation = _conversation()
    agent.run_analysis(_spec(conversation, "open('docs/brief.md', 'w').write('# Brief\\n')"))
    # When a turn takes it as an input
    spec = _spec(
        conversation,
        "print(open('docs/brief.md').read())",
        inputs=[{"kind": "document", "path": "docs/brief.md"}],
    )
    result = agent.run_analysis(spec)
    # Then the steps read it, and the turn cites it
    assert_status(result, "completed")
    assert agent.run_record(USER, result.run_ids[0]).stdout == "# Brief\n\n"
    assert [c.source for c in result.citations] == ["docs/brief.md"]


def test_a_dataset_input_is_copied_into_docs_by_version(agent: AlphaAgent) -> None:
    # Given a dataset registered twice (v1, then v2 with other bytes)
    conversation = _conversation()
    output = [{"kind": "dataset", "name": "sales", "path": "datasets/sales.csv"}]
    for rows in ("north,10", "north,10\\nsouth,20"):
        done = agent.run_analysis(
            _spec(
                conversation,
                f"open('datasets/sales.csv', 'w').write('region,revenue\\n{rows}\\n')",
                outputs=output,
            )
        )
        assert_status(done, "completed")
    # When a turn asks for v1 and for the latest
    spec = _spec(
        conversation,
        "import pandas as pd\nprint(len(pd.read_csv('docs/sales.csv')), len(pd.read_csv('docs/sales.v2.csv')))",
        inputs=[{"kind": "dataset", "name": "sales", "version": 1}, {"kind": "dataset", "name": "sales"}],
    )
    result = agent.run_analysis(spec)
    # Then both versions are in docs/ with their registered bytes, and the steps read them: the
    # first under the stable name, the second version asked for under its versioned name
    assert_status(result, "completed")
    scope = _scope(spec)
    for version, path in ((1, "docs/sales.csv"), (2, "docs/sales.v2.csv")):
        _v, data = agent.artifact(USER, scope, "sales", version)
        assert agent.read_file(USER, scope, path) == data
    assert agent.run_record(USER, result.run_ids[0]).stdout == "1 2\n"


def test_a_file_connector_copies_from_an_allowed_root(agent: AlphaAgent, roots: dict[str, Path]) -> None:
    # Given a file inside the connector's allowed root
    spec = _spec(
        _conversation(),
        "print(open('docs/penguins.csv').read().count('\\n'))",
        inputs=[
            {
                "kind": "connector",
                "connector": "file",
                "request": {"path": str(roots["allowed"] / "penguins.csv")},
            }
        ],
    )
    # When a turn takes it as an input
    result = agent.run_analysis(spec)
    # Then a copy is in docs/, the steps read it, and it is cited
    assert_status(result, "completed")
    assert (
        agent.read_file(USER, _scope(spec), "docs/penguins.csv")
        == (roots["allowed"] / "penguins.csv").read_bytes()
    )
    assert agent.run_record(USER, result.run_ids[0]).stdout == "3\n"
    assert [c.source for c in result.citations] == ["docs/penguins.csv"]


def test_an_http_connector_copies_from_an_allowed_host(agent: AlphaAgent, http_base: str) -> None:
    # Given a CSV served on 127.0.0.1, an allowed host
    spec = _spec(
        _conversation(),
        "print(open('docs/rates.csv').read().splitlines()[1])",
        inputs=[{"kind": "connector", "connector": "http", "request": {"url": f"{http_base}/rates.csv"}}],
    )
    # When a turn takes it as an input
    result = agent.run_analysis(spec)
    # Then a copy is in docs/ and the steps read it
    assert_status(result, "completed")
    assert agent.read_file(USER, _scope(spec), "docs/rates.csv") == b"currency,rate\nEUR,1.08\n"
    assert agent.run_record(USER, result.run_ids[0]).stdout == "EUR,1.08\n"


def _bad_inputs(roots: dict[str, Path], http_base: str) -> dict[str, tuple[dict[str, Any], str]]:
    port = http_base.rsplit(":", 1)[1]

    def file(path: Path) -> dict[str, Any]:
        return {"kind": "connector", "connector": "file", "request": {"path": str(path)}}

    def http(url: str) -> dict[str, Any]:
        return {"kind": "connector", "connector": "http", "request": {"url": url}}

    return {
        "missing-document": ({"kind": "document", "path": "docs/absent.md"}, "inputs[0].path"),
        "unknown-dataset": ({"kind": "dataset", "name": "nowhere"}, "inputs[0]"),
        "unknown-input-kind": ({"kind": "email", "path": "docs/x.md"}, "inputs[0]"),
        "unknown-connector": (
            {"kind": "connector", "connector": "ftp", "request": {}},
            "inputs[0].connector",
        ),
        "file-outside-roots": (file(roots["outside"] / "secret.csv"), "inputs[0].request.path"),
        "file-symlink-out-of-root": (file(roots["allowed"] / "escape.csv"), "inputs[0].request.path"),
        "file-over-cap": (file(roots["allowed"] / "huge.csv"), "inputs[0].request.path"),
        "http-host-not-allowed": (http(f"http://localhost:{port}/rates.csv"), "inputs[0].request.url"),
        "http-over-cap": (http(f"{http_base}/huge.csv"), "inputs[0].request.url"),
        "http-timeout": (http(f"{http_base}/slow.csv"), "inputs[0].request.url"),
    }


BAD_INPUTS = [
    "missing-document",
    "unknown-dataset",
    "unknown-input-kind",
    "unknown-connector",
    "file-outside-roots",
    "file-symlink-out-of-root",
    "file-over-cap",
    "http-host-not-allowed",
    "http-over-cap",
    "http-timeout",
]


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_a_bad_input_is_an_invalid_spec_and_leaves_nothing(
    agent: AlphaAgent, roots: dict[str, Path], http_base: str, case: str
) -> None:
    # Given a spec whose one input cannot be brought in
    item, field = _bad_inputs(roots, http_base)[case]
    spec = _spec(_conversation(), "print('never')", inputs=[item])
    records, files = _store_dump(agent), _tree(agent.home)
    # When it is run
    try:
        outcome: TurnResult | InvalidSpecError = agent.run_analysis(spec)
    except InvalidSpecError as exc:
        outcome = exc
    # Then it is refused with one line naming the input
    assert isinstance(outcome, InvalidSpecError), (
        f"not refused: the turn ran and ended {outcome.status}: {outcome.error}"
    )
    message = str(outcome)
    assert message.startswith(field) and "\n" not in message, message
    # And no record and no file was left: no owner, session, turn, run, artifact, event or folder
    assert _left_behind(agent, records, files) == {}


CHECKABLE_CONNECTOR_INPUTS = [
    "file-missing",
    "file-outside-roots",
    "file-symlink-out-of-root",
    "file-over-cap",
    "http-host-not-allowed",
]


@pytest.mark.parametrize("case", CHECKABLE_CONNECTOR_INPUTS)
def test_a_bad_connector_input_to_a_busy_conversation_is_refused_without_waiting_for_its_lease(
    agent: AlphaAgent, roots: dict[str, Path], http_base: str, case: str
) -> None:
    # Given a conversation that exists and whose lease another turn holds (the agent waits 30 s)
    conversation = _conversation()
    assert_status(agent.run_analysis(_spec(conversation, "print('first')")), "completed")
    scope = _scope(_spec(conversation))
    assert agent.store.acquire_lock(scope.key, "other-turn", utcnow(), 600)
    cases = {
        **_bad_inputs(roots, http_base),
        "file-missing": (
            {
                "kind": "connector",
                "connector": "file",
                "request": {"path": str(roots["allowed"] / "absent.csv")},
            },
            "inputs[0].request.path",
        ),
    }
    item, field = cases[case]
    records, files = _store_dump(agent), _tree(agent.home)
    try:
        # When a spec whose connector input cannot be brought in is sent there
        try:
            outcome: TurnResult | Exception = agent.run_analysis(
                _spec(conversation, "print('never')", inputs=[item])
            )
        except (InvalidSpecError, ScopeBusyError) as exc:
            outcome = exc
        left = _left_behind(agent, records, files)
    finally:
        agent.store.release_lock(scope.key, "other-turn")
    # Then it is refused as an invalid spec naming the input, not left to wait out the lease
    assert isinstance(outcome, InvalidSpecError), f"not refused before the lease: {outcome!r}"
    assert str(outcome).startswith(field), outcome
    # And nothing was written
    assert left == {}


# ----------------------------------------------------------------------------- bad spec input


def _bad_specs() -> dict[str, tuple[str, str, str]]:
    """name -> (spec text, what the one-line error starts with, what else it must say)."""
    base = _spec("c-bad", "print(1)")

    def text(**changes: Any) -> str:
        return json.dumps({**base, **changes})

    without_goal = {k: v for k, v in base.items() if k != "goal"}
    return {
        "malformed-json": ('{"spec_version": 1, "goal": ', "spec: not valid JSON", "line 1"),
        "not-an-object": ('["spec_version", 1]', "spec: must be a JSON object", ""),
        "over-64-kib": (text(goal="g" * 70_000), "spec: ", "64 KiB"),
        "unknown-field": (text(colour="red"), "colour: ", "unknown field (expected one of: spec_version"),
        "missing-goal": (json.dumps(without_goal), "goal: ", "required"),
        "misspelled-required-field": (
            text(outputs=[{"kind": "dataset", "nmae": "d"}]),
            "outputs[0].nmae: ",
            "unknown field (did you mean 'name'?)",
        ),
        "bad-conversation-id": (text(scope={"conversation_id": "../other"}), "scope.", "conversation_id"),
        "unknown-environment": (text(environment_id="gpu-xl"), "environment_id: ", '"gpu-xl"'),
        "input-path-leaves-scope": (
            text(inputs=[{"kind": "document", "path": "../other/docs/a.md"}]),
            "inputs[0].path: ",
            "must stay inside",
        ),
        "output-path-absolute": (
            text(outputs=[{"kind": "report", "name": "r", "path": "/etc/passwd"}]),
            "outputs[0].path: ",
            "relative",
        ),
        "output-path-climbs": (
            text(outputs=[{"kind": "dataset", "name": "d", "path": "charts/../../../spec/override.json"}]),
            "outputs[0].path: ",
            "must stay inside",
        ),
        "duplicate-output-names": (
            text(outputs=[{"kind": "report", "name": "r"}, {"kind": "chart", "name": "r"}]),
            "",
            "output names must be unique: r",
        ),
        "unknown-input-kind": (text(inputs=[{"kind": "email", "path": "x"}]), "inputs[0].kind", '"email"'),
        "unknown-connector": (
            text(inputs=[{"kind": "connector", "connector": "ftp", "request": {}}]),
            "inputs[0].connector: ",
            '"ftp"',
        ),
    }


BAD_SPECS = list(_bad_specs())
RUN_TIME_CHECKS = {"unknown-environment", "unknown-connector"}
"""Valid as JSON and as a model, refused by the backend that would run them."""


def _check_one_line(message: str, start: str, contains: str) -> None:
    assert "\n" not in message.strip() and "Traceback" not in message, message
    assert message.startswith(start) and contains in message, message


@pytest.mark.parametrize("case", BAD_SPECS)
def test_a_bad_spec_is_refused_with_one_line_naming_the_field(agent: AlphaAgent, case: str) -> None:
    # Given a bad spec
    raw, start, contains = _bad_specs()[case]
    records, files = _store_dump(agent), _tree(agent.home)
    # When it is parsed, and when it is run
    if case not in RUN_TIME_CHECKS:
        with pytest.raises(InvalidSpecError) as parsed:
            parse_spec(raw)
        _check_one_line(str(parsed.value), start, contains)
    with pytest.raises(InvalidSpecError) as ran:
        agent.run_analysis(raw)
    # Then both say, in one line, which field is wrong
    _check_one_line(str(ran.value), start, contains)
    # And nothing was written
    assert _left_behind(agent, records, files) == {}


NESTED_TYPOS = {
    "output": ({"outputs": [{"kind": "dataset", "name": "d", "pth": "a.csv"}]}, "outputs[0].pth", "path"),
    "dataset-input": (
        {"inputs": [{"kind": "dataset", "name": "d", "versoin": 2}]},
        "inputs[0].versoin",
        "version",
    ),
    "connector-input": (
        {"inputs": [{"kind": "connector", "connector": "file", "request": {}, "requets": {}}]},
        "inputs[0].requets",
        "request",
    ),
    "node-artifact-input": (
        {"inputs": [{"kind": "node_artifact", "node_id": "n", "artifact": "a", "verison": 1}]},
        "inputs[0].verison",
        "version",
    ),
    "step": ({"steps": [{"title": "t", "code": "print(1)", "cod": "x"}]}, "steps[0].cod", "code"),
    "constraints": ({"constraints": {"run_timeout": 5}}, "constraints.run_timeout", "run_timeout_s"),
    "scope": (
        {"scope": {"conversation_id": "c", "conversation": "c"}},
        "scope.conversation",
        "conversation_id",
    ),
    # The scope is a union: the typo is reported against the branch whose other keys match.
    "workflow-scope": (
        {"scope": {"workflow_execution_id": "wf-1", "nod_id": "n"}},
        "scope.nod_id",
        "node_id",
    ),
    "workflow-scope-optional": (
        {"scope": {"workflow_execution_id": "wf-1", "node_id": "n", "node": "n"}},
        "scope.node",
        "node_id",
    ),
    "conversation-scope": ({"scope": {"conversaton_id": "c"}}, "scope.conversaton_id", "conversation_id"),
}
"""A misspelled optional field in each nested model of the spec: (changes, field, its likely intent)."""


@pytest.mark.parametrize("case", sorted(NESTED_TYPOS))
def test_a_misspelled_nested_field_gets_the_same_suggestion_as_a_top_level_one(case: str) -> None:
    # Given a spec with a misspelled field inside one of its objects
    changes, field, intended = NESTED_TYPOS[case]
    raw = json.dumps({**_spec("c-bad", "print(1)"), **changes})
    # When it is parsed
    with pytest.raises(InvalidSpecError) as parsed:
        parse_spec(raw)
    # Then the one line names the field and suggests the field of that object it resembles
    _check_one_line(str(parsed.value), f"{field}: unknown field", f"(did you mean {intended!r}?)")
    assert str(parsed.value).count("unknown field") == 1, parsed.value


NO_MODEL = "no-steps-no-model"


@pytest.mark.parametrize("case", [*BAD_SPECS, NO_MODEL])
def test_the_cli_refuses_a_bad_spec_with_exit_2_and_writes_nothing(tmp_path: Path, case: str) -> None:
    # Given a bad spec file and an empty ALPHAAGENT_HOME
    if case == NO_MODEL:
        raw, start, contains = json.dumps(_spec("c-bad")), "steps: ", "ANTHROPIC_API_KEY"
    else:
        raw, start, contains = _bad_specs()[case]
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(raw)
    home = tmp_path / "home"
    # When `alphaagent run` is given it
    done = _cli("run", str(spec_file), home=home)
    # Then it exits 2 with one line on stderr naming the field, and no traceback
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    line = done.stderr.removeprefix("alphaagent: error: ")
    _check_one_line(line, start, contains)
    # And nothing was created under the home: no scope folder, no database row
    assert not [p for p in home.glob("*") if not p.name.startswith("alphaagent.db")], list(home.glob("*"))
    if (home / "alphaagent.db").exists():
        with contextlib.closing(sqlite3.connect(home / "alphaagent.db")) as db:
            tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            assert {
                t: db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in tables
            } == dict.fromkeys(tables, 0)


# ----------------------------------------------------------------------------- concurrency


def test_two_turns_on_one_conversation_never_overlap(agent: AlphaAgent) -> None:
    # Given two turns on the same conversation, each with a step of about a second
    conversation = _conversation()
    specs = [_spec(conversation, _timed_step(label, 1.0)) for label in ("a", "b")]
    # When both are started at the same moment from two threads
    outcomes = _run_in_threads(agent, specs)
    # Then both complete, one after the other: their steps' intervals do not intersect
    for outcome in outcomes:
        assert isinstance(outcome, TurnResult), outcome
        assert_status(outcome, "completed")
    (a_start, a_end), (b_start, b_end) = (
        _interval(agent, conversation, "a"),
        _interval(agent, conversation, "b"),
    )
    assert a_end <= b_start or b_end <= a_start, ((a_start, a_end), (b_start, b_end))


def test_turns_on_different_conversations_run_in_parallel(agent: AlphaAgent) -> None:
    # Given two turns on two conversations, each with a step of about a second
    conversations = [_conversation(), _conversation()]
    specs = [_spec(c, _timed_step("x", 1.0)) for c in conversations]
    # When both are started at the same moment from two threads
    outcomes = _run_in_threads(agent, specs)
    # Then both complete, and their steps ran at the same time
    for outcome in outcomes:
        assert isinstance(outcome, TurnResult), outcome
        assert_status(outcome, "completed")
    (a_start, a_end), (b_start, b_end) = (_interval(agent, c, "x") for c in conversations)
    assert a_start < b_end and b_start < a_end, ((a_start, a_end), (b_start, b_end))


# ----------------------------------------------------------------------------- idempotency (IDEM-01)


def _once_only_spec(conversation: str, turn_id: str, seconds: float = 0.0) -> dict[str, Any]:
    """IDEM-01's turn: it counts its executions, and a second execution would fail because
    reports/revenue.md exists already."""
    code = (
        "import os, time\n"
        "open('work/executions.txt', 'a').write('ran\\n')\n"
        "assert not os.path.exists('reports/revenue.md'), 'reports/revenue.md already exists'\n"
        f"time.sleep({seconds})\n"
        "open('reports/revenue.md', 'w').write('# Revenue by region\\n')\n"
    )
    return _spec(
        conversation,
        code,
        turn_id=turn_id,
        goal="revenue by region",
        outputs=[{"kind": "report", "name": "revenue", "path": "reports/revenue.md"}],
    )


def _assert_ran_once(agent: AlphaAgent, spec: dict[str, Any], result: TurnResult) -> None:
    scope = _scope(spec)
    assert agent.read_file(USER, scope, "work/executions.txt") == b"ran\n"
    (turn,) = agent.turns(USER, scope)
    assert turn.turn_id == spec["turn_id"]
    assert_status(turn, "completed")
    assert turn.result == result
    assert [(v.name, v.version) for v in agent.artifacts(USER, scope)] == [("revenue", 1)]
    assert len(agent.history(USER, scope)) == 1
    assert _turn_events(agent, spec["turn_id"]).count("TurnCompleted") == 1


def test_the_same_turn_submitted_twice_runs_once(agent: AlphaAgent) -> None:
    # Given a spec with a turn_id that has completed
    spec = _once_only_spec(_conversation(), new_ulid())
    first = agent.run_analysis(spec)
    assert_status(first, "completed")
    # When the very same spec is delivered again
    second = agent.run_analysis(spec)
    # Then the duplicate gets the first result; one turn, one run, one artifact version
    assert second == first
    _assert_ran_once(agent, spec, first)


def test_the_same_turn_submitted_concurrently_runs_once(agent: AlphaAgent) -> None:
    # Given a spec with a turn_id
    spec = _once_only_spec(_conversation(), new_ulid(), seconds=0.5)
    # When two deliveries of it start at the same moment from two threads
    outcomes = _run_in_threads(agent, [spec, spec])
    # Then one runs it; the other gets the same result, or is told to retry (a RetryableError)
    results = [o for o in outcomes if isinstance(o, TurnResult)]
    assert results, outcomes
    for result in results:
        assert_status(result, "completed")
    assert all(isinstance(o, TurnResult | ScopeBusyError) for o in outcomes), outcomes
    # And a retry after both returned gets that one result; the turn ran once
    retried = agent.run_analysis(spec)
    assert all(r == retried for r in results)
    _assert_ran_once(agent, spec, retried)


def test_a_duplicate_delivery_never_opens_the_conversation_to_another_turn(agent: AlphaAgent) -> None:
    # Given a turn delivered twice at the same moment, and another turn on the same conversation
    # submitted while the first is running
    conversation = _conversation()
    turn_id = new_ulid()
    first = _spec(conversation, _timed_step("first", 1.5), turn_id=turn_id)
    other = _spec(conversation, _timed_step("other", 0.2))
    outcomes: list[TurnResult | BaseException] = []

    def submit_other() -> None:
        time.sleep(0.5)
        outcomes.extend(_run_in_threads(agent, [other]))

    late = threading.Thread(target=submit_other)
    late.start()
    duplicates = _run_in_threads(agent, [first, first])
    late.join(timeout=60)
    # Then the other turn ran after the first, never during it
    (f_start, f_end), (o_start, o_end) = (
        _interval(agent, conversation, "first"),
        _interval(agent, conversation, "other"),
    )
    # And the first turn's record says what its caller was told: completed
    told = [o for o in duplicates if isinstance(o, TurnResult)]
    record = next(
        t for t in agent.turns(USER, ConversationScope(conversation_id=conversation)) if t.turn_id == turn_id
    )
    assert told, duplicates
    for answer in told:
        assert_status(answer, "completed")
    overlap = not (f_end <= o_start or o_end <= f_start)
    assert (overlap, record.status) == (False, "completed"), (
        f"first {f_start:.2f}-{f_end:.2f}, other {o_start:.2f}-{o_end:.2f}; the first's record: {record.result}"
    )


def test_a_turn_id_reused_for_a_different_spec_is_refused(agent: AlphaAgent, tmp_path: Path) -> None:
    # Given a turn that completed under a turn id
    spec = _once_only_spec(_conversation(), new_ulid())
    first = agent.run_analysis(spec)
    assert_status(first, "completed")
    # When a different spec (another goal; then other code) arrives under the same turn id
    for changed in ({**spec, "goal": "revenue by country"}, {**spec, "steps": [{"title": "x", "code": "1"}]}):
        with pytest.raises(InvalidSpecError) as refused:
            agent.run_analysis(changed)
        # Then it is refused, naming the field and the rule, and nothing of the first turn changes
        assert str(refused.value).startswith("turn_id: already used for a different spec"), refused.value
    _assert_ran_once(agent, spec, first)
    # And the same spec spelled differently (defaults written out, keys reordered) still replays
    spelled = {"environment_id": "builtin", **dict(reversed(list(spec.items())))}
    assert agent.run_analysis(spelled) == first
    # And the CLI answers the different spec with one line and exit 2
    spec_file = tmp_path / "changed.json"
    spec_file.write_text(json.dumps({**spec, "goal": "revenue by country"}))
    env = {**os.environ, "ALPHAAGENT_HOME": str(agent.home), "ALPHAAGENT_USER": USER}
    cli = run_cli(["run", str(spec_file)], text=True, env=env, timeout=120)
    assert cli.returncode == 2, (cli.returncode, cli.stdout, cli.stderr)
    assert "turn_id: already used for a different spec" in cli.stderr
    assert len(cli.stderr.strip().splitlines()) == 1, cli.stderr


def test_a_terminal_status_never_regresses(agent: AlphaAgent) -> None:
    # Given a turn that failed
    spec = _spec(_conversation(), "raise RuntimeError('first attempt failed')", turn_id=new_ulid())
    failed = agent.run_analysis(spec)
    assert_status(failed, "failed")
    # When the same turn is delivered again (its code unchanged, so nothing reruns)
    again = agent.run_analysis(spec)
    # Then the first outcome stands: same result, still failed, one run
    assert again == failed
    (turn,) = agent.turns(USER, _scope(spec))
    assert_status(turn, "failed")
    assert turn.result == failed
    assert len(agent.history(USER, _scope(spec))) == 1


# ----------------------------------------------------------------------------- crash


@pytest.fixture(scope="module")
def doomed_environment(agent: AlphaAgent) -> str:
    """An environment without the builtin preload, registered in the module's data directory, for
    the turns that are killed: the command that runs one starts a zygote of its own (~2 CPU-s with
    the builtin preload, ~0.2 without), and what is checked is what the kill leaves behind."""
    return register_light(agent.home)


def _start_doomed_turn(agent: AlphaAgent, tmp_path: Path, spec: dict[str, Any]) -> subprocess.Popen[bytes]:
    """``alphaagent run`` of ``spec`` in its own process group, with a 2 s lease; returns once the
    step has started (it writes work/started, then sleeps)."""
    spec_file = tmp_path / "doomed.json"
    spec_file.write_text(json.dumps(spec))
    env = {**os.environ, "ALPHAAGENT_HOME": str(agent.home), "ALPHAAGENT_LOCK_LEASE_S": "2"}
    process = subprocess.Popen(
        [sys.executable, "-m", "alphaagent.cli", "run", str(spec_file)],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    started = agent.home / "conversations" / spec["scope"]["conversation_id"] / "work" / "started"
    deadline = time.monotonic() + 60
    while not started.exists():
        assert process.poll() is None, f"the turn ended early with exit code {process.returncode}"
        assert time.monotonic() < deadline, "the step never started"
        time.sleep(0.05)
    return process


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)
    with contextlib.suppress(ProcessLookupError):
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            os.killpg(process.pid, 0)  # raises once nothing of the group is left
            time.sleep(0.05)


DOOMED_STEP = "open('reports/notes.md', 'w').write('half-way')\nopen('work/started', 'w').write('1')\nimport time\ntime.sleep(30)\n"


def test_a_killed_turn_leaves_no_half_registered_artifact_and_does_not_block_the_next(
    agent: AlphaAgent, doomed_environment: str, tmp_path: Path
) -> None:
    # Given a conversation with a registered report, and a turn killed (SIGKILL, whole process
    # group) while its step runs
    conversation = _conversation()
    output = [{"kind": "report", "name": "notes", "path": "reports/notes.md"}]
    first = agent.run_analysis(
        _spec(conversation, "open('reports/notes.md', 'w').write('v1')", outputs=output)
    )
    assert_status(first, "completed")
    doomed = _spec(
        conversation,
        DOOMED_STEP,
        turn_id=new_ulid(),
        outputs=output,
        constraints={"run_timeout_s": 40},
        environment_id=doomed_environment,
    )
    _kill_group(_start_doomed_turn(agent, tmp_path, doomed))
    killed_at = time.monotonic()
    # When the next turn on that conversation is submitted
    following = agent.run_analysis(_spec(conversation, "print('after the crash')"))
    # Then it completes once the 2 s lease has expired, well under 10 s
    assert_status(following, "completed")
    assert time.monotonic() - killed_at < 10
    # And the killed turn is recorded as failed (abandoned), not left running
    scope = ConversationScope(conversation_id=conversation)
    statuses = {t.turn_id: t for t in agent.turns(USER, scope)}
    abandoned = statuses[doomed["turn_id"]]
    assert_status(abandoned, "failed")
    assert abandoned.result is not None and abandoned.result.error is not None
    assert abandoned.result.error.name == "TurnAbandoned"
    assert _turn_events(agent, doomed["turn_id"])[-1] == "TurnFailed"
    # And every artifact version has its blob, whose bytes match its sha256
    versions = agent.artifacts(USER, scope)
    assert [(v.name, v.version) for v in versions] == [("notes", 1)]
    for version in versions:
        _found, data = agent.artifact(USER, scope, version.name, version.version)
        assert hashlib.sha256(data).hexdigest() == version.sha256 and len(data) == version.size_bytes
    for blob in (agent.home / "blobs" / "sha256").rglob("*"):
        if blob.is_file():
            assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name


def test_a_killed_turn_delivered_again_gets_an_answer_once_its_lease_expired(
    agent: AlphaAgent, doomed_environment: str, tmp_path: Path
) -> None:
    # Given a turn killed while its step runs (at-least-once delivery will hand it over again)
    conversation = _conversation()
    doomed = _spec(
        conversation,
        DOOMED_STEP,
        turn_id=new_ulid(),
        constraints={"run_timeout_s": 40},
        environment_id=doomed_environment,
    )
    _kill_group(_start_doomed_turn(agent, tmp_path, doomed))
    # When, after its 2 s lease expired, the same spec is delivered again
    time.sleep(2.5)
    try:
        outcome: TurnResult | BaseException = agent.run_analysis(doomed)
    except ScopeBusyError as exc:
        outcome = exc
    # Then the redelivery is answered with the turn's terminal outcome (abandoned), instead of being
    # told forever that the turn is still running
    assert isinstance(outcome, TurnResult), f"{type(outcome).__name__}: {outcome}"
    assert_status(outcome, "failed")
    assert outcome.error is not None and outcome.error.name == "TurnAbandoned"
    (turn,) = agent.turns(USER, ConversationScope(conversation_id=conversation))
    assert_status(turn, "failed")


# ----------------------------------------------------------------------------- export (ZIP-01)


def test_export_lists_files_over_the_ceiling_and_includes_the_rest(agent: AlphaAgent, tmp_path: Path) -> None:
    # Given a step that writes files of 30 MiB, exactly 25 MiB, 25 MiB + 1 byte, and a report
    conversation = _conversation()
    result = agent.run_analysis(
        _spec(
            conversation,
            "open('datasets/full.csv', 'wb').write(b'x' * (30 * 2**20))\n"
            "open('datasets/edge.csv', 'wb').write(b'y' * (25 * 2**20))\n"
            "open('datasets/over.csv', 'wb').write(b'z' * (25 * 2**20 + 1))\n"
            "open('reports/summary.md', 'w').write('# summary\\n')\n",
        )
    )
    assert_status(result, "completed")
    omitted = {"datasets/full.csv": 30 * MiB, "datasets/over.csv": 25 * MiB + 1}
    out = tmp_path / "out.zip"
    common = ("--user", USER, "--conversation", conversation, "-o", str(out))
    # When it is exported with the CLI
    done = _cli("export", *common, home=agent.home)
    # Then the export succeeds and prints each omitted file with its size
    assert done.returncode == 0, done.stderr
    for path, size in omitted.items():
        assert re.search(rf"omitted {re.escape(path)} \({size} bytes\)", done.stdout), done.stdout
    # And the zip holds the 25 MiB file and the report, but neither larger file
    with zipfile.ZipFile(out) as archive:
        names = set(archive.namelist())
        assert archive.getinfo("datasets/edge.csv").file_size == 25 * MiB
        assert archive.read("reports/summary.md") == b"# summary\n"
        assert not names & set(omitted)
        # And its manifest lists the omitted files with their sizes and the ceiling
        manifest = json.loads(archive.read("MANIFEST.json"))
        text = archive.read("MANIFEST.txt").decode()
    assert {o["path"]: o["size_bytes"] for o in manifest["omitted"]} == omitted
    assert all(o["max_file_bytes"] == 25 * MiB for o in manifest["omitted"])
    assert all(path in text for path in omitted)
    assert "\nomitted: 2 files\n" in text  # a count in words, not "file(s)"
    # And with --json, the response lists them too
    as_json = _cli("export", *common, "--json", home=agent.home)
    assert as_json.returncode == 0, as_json.stderr
    response = json.loads(as_json.stdout)
    assert {o["path"]: o["size_bytes"] for o in response["omitted"]} == omitted
    assert {"datasets/edge.csv", "reports/summary.md"} <= {i["path"] for i in response["included"]}
