"""Benchmark of the workspace viewer (`alphaagent serve`): page latency over real HTTP, side by side
with the same reads through the Python API, on a conversation of a realistic size.

The conversation (written straight through the local store and workspace: no sandbox) holds
``FILES`` files, ``RUNS`` runs with 16 KiB of stored output each, and artifacts: a CSV dataset of
``ROWS`` rows, a PNG chart and a Markdown report. The viewer runs under uvicorn on a loopback port
in this process; each page is fetched ``REPEAT`` times over HTTP with the session cookie, and the
p50/p95 latency printed next to the time the API takes for the reads the page needs
(``AlphaAgent.files``/``artifacts``/``history``, and parsing the dataset page). The front page, the
scope page, the run history, the first and the last page of the dataset, and a 16 MiB download
(throughput) are measured. Prints Markdown tables (``--json``: one JSON object) and the machine.

Usage, from the repository root::

    .venv/bin/python bench/viewer.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import http.cookiejar
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
for entry in (REPO_ROOT, REPO_ROOT / "tests"):
    if str(entry) not in sys.path:
        sys.path.insert(0, str(entry))

from machine import machine  # noqa: E402
from viewer_data import ALICE, CONV, PNG, REPORT, Home  # noqa: E402

from alphaagent.api import AlphaAgent  # noqa: E402
from alphaagent.local.store import SqliteStore  # noqa: E402
from alphaagent.local.workspace import LocalWorkspace  # noqa: E402
from alphaagent.viewer.preview import dataset_page  # noqa: E402
from alphaagent.viewer.serve import bind, local_reader  # noqa: E402

FILES = 300
RUNS = 100
ROWS = 20_000
DOWNLOAD_BYTES = 16 * 2**20
TOKEN = "bench-token"


def build(root: Path) -> None:
    home = Home(SqliteStore(root / "alphaagent.db"), LocalWorkspace(root))
    home.claim(CONV)
    turn = home.turn(CONV)
    stdout = ("x" * 99 + "\n") * 163  # 16 KiB, the stored-history cap of a stream
    for _ in range(RUNS):
        home.run(CONV, turn, stdout=stdout)
    for i in range(FILES):
        home.workspace.write_bytes(CONV, f"work/part-{i // 50}/file-{i:04d}.txt", b"y" * 1000)
    rows = "region,revenue\n" + "".join(f"r{i},{i}\n" for i in range(ROWS))
    home.artifact(CONV, turn, "dataset", "revenue", "datasets/revenue.csv", rows.encode())
    home.artifact(CONV, turn, "chart", "revenue-chart", "charts/revenue.png", PNG)
    home.artifact(CONV, turn, "report", "summary", "reports/summary.md", REPORT.encode())
    home.workspace.write_bytes(CONV, "work/big.bin", os.urandom(DOWNLOAD_BYTES))
    home.store.close()


def timed(call: Callable[[], Any], repeat: int) -> list[float]:
    call()  # warm caches (templates, connections) once
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(statistics.median(ordered), 2),
        "p95_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))], 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (noisier)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    repeat = 5 if args.quick else 20
    load = os.getloadavg()[0]

    import uvicorn

    from alphaagent.viewer.app import create_app

    with tempfile.TemporaryDirectory(prefix="alphaagent-bench-viewer-") as tmp:
        root = Path(tmp) / "home"
        build(root)
        listener = bind("127.0.0.1", 0)
        port = listener.getsockname()[1]
        app = create_app(local_reader(root, ALICE), token=TOKEN)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.05)
        base = f"http://127.0.0.1:{port}"
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        browser.open(f"{base}/?token={TOKEN}").read()

        def get(path: str) -> Callable[[], Any]:
            return lambda: browser.open(base + path, timeout=60).read()

        last_page = -(-ROWS // 50)
        agent = AlphaAgent(root)
        data = (root / CONV.key / "datasets/revenue.csv").read_bytes()
        pages = [
            ("front page", "/", lambda: agent.conversations(ALICE)),
            (
                f"scope page ({FILES} files, 3 artifacts)",
                "/c/sales/",
                lambda: (agent.files(ALICE, CONV), agent.artifacts(ALICE, CONV), agent.turns(ALICE, CONV)),
            ),
            (f"run history ({RUNS} runs x 16 KiB)", "/c/sales/runs", lambda: agent.history(ALICE, CONV)),
            (
                f"dataset page 1 of {last_page} ({ROWS} rows)",
                "/c/sales/artifacts/revenue/1",
                lambda: dataset_page(data, ".csv", 1),
            ),
            (
                f"dataset page {last_page} of {last_page}",
                f"/c/sales/artifacts/revenue/1?page={last_page}",
                lambda: dataset_page(data, ".csv", last_page),
            ),
        ]
        results = []
        for name, path, api in pages:
            results.append(
                {
                    "page": name,
                    "http": summary(timed(get(path), repeat)),
                    "api": summary(timed(api, repeat)),
                    "bytes": len(get(path)()),
                }
            )
        download = timed(get("/c/sales/file/work/big.bin"), max(3, repeat // 4))
        mib_s = round(DOWNLOAD_BYTES / 2**20 / (statistics.median(download) / 1000), 1)
        agent.close()
        server.should_exit = True
        thread.join(timeout=10)
        listener.close()

    report = {
        "pages": results,
        "download_16_mib": {"median_ms": round(statistics.median(download), 1), "mib_per_s": mib_s},
        "repeat": repeat,
        "machine": machine(load),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"# Workspace viewer ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {repeat} requests a page)\n")
    print("| page | HTTP p50 ms | HTTP p95 ms | API p50 ms | API p95 ms | page bytes |")
    print("|---|---|---|---|---|---|")
    for row in results:
        web, api = row["http"], row["api"]
        print(
            f"| {row['page']} | {web['p50_ms']} | {web['p95_ms']} | {api['p50_ms']} | {api['p95_ms']}"
            f" | {row['bytes']} |"
        )
    print(f"\n16 MiB download: {report['download_16_mib']['median_ms']} ms median ({mib_s} MiB/s)\n")
    print("| machine | |\n|---|---|")
    for key, value in report["machine"].items():
        print(f"| {key} | {value} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
