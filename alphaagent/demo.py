"""``alphaagent demo``: a real analysis on real public data, run through the sandbox.

The demo prepares a conversation scope under ``$ALPHAAGENT_HOME`` (default ``./.alphaagent``) with the
DESIGN §4.2 folders, brings ``examples/penguins/penguins.csv`` into ``docs/``, runs
``examples/penguins/analysis.py`` in the sandbox exactly as ``run_in_env`` would, then shows the
result and where the files are.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from alphaagent.errors import InvalidRequestError
from alphaagent.sandbox.supervisor import Sandbox, iter_result_lines

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "penguins"
SCOPE_FOLDERS = ("spec", "docs", "datasets", "charts", "reports", "work")


def alphaagent_home() -> Path:
    """``$ALPHAAGENT_HOME``, default ``./.alphaagent`` (DESIGN §1)."""
    return Path(os.environ.get("ALPHAAGENT_HOME", ".alphaagent"))


def run_demo(*, json_output: bool = False) -> int:
    """Run the penguins analysis in a fresh demo conversation; return the CLI exit code."""
    data, script = EXAMPLES / "penguins.csv", EXAMPLES / "analysis.py"
    if not data.is_file() or not script.is_file():
        raise InvalidRequestError(f"examples: {EXAMPLES} is missing (run the demo from a checkout)")
    scope = alphaagent_home() / "conversations" / "demo"
    if scope.exists():
        shutil.rmtree(scope)
    for folder in SCOPE_FOLDERS:
        (scope / folder).mkdir(parents=True)
    shutil.copyfile(data, scope / "docs" / "penguins.csv")
    with Sandbox() as sandbox:
        result = sandbox.run(script.read_text(encoding="utf-8"), cwd=scope)
        # A second run in the same scope: a fresh process that sees only the files of the first.
        check = sandbox.run(
            "import pandas as pd\nprint(pd.read_csv('datasets/species_summary.csv').iloc[0].to_dict())",
            cwd=scope,
        )
    if json_output:
        print(json.dumps({"scope": str(scope), "runs": [result.model_dump(), check.model_dump()]}, indent=2))
    else:
        print(f"scope: {scope}")
        for line in iter_result_lines(result):
            print(line)
        print("\nsecond run, reading the first run's dataset:")
        for line in iter_result_lines(check):
            print(line)
        print("\nfiles:")
        for path in sorted(p for p in scope.rglob("*") if p.is_file()):
            print(f"  {path}  ({path.stat().st_size} bytes)")
    return 0 if result.status == check.status == "ok" else 1
