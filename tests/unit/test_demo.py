"""`alphaagent demo` runs the real analysis on the shipped data (what `make demo` shows)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path


def test_demo_produces_the_dataset_chart_and_report(tmp_path: Path) -> None:
    # Given an empty ALPHAAGENT_HOME
    env = {**os.environ, "ALPHAAGENT_HOME": str(tmp_path / "home")}
    # When the demo runs
    done = subprocess.run(
        [sys.executable, "-m", "alphaagent.cli", "demo", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    # Then both runs succeed and the files hold the real analysis of the 344 penguins
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    first, second = report["runs"]
    assert first["status"] == second["status"] == "ok"
    assert first["files_changed"] == [
        "charts/body_mass.png",
        "datasets/species_summary.csv",
        "reports/summary.md",
    ]
    scope = tmp_path / "home" / "conversations" / "demo"
    rows = {row["species"]: row for row in csv.DictReader((scope / "datasets/species_summary.csv").open())}
    assert {name: int(row["count"]) for name, row in rows.items()} == {
        "Adelie": 151,
        "Chinstrap": 68,
        "Gentoo": 123,
    }
    assert (scope / "charts/body_mass.png").read_bytes().startswith(b"\x89PNG")
    assert "Gentoo penguins are the heaviest" in (scope / "reports/summary.md").read_text()
    assert "Gentoo" in second["stdout"]
