"""The workspace viewer in a real browser: headless Chromium (Debian's ``chromium``) driven by
Playwright loads the pages of a conversation made by a real turn, and sees what a person would.

The turn's pinned steps write a CSV dataset, a PNG chart, an SVG that carries script, a Markdown
report with raw HTML in it, and a file named ``<img src=x onerror=alert(1)>.csv``; the pages must show
the chart (decoded: natural size non-zero), the table, the report, and the hostile name as text, with
no dialog opened and no CSP violation. A screenshot of the conversation page is kept under
``test-artifacts/`` (gitignored; CI keeps it as the run's artifact).

Chromium is installed by ``make test`` where it runs as root (``make browser-deps``, as CI does).
These tests skip only when it is missing and we are not root; under ``CI=true`` they fail instead.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from assertions import assert_status
from viewer_data import Home

from alphaagent.api import AlphaAgent
from alphaagent.models.common import ConversationScope
from alphaagent.viewer.serve import bind, local_reader

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
USER = "viewer-test"
TOKEN = "browser-token-" + "z" * 30
HOSTILE = "<img src=x onerror=alert(1)>.csv"
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

STEP_DATA = r"""
import csv
rows = [("north", 120.5), ("south", 80.25), ("east", 99.0), ("west", 61.75)]
rows += [(f"region-{i:03d}", float(i)) for i in range(70)]
with open("datasets/revenue.csv", "w", newline="") as out:
    writer = csv.writer(out)
    writer.writerow(["region", "revenue"])
    writer.writerows(rows)
