"""The steps driver: a spec's pinned code run in order through ``run_in_env`` without a model, its
declared outputs registered and its inputs cited; the first failing step fails the turn.
"""

from __future__ import annotations

import time
from pathlib import PurePosixPath

from alphaagent.domain.artifacts import KIND_FOLDERS
from alphaagent.domain.tools import (
    TurnContext,
    emit_citation,
    register_artifact,
    run_in_env,
)
from alphaagent.errors import (
    AlphaAgentError,
)
from alphaagent.models.run import RunError
from alphaagent.models.spec import (
    SpecOutput,
)
from alphaagent.wording import count


class StepFailed(Exception):
    def __init__(self, step: str, error: RunError) -> None:
        super().__init__(error.value)
        self.step, self.error = step, error


def run_steps(ctx: TurnContext, deadline: float) -> str:
    """Run pinned steps in order through ``run_in_env``; register every declared output; cite the
    inputs the steps were given. The first failing step fails the turn with its error."""
    steps = ctx.spec.steps or []
    for i, step in enumerate(steps, start=1):
        if time.monotonic() >= deadline:
            error = RunError(name="TurnTimeout", value="constraints.turn_timeout_s exceeded", traceback="")
            raise StepFailed(step.title, error)
        ctx.progress(f"step {i}/{len(steps)}: {step.title}")
        result = run_in_env(ctx, step.code, fresh=step.fresh)
        ctx.progress(f"step {i}/{len(steps)}: {result.status} in {result.duration_ms} ms")
        if result.status != "ok":
            error = result.error or RunError(
                name="RunFailed", value=result.reason or result.status, traceback=""
            )
            raise StepFailed(step.title, error)
    for i, output in enumerate(ctx.spec.outputs):
        path = output.path or default_output_path(ctx, i, output)
        try:
            ref = register_artifact(ctx, output.kind, path, name=output.name, description=output.description)
        except AlphaAgentError as exc:
            # The output is the failed step, which every reader shows before the error: not twice.
            raise StepFailed(
                f"outputs[{i}]", RunError(name=type(exc).__name__, value=str(exc), traceback="")
            ) from None
        ctx.progress(f"registered {ref.kind} {ref.name} v{ref.version} ({ref.path})")
    for path, origin in ctx.origins.items():
        # `cites PATH (CLAIM)` is how every reader shows a citation: no brackets inside the claim.
        emit_citation(ctx, path, claim=f"input of this turn's pinned steps; {origin}")
    registered = ", ".join(f"{a.name} v{a.version}" for a in ctx.artifacts) or "nothing"
    return f"{count(len(steps), 'step')} ran; registered {registered}."


def default_output_path(ctx: TurnContext, index: int, output: SpecOutput) -> str:
    folder = KIND_FOLDERS[output.kind]
    matches = [
        f.path
        for f in ctx.backend.workspace.list_files(ctx.scope, folder)
        if PurePosixPath(f.path).stem == output.name
    ]
    if len(matches) != 1:
        found = "none" if not matches else ", ".join(matches)
        raise StepFailed(
            f"outputs[{index}]",
            RunError(
                name="ArtifactError",
                value=f"path: not given, and no single file named {output.name}.* in {folder}/"
                f" (found {found})",
                traceback="",
            ),
        )
    return matches[0]
