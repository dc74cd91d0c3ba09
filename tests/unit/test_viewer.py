"""The workspace viewer (`alphaagent serve`) over HTTP, without a browser: the token, the headers,
escaping and sanitising of user content, ownership, dataset pages, the live event stream, and the
`turns` / `conversations` commands. tests/browser/ loads the same pages in Chromium."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from assertions import assert_status
from cli_runner import run_cli
from sandboxes import light_agent, register_light
from viewer_data import ALICE, BOB, CONV, HOSTILE, PNG, T0, TOKEN, Home, lay_out

from alphaagent.local.store import SqliteStore
from alphaagent.local.workspace import LocalWorkspace
from alphaagent.models.common import ConversationScope
from alphaagent.viewer.app import PAGE_CSP, create_app, tree_rows
from alphaagent.viewer.preview import dataset_page
from alphaagent.viewer.serve import local_reader

if TYPE_CHECKING:
    from starlette.testclient import TestClient


class LocalHome(Home):
    """A local data directory (SQLite + files) at ``root``."""

    def __init__(self, root: Path) -> None:
        super().__init__(SqliteStore(root / "alphaagent.db"), LocalWorkspace(root))
        self.root = root


@pytest.fixture
def home(tmp_path: Path) -> Iterator[LocalHome]:
    made = LocalHome(tmp_path / "home")
    lay_out(made)
    yield made
    made.store.close()


def client_for(root: Path, user: str = ALICE, **kwargs: Any) -> TestClient:
    from starlette.testclient import TestClient

    app = create_app(local_reader(root, user), token=TOKEN, live_poll_s=0.05, **kwargs)
    return TestClient(app, base_url="http://127.0.0.1:8765")


@pytest.fixture
def alice(home: LocalHome) -> TestClient:
    client = client_for(home.root)
    assert client.get(f"/?token={TOKEN}").status_code == 200  # sets the cookie
    return client


def test_without_the_token_every_request_is_401_and_the_token_once_sets_a_cookie(home: LocalHome) -> None:
    client = client_for(home.root)
    # Given no token, a wrong token or a wrong cookie / Then 401, for pages and files alike
    for path in ("/", "/c/sales/", "/c/sales/file/datasets/revenue.csv", "/static/viewer.css", "/nope"):
        assert client.get(path).status_code == 401
    assert client.get("/?token=wrong").status_code == 401
    client.cookies.set("alphaagent_viewer", "wrong")
    assert client.get("/").status_code == 401
    client.cookies.clear()
    # When the URL with the token is opened
    first = client.get(f"/c/sales/?token={TOKEN}&x=1", follow_redirects=False)
    # Then it redirects to the same URL without the token, setting an HttpOnly SameSite=Strict cookie
    assert first.status_code == 303
    assert first.headers["location"] == "/c/sales/?x=1"
    cookie = first.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    # And the cookie opens every page afterwards
    assert client.get("/c/sales/").status_code == 200


def test_a_host_header_other_than_the_loopback_is_refused_before_the_token_is_looked_at(
    home: LocalHome,
) -> None:
    client = client_for(home.root)
    response = client.get(f"/?token={TOKEN}", headers={"host": "attacker.example"}, follow_redirects=False)
    assert response.status_code == 400 and "set-cookie" not in response.headers


def test_the_token_redirect_never_leaves_the_viewer(home: LocalHome) -> None:
    client = client_for(home.root)
    response = client.get(f"http://127.0.0.1:8765//evil.example/?token={TOKEN}", follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/evil.example/"


def test_every_page_has_the_strict_csp_and_user_bytes_are_sandboxed(alice: TestClient) -> None:
    for path in ("/", "/c/sales/", "/c/sales/runs", "/c/sales/artifacts/revenue/1", "/c/nope/"):
        headers = alice.get(path).headers
        assert headers["content-security-policy"] == PAGE_CSP
        assert "'unsafe-inline'" not in PAGE_CSP and "script-src 'self'" in PAGE_CSP
        assert headers["x-content-type-options"] == "nosniff"
    for path in (
        "/c/sales/blob/vector/1",
        "/c/sales/file/charts/vector.svg",
        "/c/sales/blob/revenue-chart/1",
    ):
        headers = alice.get(path).headers
        assert headers["content-security-policy"].startswith("sandbox")
        assert headers["x-content-type-options"] == "nosniff"


def test_svg_is_only_a_download_or_a_sandboxed_view_and_a_png_is_an_image(alice: TestClient) -> None:
    svg = alice.get("/c/sales/blob/vector/1")
    assert svg.headers["content-type"] == "application/octet-stream"
    assert svg.headers["content-disposition"].startswith("attachment;")
    viewed = alice.get("/c/sales/blob/vector/1?view=1")
    assert viewed.headers["content-type"] == "image/svg+xml"
    assert viewed.headers["content-security-policy"].startswith("sandbox")
    page = alice.get("/c/sales/").text
    assert "<svg" not in page and 'blob/vector/1"' not in page.split("<img")[-1].split(">")[0]
    png = alice.get("/c/sales/blob/revenue-chart/1")
    assert png.headers["content-type"] == "image/png" and png.content == PNG
    # A PNG name on bytes that are not a PNG is never served as an image
    assert "image" not in alice.get("/c/sales/file/reports/summary.md").headers["content-type"]


def test_names_and_content_are_escaped_and_the_report_is_sanitised(alice: TestClient) -> None:
    page = alice.get("/c/sales/").text
    # The hostile file name is text, escaped; the goal's markup too
    assert HOSTILE not in page
    assert "&lt;img src=x onerror=alert(1)&gt;.csv" in page
    assert "revenue &lt;b&gt;by&lt;/b&gt; region" in page
    # The report is rendered, without script, handlers, javascript: links or remote images
    assert "<h1>Revenue</h1>" in page
    report = page.split('<article class="report">', 1)[1].split("</article>", 1)[0]
    assert "<script" not in report and "onerror" not in report and 'href="javascript:' not in report
    assert "tracker.example" not in report
    # And its relative image points at the scope's own file
    assert 'src="/c/sales/file/charts/revenue.png"' in report
    # The hostile file downloads under its own name, quoted
    hostile = alice.get("/c/sales/file/datasets/%3Cimg%20src%3Dx%20onerror%3Dalert%281%29%3E.csv")
    assert hostile.status_code == 200 and hostile.content == b"a,b\n1,2\n"
    assert (
        "filename*=UTF-8''%3Cimg%20src%3Dx%20onerror%3Dalert%281%29%3E.csv"
        in hostile.headers["content-disposition"]
    )


def test_the_front_page_lists_conversations_and_nodes_newest_first(alice: TestClient) -> None:
    page = alice.get("/").text
    assert page.index('href="/w/wf1/clean/"') > 0 and 'href="/c/sales/"' in page
    assert "status-failed" in page and "status-completed" in page


def test_another_users_work_is_answered_exactly_like_missing_work(home: LocalHome) -> None:
    # Given Bob's own conversation, and Bob's viewer
    home.claim(ConversationScope(conversation_id="bobs"), BOB)
    home.turn(ConversationScope(conversation_id="bobs"), user=BOB)
    bob = client_for(home.root, BOB)
    bob.get(f"/?token={TOKEN}")
    turn_id = home.store.list_turns(ALICE, CONV.key)[0].turn_id
    alices = [
        "/c/sales/",
        f"/c/sales/turns/{turn_id}",
        f"/c/sales/turns/{turn_id}/events",
        "/c/sales/runs",
        "/c/sales/artifacts/revenue/1",
        "/c/sales/blob/revenue/1",
        "/c/sales/file/datasets/revenue.csv",
        "/w/wf1/clean/",
    ]
    missing = bob.get("/c/nothing-here/")
    assert missing.status_code == 404
    # When Bob asks for each of Alice's pages / Then the same status and body as a missing one
    for path in alices:
        answer = bob.get(path)
        assert (answer.status_code, answer.content) == (404, missing.content), path
    # And Alice's own turn id under Bob's conversation is missing too; his front page lists only his
    assert bob.get(f"/c/bobs/turns/{turn_id}").content == missing.content
    front = bob.get("/").text
    assert "/c/bobs/" in front and "sales" not in front and "wf1" not in front


def test_datasets_page_through_their_rows(alice: TestClient) -> None:
    # Version 1 has 120 rows: the third page of 50 holds rows 101-120 and has no next page
    third = alice.get("/c/sales/artifacts/revenue/1?page=3").text
    assert "<td>r100</td>" in third and "<td>r119</td>" in third and "<td>r99</td>" not in third
    assert "rows 101–120 of 120" in third and "next page" not in third and "previous page" in third
    # The scope page previews the latest version (2) and lists both versions
    scope = alice.get("/c/sales/").text
    assert "<td>north</td>" in scope and "artifacts/revenue/1" in scope and "artifacts/revenue/2" in scope


def test_parquet_and_xlsx_datasets_preview_as_tables() -> None:
    import openpyxl
    import pandas as pd

    frame = pd.DataFrame({"city": [f"c{i}" for i in range(75)], "n": range(75)})
    parquet = io.BytesIO()
    frame.to_parquet(parquet)
    page = dataset_page(parquet.getvalue(), ".parquet", page=2, page_rows=50)
    assert page.columns == ["city", "n"] and page.total_rows == 75, page.note
    assert page.rows[0] == ["c50", "50"] and len(page.rows) == 25
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.append(["city", "n"])
    for i in range(3):
        sheet.append([f"x{i}", i])
    xlsx = io.BytesIO()
    book.save(xlsx)
    page = dataset_page(xlsx.getvalue(), ".xlsx")
    assert page.columns == ["city", "n"] and page.rows[2] == ["x2", "2"] and page.total_rows == 3, page.note
    broken = dataset_page(b"not a parquet file", ".parquet")
    assert broken.rows == [] and broken.note and broken.note.startswith("not previewed")


def test_a_dataset_whose_decoding_runs_out_of_time_says_so_instead_of_an_empty_table(
    alice: TestClient, home: LocalHome, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pandas as pd

    from alphaagent.domain import decoding

    # Given a parquet dataset, and a decoding budget no child can meet (as a loaded machine's was)
    parquet = io.BytesIO()
    pd.DataFrame({"city": ["north", "south"], "n": [1, 2]}).to_parquet(parquet)
    turn = home.store.list_turns(ALICE, CONV.key)[0]
    home.artifact(CONV, turn, "dataset", "cities", "datasets/cities.parquet", parquet.getvalue())
    monkeypatch.setattr(decoding, "CHILD_TIMEOUT_S", 0.001)
    # When its page is shown
    shown = alice.get("/c/sales/artifacts/cities/1")
    # Then the page says the decoding ran out of time, and shows no table (no empty one either)
    assert shown.status_code == 200
    assert "not previewed: decoding took more than 0.001 s" in shown.text
    assert '<table class="dataset"' not in shown.text and "no rows on this page" not in shown.text
    # And with the budget back, the same page is the table
    monkeypatch.setattr(decoding, "CHILD_TIMEOUT_S", 30.0)
    again = alice.get("/c/sales/artifacts/cities/1").text
    assert "<td>north</td>" in again and "not previewed" not in again


def test_the_run_history_shows_the_truncation_marker_and_links_the_full_spill(
    alice: TestClient, home: LocalHome
) -> None:
    page = alice.get("/c/sales/runs").text
    run = home.store.list_runs(ALICE, CONV.key)[0]
    assert "stdout truncated: 160000 bytes in all" in page
    spill = f"/c/sales/file/work/runs/{run.run_id}/stdout.txt?view=1"
    assert f'href="{spill}"' in page
    full = alice.get(spill)
    assert full.headers["content-type"].startswith("text/plain") and len(full.content) == 160_000
    assert full.headers["content-security-policy"].startswith("sandbox")


def _events(client: TestClient, path: str) -> list[tuple[str, dict[str, Any]]]:
    events: list[tuple[str, dict[str, Any]]] = []
    with client.stream("GET", path) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in response.iter_lines():
            if line.startswith("event:"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and name:
                events.append((name, json.loads(line.split(":", 1)[1])))
    return events


def test_a_running_turn_streams_each_run_as_it_is_recorded_then_its_end(
    alice: TestClient, home: LocalHome
) -> None:
    # Given a running turn with one run so far, and its live page
    turn = home.turn(CONV, status="running", minute=30)
    home.run(CONV, turn, stdout="first\n")
    page = alice.get(f"/c/sales/turns/{turn.turn_id}").text
    assert 'src="/static/live.js"' in page and f'data-events="/c/sales/turns/{turn.turn_id}/events"' in page

    # When a second run is recorded and the turn ends while the page listens
    def later() -> None:
        time.sleep(0.3)
        home.run(CONV, turn, stdout="second\n")
        time.sleep(0.3)
        home.finish(turn, "completed")

    writer = threading.Thread(target=later)
    writer.start()
    events = _events(alice, f"/c/sales/turns/{turn.turn_id}/events")
    writer.join()
    # Then each run arrived once, in order, with its output, and then the turn's end
    assert [(name, data.get("stdout", data.get("status"))) for name, data in events] == [
        ("run", "first\n"),
        ("run", "second\n"),
        ("turn", "completed"),
    ]


def test_the_tree_lists_each_folder_once_before_its_files() -> None:
    from alphaagent.ports import FileInfo

    files = [FileInfo(p, 1, T0) for p in ("a/b/c.txt", "a/b/d.txt", "a/e.txt", "f.txt")]
    assert [(r.depth, r.name) for r in tree_rows(files)] == [
        (0, "a/"),
        (1, "b/"),
        (2, "c.txt"),
        (2, "d.txt"),
        (1, "e.txt"),
        (0, "f.txt"),
    ]


def test_a_missing_data_directory_shows_nothing_and_creates_nothing(tmp_path: Path) -> None:
    client = client_for(tmp_path / "nowhere")
    assert client.get(f"/?token={TOKEN}").status_code == 200
    assert "No conversations yet." in client.get("/").text
    assert client.get("/c/sales/").status_code == 404
    assert not (tmp_path / "nowhere").exists()


# ----------------------------------------------------------------------------- command line


def _cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ALPHAAGENT_HOME": str(home), "ALPHAAGENT_USER": ALICE}
    return run_cli(args, env=env, text=True, timeout=120)


def test_turns_and_conversations_list_the_users_work(home: LocalHome) -> None:
    turns = _cli("turns", "--conversation", "sales", "--json", home=home.root)
    assert turns.returncode == 0, turns.stderr
    [turn] = json.loads(turns.stdout)
    assert_status(turn, "completed")
    assert turn["duration_ms"] == 12000 and turn["error"] is None
    text = _cli("turns", "--workflow", "wf1", "--node", "clean", home=home.root)
    assert "failed" in text.stdout and "! ValueError: bad <input>" in text.stdout
    listed = json.loads(_cli("conversations", "--json", home=home.root).stdout)
    assert [(c["scope_key"], c["turn_count"], c["last_status"]) for c in listed] == [
        ("workflows/wf1/nodes/clean", 1, "failed"),
        ("conversations/sales", 1, "completed"),
    ]
    assert listed[1]["scope"] == {"conversation_id": "sales"}
    # Another user's conversation is not found, exactly like a missing one
    other = _cli("turns", "--conversation", "sales", "--user", BOB, home=home.root)
    missing = _cli("turns", "--conversation", "nothing", "--user", BOB, home=home.root)
    assert (other.returncode, other.stderr.replace("sales", "X")) == (
        missing.returncode,
        missing.stderr.replace("nothing", "X"),
    )
    assert _cli("conversations", "--user", BOB, home=home.root).stdout == "no conversations\n"


def test_serve_refuses_bad_flags_in_one_line(tmp_path: Path) -> None:
    for args, field in (
        (("serve", "--port", "70000"), "--port"),
        (("serve", "--backend", "aws", "--bucket", "b"), "--table"),
        (("serve", "--backend", "aws", "--table", "t"), "--bucket"),
        (("serve", "--table", "t"), "--table"),
    ):
        done = _cli(*args, home=tmp_path / "home")
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and field in done.stderr, done.stderr
    # A port that is taken is one line too
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        done = _cli("serve", "--port", port, home=tmp_path / "home")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert not (tmp_path / "home").exists()


def test_serve_prints_a_loopback_url_with_a_fresh_token_and_refuses_requests_without_it(
    home: LocalHome,
) -> None:
    import http.cookiejar
    import re
    import select
    import urllib.error
    import urllib.request

    def start() -> tuple[subprocess.Popen[str], str, str]:
        env = {**os.environ, "ALPHAAGENT_HOME": str(home.root), "ALPHAAGENT_USER": ALICE}
        process = subprocess.Popen(
            [sys.executable, "-m", "alphaagent.cli", "serve", "--port", "0"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], 60)
        assert ready, "serve printed no URL within 60 s"
        line = process.stdout.readline()
        found = re.search(r"(http://127\.0\.0\.1:\d+)/\?token=([A-Za-z0-9_-]{43,})$", line.strip())
        assert found, line
        return process, found.group(1), found.group(2)

    first, base, token = start()
    second, _, other_token = start()
    try:
        # Given two starts / Then each has its own random token
        assert token != other_token
        # When a request comes without the token / Then 401
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{base}/c/sales/", timeout=30)
        assert refused.value.code == 401
        # When the printed URL is opened (a browser keeps the cookie) / Then the user's work shows
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        with browser.open(f"{base}/?token={token}", timeout=30) as response:
            assert response.status == 200 and 'href="/c/sales/"' in response.read().decode()
        with browser.open(f"{base}/c/sales/", timeout=30) as response:
            assert response.status == 200
    finally:
        for process in (first, second):
            process.terminate()
            process.wait(timeout=30)


def test_browsing_every_page_writes_nothing(alice: TestClient, home: LocalHome) -> None:
    import sqlite3

    def snapshot() -> tuple[list[str], list[tuple[str, int, int]]]:
        with sqlite3.connect(home.root / "alphaagent.db") as raw:
            rows = list(raw.iterdump())
        files = sorted(
            (str(path.relative_to(home.root)), path.stat().st_size, path.stat().st_mtime_ns)
            for path in home.root.rglob("*")
            if path.is_file() and not path.name.startswith("alphaagent.db")
        )
        return rows, files

    before = snapshot()
    turn_id = home.store.list_turns(ALICE, CONV.key)[0].turn_id
    for path in (
        "/",
        "/c/sales/",
        "/c/sales/runs",
        f"/c/sales/turns/{turn_id}",
        f"/c/sales/turns/{turn_id}/events",
        "/c/sales/artifacts/revenue/1?page=2",
        "/c/sales/blob/summary/1",
        "/c/sales/file/datasets/revenue.csv",
        "/w/wf1/clean/",
        "/c/missing/",
    ):
        assert alice.get(path).status_code in (200, 404)
    assert snapshot() == before


def test_turns_json_lists_a_turn_that_run_completed(tmp_path: Path) -> None:
    # Given a spec with one pinned step, run from the command line (in an environment without the
    # builtin preload: the lists are the subject, not what the zygote imports)
    home = tmp_path / "home"
    spec = {
        "environment_id": register_light(home),
        "spec_version": 1,
        "user_id": "me",
        "scope": {"conversation_id": "c1"},
        "goal": "count to three",
        "outputs": [{"kind": "dataset", "name": "counts", "path": "datasets/counts.csv"}],
        "steps": [{"title": "count", "code": "open('datasets/counts.csv', 'w').write('n\\n1\\n2\\n3\\n')"}],
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    ran = _cli("run", str(tmp_path / "spec.json"), "--user", "me", home=home)
    assert ran.returncode == 0, ran.stderr
    # When its turns and the user's conversations are listed
    turns = _cli("turns", "--user", "me", "--conversation", "c1", "--json", home=home)
    listed = _cli("conversations", "--user", "me", "--json", home=home)
    # Then the completed turn is there with its goal and duration, and so is its conversation
    assert turns.returncode == 0, turns.stderr
    [turn] = json.loads(turns.stdout)
    assert (turn["status"], turn["goal"], turn["error"]) == ("completed", "count to three", None)
    assert turn["duration_ms"] >= 0 and turn["result"]["artifacts"][0]["name"] == "counts"
    [conversation] = json.loads(listed.stdout)
    assert (conversation["scope"], conversation["turn_count"]) == ({"conversation_id": "c1"}, 1)


def test_only_loopback_addresses_count_as_this_machine_and_ipv6_urls_get_brackets() -> None:
    from alphaagent.viewer.serve import is_loopback, viewer_url

    assert [is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "localhost")] == [True] * 4
    assert [is_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.5", "example.com")] == [False] * 4
    assert viewer_url("::1", 8765, "t") == "http://[::1]:8765/?token=t"


def test_the_viewer_names_each_turns_environment_and_the_state_not_kept(tmp_path: Path) -> None:
    # Given a turn whose step leaves a lock in the session's globals (run by a sandbox without the
    # builtin preload: the environment is still builtin, which is what the pages must name)
    spec = {
        "spec_version": 1,
        "user_id": ALICE,
        "scope": {"conversation_id": "c-env"},
        "goal": "keep a lock",
        "steps": [{"title": "lock", "code": "import threading\nlock = threading.Lock()\nn = 1"}],
    }
    with light_agent(tmp_path) as agent:
        result = agent.run_analysis(spec)
    assert_status(result, "completed")
    client = client_for(tmp_path)
    # When its scope, turn and run pages are read
    scope_page = client.get(f"/c/c-env/?token={TOKEN}").text
    turn_page = client.get(f"/c/c-env/turns/{result.turn_id}").text
    runs_page = client.get("/c/c-env/runs").text
    # Then the turn's environment is named, and the run says what its state did not keep
    assert "<th>environment</th>" in scope_page and "<code>builtin</code>" in scope_page
    assert '<code id="turn-environment">builtin</code>' in turn_page
    assert "not kept: lock (a lock or event (TypeError:" in runs_page
