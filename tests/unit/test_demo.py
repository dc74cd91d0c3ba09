"""`alphaagent demo` (what `make demo` shows): two turns, real data, artifacts, a second session."""

from __future__ import annotations

import csv
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from assertions import assert_status
from cli_runner import run_cli


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """One `alphaagent demo --json` (two turns of the real analysis, ~5 CPU-s), which both tests
    read: run with no ALPHAAGENT_HOME, an empty HOME, ALPHAAGENT_USER set and another working
    directory. Returns the finished command and where it ran (``home``, ``cwd``, ``env``)."""
    root = tmp_path_factory.mktemp("demo")
    home, cwd = root / "home", root / "elsewhere"
    home.mkdir()
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("ALPHAAGENT_HOME", "XDG_DATA_HOME")}
    env.update(HOME=str(home), ALPHAAGENT_USER="newcomer")
    done = run_cli(["demo", "--json"], env=env, cwd=cwd, text=True, timeout=300)
    return done, {"home": home, "cwd": cwd, "env": env, "root": root}


def test_demo_runs_two_turns_that_outlive_a_session(
    demo: tuple[subprocess.CompletedProcess[str], dict[str, Any]],
) -> None:
    # Given an empty data directory; When the demo runs
    done, _ = demo
    # Then both turns complete, with the dataset, chart and report of the real analysis
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    first, second = report["turns"]
    assert_status(first, "completed")
    assert_status(second, "completed")
    assert [(a["kind"], a["name"], a["version"]) for a in first["artifacts"]] == [
        ("dataset", "species_summary", 1),
        ("chart", "body_mass", 1),
        ("report", "summary", 1),
    ]
    assert [c["source"] for c in first["citations"]] == ["docs/penguins.csv"]
    scope = Path(report["scope"])
    rows = {row["species"]: row for row in csv.DictReader((scope / "datasets/species_summary.csv").open())}
    assert {name: int(row["count"]) for name, row in rows.items()} == {
        "Adelie": 151,
        "Chinstrap": 68,
        "Gentoo": 123,
    }
    assert (scope / "charts/body_mass.png").read_bytes().startswith(b"\x89PNG")
    assert "Gentoo penguins are the heaviest" in (scope / "reports/summary.md").read_text()
    # And the second turn, in a new session, built on the registered dataset
    assert len(report["sessions"]) == 2
    assert "docs/species_summary.csv" in report["files"]
    assert not [f for f in report["files"] if ".v1." in f]  # one stable name, never a versioned copy
    sidecar = json.loads((scope / "docs/species_summary.csv.version.json").read_text())
    assert (sidecar["artifact"], sidecar["version"]) == ("species_summary", 1)
    assert [(i["artifact"], i["version"]) for i in second["inputs"]] == [("species_summary", 1)]
    assert "Gentoo penguins weigh 1.37 times as much as Adelie" in (scope / "reports/followup.md").read_text()
    # And progress went to stderr, step by step
    assert "step 1/3: aggregate body mass by species" in done.stderr


def test_the_demo_uses_the_per_user_data_directory_and_the_identity_rule(
    demo: tuple[subprocess.CompletedProcess[str], dict[str, Any]],
) -> None:
    # Given no ALPHAAGENT_HOME, an empty HOME, ALPHAAGENT_USER set, and another working directory
    done, where = demo
    home, cwd, env = where["home"], where["cwd"], where["env"]
    # When the demo ran there: Then its scope is under ~/.local/share/alphaagent, nothing was
    # written where it ran
    assert done.returncode == 0, done.stderr
    scope = Path(json.loads(done.stdout)["scope"])
    assert scope.parent.parent == home / ".local/share/alphaagent"
    assert list(cwd.iterdir()) == []
    # And a read command from anywhere, as the same user, finds its runs
    read = run_cli(
        ["history", "--json", "--conversation", scope.name],
        env=env,
        cwd=where["root"],
        text=True,
        timeout=120,
    )
    assert read.returncode == 0, read.stderr
    assert len(json.loads(read.stdout)) == 4


def test_the_demo_prints_a_command_that_works_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from alphaagent.program import program_name

    # Given an alphaagent program in a checkout's venv, started by a relative path, and PATH without it
    venv_bin = tmp_path / "checkout" / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    program = venv_bin / "alphaagent"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    monkeypatch.chdir(tmp_path / "checkout")
    monkeypatch.setenv("PATH", str(tmp_path / "elsewhere"))
    # When the demo names the program to paste, Then it is the absolute path
    assert program_name(".venv/bin/alphaagent") == str(program)
    # And when that program is the one on PATH, it is the bare name
    monkeypatch.setenv("PATH", str(venv_bin))
    assert program_name(".venv/bin/alphaagent") == "alphaagent"
    # (python -m alphaagent.cli is named by its interpreter: tests/unit/test_cli_newcomer.py)


def test_a_failed_first_turn_stops_the_demo_with_its_own_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    from sandboxes import light

    import alphaagent.demo as demo_module
    from alphaagent.api import AlphaAgent

    # Given the demo's examples with a first step that fails (on a sandbox that preloads nothing)
    examples = tmp_path / "examples"
    shutil.copytree(demo_module.EXAMPLES_DIR / "penguins", examples / "penguins")
    turn1 = examples / "penguins" / "turn1.json"
    spec = json.loads(turn1.read_text())
    spec["steps"][0]["code"] = "raise ValueError('the first turn broke here')"
    turn1.write_text(json.dumps(spec))
    monkeypatch.setattr(demo_module, "EXAMPLES_DIR", examples)
    monkeypatch.setattr(demo_module, "AlphaAgent", lambda home, **kw: AlphaAgent(home, sandbox=light(), **kw))
    # When the demo runs
    code = demo_module.run_demo(home=tmp_path / "home", user_id="newcomer", json_output=True)
    # Then it stops after the first turn, exits 1, and says why that turn failed
    out, err = capsys.readouterr()
    assert code == 1
    assert "turn 2" not in err, err
    assert "species_summary" not in err, err  # not the second turn's misleading error
    failure = [line for line in err.splitlines() if line.startswith("turn 1 failed")]
    assert len(failure) == 1 and "ValueError: the first turn broke here" in failure[0], err
    (only,) = json.loads(out)["turns"]
    assert only["status"] == "failed" and only["error"]["value"] == "the first turn broke here"
