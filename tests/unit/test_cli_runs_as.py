"""``alphaagent run`` says on its first progress line whom the turn runs as and where that user
came from (new-user review: the README's sample spec said ``"user_id": "me"`` while the commands
after it read as the default user ``local``, and the reads answered ``conversation penguins not
found`` with nothing to tell why). On standard error only: ``--json``'s standard output stays the
result. A refusal before the turn starts stays one line (test_cli_commands.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from cli_runner import run_cli
from sandboxes import register_light


def _spec(path: Path, **fields: Any) -> Path:
    document = {
        "spec_version": 1,
        "scope": {"conversation_id": "who"},
        "goal": "say who",
        "environment_id": "light",
        "steps": [{"title": "t", "code": "print(1)"}],
        **fields,
    }
    path.write_text(json.dumps(document))
    return path


def test_the_first_progress_line_names_the_user_and_where_it_came_from(tmp_path: Path) -> None:
    home = tmp_path / "home"
    register_light(home)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALPHAAGENT_")} | {
        "ALPHAAGENT_HOME": str(home)
    }
    plain = _spec(tmp_path / "plain.json")
    cases = [
        ([], {}, plain, "running as user 'local' (the default) in conversation who"),
        (["--user", "ann"], {}, plain, "running as user 'ann' (--user) in conversation who"),
        (
            [],
            {"ALPHAAGENT_USER": "bob"},
            plain,
            "running as user 'bob' ($ALPHAAGENT_USER) in conversation who",
        ),
        (
            [],
            {},
            _spec(tmp_path / "me.json", user_id="me", scope={"conversation_id": "mine"}),
            "running as user 'me' (the spec's user_id) in conversation mine",
        ),
    ]
    for i, (flags, more_env, spec, line) in enumerate(cases):
        scope = [] if spec.name == "me.json" else ["--conversation", f"who{i}"]
        done = run_cli(["run", str(spec), *flags, *scope, "--json"], env=env | more_env, text=True)
        assert done.returncode == 0, done.stderr
        expected = line.replace("conversation who", f"conversation who{i}") if scope else line
        assert done.stderr.splitlines()[0] == expected, done.stderr
        assert json.loads(done.stdout)["status"] == "completed"  # stdout: the result alone


def test_the_readmes_sample_specs_run_as_the_user_its_commands_read_as() -> None:
    # The README's commands read as the default user: a sample spec naming another user would
    # put its turn where they never look (`conversation penguins not found`).
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    blocks = [block.split("```", 1)[0] for block in readme.split("```json\n")[1:]]
    specs = [json.loads(block) for block in blocks if '"spec_version"' in block]
    assert specs, "the README has a sample spec"
    for spec in specs:
        assert spec.get("user_id", "local") == "local", spec