open("datasets/<img src=x onerror=alert(1)>.csv", "w").write("a,b\n1,2\n")
print("x" * 40_000)  # over the 16 KiB history cap: stored truncated, spilled in full
"""
STEP_CHART = r"""
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(5, 3))
ax.bar(["north", "south", "east", "west"], [120.5, 80.25, 99.0, 61.75], color="#2755c9")
ax.set_title("Revenue by region")
fig.savefig("charts/revenue.png", dpi=100, bbox_inches="tight")
open("charts/vector.svg", "w").write(
    '<svg xmlns="http://www.w3.org/2000/svg" onload="alert(5)"><script>alert(6)</script>'
    '<rect width="10" height="10"/></svg>'
)
print("charts written")
"""
STEP_REPORT = r"""
lines = [
    "# Revenue by region",
    "",
    "North leads with **120.5**; west trails at 61.75.",
    "",
    "| region | revenue |",
    "|---|---|",
    "| north | 120.5 |",
    "| west | 61.75 |",
    "",
    "![Revenue by region](../charts/revenue.png)",
    "",
    "<script>alert(2)</script><img src=x onerror=alert(3)><a href=\"javascript:alert(4)\">a link</a>",
    "",
]
open("reports/summary.md", "w").write("\n".join(lines))
print("report written")
"""


def _spec(conversation_id: str) -> dict[str, Any]:
    return {
        "spec_version": 1,
        "user_id": USER,
        "scope": {"conversation_id": conversation_id},
        "goal": "Revenue by region, with a <b>chart</b> and a report",
        "outputs": [
            {"kind": "dataset", "name": "revenue", "path": "datasets/revenue.csv"},
            {"kind": "chart", "name": "revenue-chart", "path": "charts/revenue.png"},
            {"kind": "chart", "name": "vector", "path": "charts/vector.svg"},
            {"kind": "report", "name": "summary", "path": "reports/summary.md"},
        ],
        "steps": [
            {"title": "write the dataset", "code": STEP_DATA},
            {"title": "draw the charts", "code": STEP_CHART},
            {"title": "write the report", "code": STEP_REPORT},
        ],
        "constraints": {"max_runs": 5, "run_timeout_s": 120, "turn_timeout_s": 300},
    }


def _need_chromium() -> None:
    missing = [what for what, ok in (("/usr/bin/chromium", CHROMIUM.exists()),) if not ok]
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package (the dev extra)")
    if not missing:
        return
    why = f"the browser tests need {', '.join(missing)}: `make browser-deps` installs chromium as root"
    if os.environ.get("CI") == "true" or os.geteuid() == 0:
        pytest.fail(why)
    pytest.skip(why)


@dataclass
class Viewer:
    url: str
    home: Path
    conversation: str
    agent: AlphaAgent


@pytest.fixture(scope="module")
def viewer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Viewer]:
    """A real turn in a fresh data directory, and the viewer serving it on a free loopback port."""
    _need_chromium()
    import uvicorn

    from alphaagent.viewer.app import create_app

    home = tmp_path_factory.mktemp("viewer") / "home"
    conversation = "revenue-demo"
    agent = AlphaAgent(home)
    result = agent.run_analysis(_spec(conversation))
    assert_status(result, "completed", result.model_dump_json(indent=2))
    listener = bind("127.0.0.1", 0)
    port = listener.getsockname()[1]
    app = create_app(local_reader(home, USER), token=TOKEN, cookie_name=f"alphaagent_viewer_{port}")
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the viewer did not start within 30 s"
        time.sleep(0.05)
    try:
        yield Viewer(f"http://127.0.0.1:{port}", home, conversation, agent)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        listener.close()
        agent.close()


@pytest.fixture(scope="module")
def browser(viewer: Viewer) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=LAUNCH_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@dataclass
class Page:
    page: Any
    dialogs: list[str]

    def violations(self) -> list[str]:
        return list(self.page.evaluate("window.__cspViolations || []"))


@pytest.fixture
def page(browser: Any, viewer: Viewer) -> Iterator[Page]:
    """A fresh context (no cookie yet) that records every dialog and every CSP violation."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.add_init_script(
        "window.__cspViolations = [];"
        "document.addEventListener('securitypolicyviolation',"
        " e => window.__cspViolations.push(e.violatedDirective + ' ' + e.blockedURI));"
    )
    opened = context.new_page()
    dialogs: list[str] = []

    def on_dialog(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    opened.on("dialog", on_dialog)
    opened.goto(f"{viewer.url}/?token={TOKEN}")
    try:
        yield Page(opened, dialogs)
    finally:
        context.close()


def test_the_conversation_page_shows_the_chart_table_report_and_the_hostile_name_as_text(
    page: Page, viewer: Viewer
) -> None:
    # Given the front page (the token traded for a cookie, and gone from the address bar)
    p = page.page
    assert "token=" not in p.url
    # When the conversation is opened from the list
    p.get_by_role("link", name=viewer.conversation).click()
    p.wait_for_load_state("load")
    # Then the chart is decoded and drawn
    chart = p.locator("section.artifact img.chart").first
    chart.wait_for()
    assert chart.evaluate("img => img.complete && img.naturalWidth > 0 && img.naturalHeight > 0")
    # And the dataset's first rows are a table
    cells = p.locator("table.dataset").first.locator("tbody td").all_inner_texts()
    assert cells[:4] == ["north", "120.5", "south", "80.25"]
    # And the report is rendered (a heading, bold, a table) with its image drawn
    report = p.locator("article.report")
    assert report.locator("h1").inner_text() == "Revenue by region"
    assert report.locator("strong").inner_text() == "120.5"
    assert report.get_by_role("img", name="Revenue by region").evaluate("img => img.naturalWidth > 0")
    # And the hostile file name is shown as text: no element was made of it, no script ran
    assert p.get_by_text(HOSTILE, exact=True).count() == 1
    assert p.locator('img[src="x"]').count() == 0
    assert p.locator("script:not([src])").count() == 0
    assert page.dialogs == []
    assert page.violations() == []
    # And the page is kept as a screenshot (a test artifact)
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "viewer-conversation.png"
    p.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes().startswith(b"\x89PNG")


def test_a_dataset_pages_through_its_rows_and_the_run_history_links_the_spill(
    page: Page, viewer: Viewer
) -> None:
    p = page.page
    p.goto(f"{viewer.url}/c/{viewer.conversation}/artifacts/revenue/1")
    assert p.locator("table.dataset tbody tr").count() == 50
    p.get_by_role("link", name="next page ›").click()
    p.wait_for_load_state("load")
    rows = p.locator("table.dataset tbody tr")
    assert rows.count() == 24 and rows.first.locator("td").first.inner_text() == "region-046"
    # The run history shows the truncated output's marker and opens the full spill as text
    p.goto(f"{viewer.url}/c/{viewer.conversation}/runs")
    marker = p.locator("p.marker", has_text="stdout truncated").first
    assert "40001 bytes in all" in marker.inner_text()
    marker.get_by_role("link").click()
    p.wait_for_load_state("load")
    assert p.locator("body").inner_text().startswith("x" * 100)
    assert page.dialogs == [] and page.violations() == []


def test_svg_with_script_opens_sandboxed_and_runs_nothing(page: Page, viewer: Viewer) -> None:
    p = page.page
    p.goto(f"{viewer.url}/c/{viewer.conversation}/")
    assert p.locator('img[src*="vector"]').count() == 0  # never inline in the app's origin
    with p.context.expect_page() as opened:
        p.get_by_role("link", name="open it sandboxed").first.click()
    svg = opened.value
    svg.on("dialog", lambda dialog: (page.dialogs.append(dialog.message), dialog.dismiss()))
    svg.wait_for_load_state("load")
    time.sleep(0.3)  # onload handlers would have run by now
    assert page.dialogs == []


def test_a_running_turns_page_adds_each_run_as_it_is_recorded_then_shows_the_end(
    page: Page, viewer: Viewer
) -> None:
    # Given a turn that is still running in the conversation (recorded as the turn driver does)
    home = Home(viewer.agent.store, viewer.agent.workspace)
    scope = ConversationScope(conversation_id=viewer.conversation)
    turn = home.turn(scope, status="running", user=USER)
    p = page.page
    p.goto(f"{viewer.url}/c/{viewer.conversation}/turns/{turn.turn_id}")
    assert p.locator("section.run").count() == 0
    # When a run is recorded, the page shows it without a reload
    home.run(scope, turn, stdout="live output <b>not bold</b>\n")
    output = p.locator("section.run pre.stdout")
    output.wait_for(timeout=15_000)
    assert output.inner_text().rstrip("\n") == "live output <b>not bold</b>"
    # And when the turn ends, the page shows its end
    home.finish(turn, "completed")
    p.locator("#turn-status .status-completed").wait_for(timeout=15_000)
    assert p.locator("section.run").count() == 1
    assert page.dialogs == [] and page.violations() == []


def test_without_the_token_the_browser_gets_401(browser: Any, viewer: Viewer) -> None:
    context = browser.new_context()
    try:
        response = context.new_page().goto(f"{viewer.url}/c/{viewer.conversation}/")
        assert response is not None and response.status == 401
    finally:
        context.close()
