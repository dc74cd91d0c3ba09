"""What the model reads: the system prompt, the spec rendered as the user prompt, and the turn limit."""

from __future__ import annotations

from collections.abc import Sequence

from alphaagent.domain.artifacts import KIND_FOLDERS, KIND_SUFFIXES
from alphaagent.environments import Environment
from alphaagent.models.spec import Constraints, Spec

SYSTEM_PROMPT = """\
You are the coder of alphaagent. You satisfy an analysis spec by writing Python and running it with \
the tools of the alphaagent server; you have no other tools.

- run_in_env runs your code as a fresh Python process in the scope's root folder. Files persist, \
and so do variables within the session: the globals one run leaves (DataFrames, arrays, numbers, \
functions, classes, imported modules) are restored in the next run, in this turn and in later \
turns of the conversation, so do not reload or recompute them. Each result's "state:" line names \
what was restored and what could not be kept (open files, generators, locks...): recreate those. \
fresh=true runs with empty globals and keeps the saved ones. There is no network. Work in small \
runs and read each result before the next: look at the data first, then compute, then write the \
outputs. When a run fails, read the traceback and fix the code: what earlier runs left is still there.
- Helper modules you write go in work/ and are imported after sys.path.append("work"). The scope \
is searched after the installed packages, so a module named like a standard or installed one \
(json.py, pandas.py) is never imported: give yours distinct names. Modules in the scope are always \
compiled from their .py source; .pyc files and compiled extensions there are ignored.
- The spec's inputs are in docs/ (read-only). Write outputs under datasets/ (csv, parquet, json, \
xlsx), charts/ (png, svg) and reports/ (md, html, txt); scratch files go in work/.
- Register every output the spec names with register_artifact, with the spec's kind and name.
- Cite every document and dataset your answer relies on with emit_citation, with a locator or a \
short quote where you can.
- End with a concise summary for the person who asked: the answer with its key numbers, and what \
you registered. No preamble."""


MAX_PROMPT_PACKAGES = 40
"""Packages the system prompt lists at most: an environment's main ones, not its whole closure."""


def environment_prompt(environment: Environment) -> str:
    """The system prompt's paragraph on the turn's environment (DESIGN §4.9): its id, description
    and main preinstalled packages from the registry, so the model uses what is there and does not
    try what is not (there is no network to install anything)."""
    lines = [f"- Your code runs in the execution environment {environment.environment_id!r}"]
    if environment.description:
        lines[0] += f": {environment.description.strip()}"
    lines[0] += "."
    packages = environment.packages[:MAX_PROMPT_PACKAGES]
    if packages:
        more = len(environment.packages) - len(packages)
        listed = ", ".join(packages) + (f" and {more} more" if more > 0 else "")
        lines.append(
            f"  Preinstalled: {listed}; the standard library is there too. Nothing else can be"
            " installed: use these, or plain Python."
        )
    else:
        lines.append(
            "  Its packages are not listed: check an import in a first small run before relying on it."
        )
    return "\n".join(lines)


def system_prompt_for(environment: Environment) -> str:
    """``SYSTEM_PROMPT`` with the paragraph on the turn's environment."""
    return f"{SYSTEM_PROMPT}\n\n{environment_prompt(environment)}"


def max_turns_for(constraints: Constraints) -> int:
    """The model's turn limit (one turn = one model response): ``2 * max_runs + 10``.

    ``constraints.max_runs`` bounds the runs themselves (``run_in_env`` refuses the next one); a
    run costs one turn and a fix after reading its result at most one more, and the 10 leave room
    to read documents, register outputs, cite and summarise. Past it the turn fails with
    ``MaxTurnsError``.
    """
    return 2 * constraints.max_runs + 10


def render_prompt(spec: Spec, inputs: Sequence[str]) -> str:
    """The spec as the user prompt: goal, the input paths now in the scope, outputs, limits."""
    lines = ["Goal:", spec.goal.strip(), ""]
    if inputs:
        lines.append("Inputs (read-only, in this scope):")
        lines.extend(f"- {path}" for path in inputs)
    else:
        lines.append("Inputs: none declared.")
    lines.append("")
    if spec.outputs:
        lines.append("Outputs to write and register (kind, name, file):")
        for output in spec.outputs:
            folder = KIND_FOLDERS[output.kind]
            where = (
                output.path
                or f"{folder}/{output.name}.<{'|'.join(s.lstrip('.') for s in KIND_SUFFIXES[output.kind])}>"
            )
            line = f"- {output.kind} {output.name!r}: {where}"
            if output.description:
                line += f" — {output.description.strip()}"
            lines.append(line)
    else:
        lines.append("Outputs: none required; register any dataset, chart or report your answer rests on.")
    limits = spec.constraints
    lines += [
        "",
        f"Limits: at most {limits.max_runs} runs of run_in_env, {limits.run_timeout_s:g} s per run,"
        f" {limits.turn_timeout_s:g} s for the whole turn. Environment: {spec.environment_id}.",
    ]
    return "\n".join(lines)
