"""Records and files of a user's work for the viewer's tests, written straight through the Store and
Workspace Protocols (no sandbox: fast), so the same data can be laid in SQLite + files or DynamoDB + S3."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from alphaagent.ids import new_ulid
from alphaagent.models.common import ConversationScope, NodeScope, Scope
from alphaagent.models.records import ArtifactVersion, RunRecord, Turn, TurnResult
from alphaagent.models.run import RunError
from alphaagent.ports import Store, Workspace

ALICE, BOB = "alice", "bob"
TOKEN = "t0ken-" + "x" * 40
T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
CONV = ConversationScope(conversation_id="sales")
NODE = NodeScope(workflow_execution_id="wf1", node_id="clean")
HOSTILE = "<img src=x onerror=alert(1)>.csv"
PNG = (
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89"
    b"\x00\x00\x00\rIDATx\x9cc\xf8\x0f\x00\x00\x01\x01\x00\x05\x18\xd8N\x00\x00\x00\x00IEND\xaeB`\x82"
)
REPORT = (
    "# Revenue\n\nNorth leads.\n\n![chart](../charts/revenue.png)\n\n"
    "<script>alert('report')</script><img src=x onerror=alert(2)>\n\n"
    "[click](javascript:alert(3)) ![remote](https://tracker.example/pixel.png)\n"
)


class Home:
    """A backend's store and workspace, and helpers that write a user's work into them."""

    def __init__(self, store: Store, workspace: Workspace) -> None:
        self.store = store
        self.workspace = workspace

    def claim(self, scope: Scope, user: str = ALICE) -> None:
        self.store.claim_owner(scope.owner_key, user, T0)
        self.workspace.ensure_scope(scope)

    def turn(self, scope: Scope, *, status: str = "completed", user: str = ALICE, minute: int = 0) -> Turn:
        turn = Turn(
            turn_id=new_ulid(),
            user_id=user,
            scope_key=scope.key,
            session_id="s" * 32,
            status="running",
            goal="revenue <b>by</b> region",
            started_at=T0 + timedelta(minutes=minute),
        )
        self.store.create_turn(turn)
        if status != "running":
            error = (
                RunError(name="ValueError", value="bad <input>", traceback="") if status == "failed" else None
            )
            self.finish(turn, status, error)
        return turn

    def finish(self, turn: Turn, status: str, error: RunError | None = None) -> None:
        done = turn.model_copy(
            update={
                "status": status,
                "finished_at": turn.started_at + timedelta(seconds=12),
                "result": TurnResult(turn_id=turn.turn_id, status=status, summary="done", error=error),  # type: ignore[arg-type]
            }
        )
        self.store.finish_turn(done)

    def run(self, scope: Scope, turn: Turn, *, stdout: str = "hello\n", truncated: bool = False) -> RunRecord:
        run_id = new_ulid()
        spill = f"work/runs/{run_id}/stdout.txt"
        if truncated:
            self.workspace.write_bytes(scope, spill, b"the full output " * 10_000)
        record = RunRecord(
            run_id=run_id,
            turn_id=turn.turn_id,
            session_id="s" * 32,
            user_id=turn.user_id,
            scope_key=scope.key,
            status="ok",
            exit_code=0,
            code="print('hello')",
            stdout=stdout,
            stderr="",
            stdout_bytes=160_000 if truncated else len(stdout),
            stderr_bytes=0,
            stdout_truncated=truncated,
            stderr_truncated=False,
            error=None,
            reason=None,
            duration_ms=42,
            files_changed=[],
            stdout_path=spill if truncated else None,
            created_at=T0,
        )
        self.store.put_run(record)
        return record

    def artifact(
        self, scope: Scope, turn: Turn, kind: str, name: str, path: str, data: bytes
    ) -> ArtifactVersion:
        self.workspace.write_bytes(scope, path, data)
        sha, size = self.workspace.put_blob(scope, path)
        return self.store.add_artifact_version(
            ArtifactVersion(
                artifact_id=new_ulid(),
                scope_key=scope.key,
                kind=kind,  # type: ignore[arg-type]
                name=name,
                version=0,
                path=path,
                sha256=sha,
                size_bytes=size,
                turn_id=turn.turn_id,
                user_id=turn.user_id,
                created_at=T0,
            )
        )


def lay_out(home: Home) -> None:
    """Alice's conversation ``sales`` (a completed turn, a truncated run, a dataset in two versions, a
    PNG and an SVG chart, a Markdown report, a file with a hostile name) and her workflow node
    ``wf1/clean`` with a failed turn."""
    home.claim(CONV)
    turn = home.turn(CONV)
    home.run(CONV, turn, truncated=True)
    csv_rows = "region,revenue\n" + "".join(f"r{i},{i * 10}\n" for i in range(120))
    home.artifact(CONV, turn, "dataset", "revenue", "datasets/revenue.csv", csv_rows.encode())
    home.artifact(CONV, turn, "dataset", "revenue", "datasets/revenue.csv", b"region,revenue\nnorth,1\n")
    home.artifact(CONV, turn, "chart", "revenue-chart", "charts/revenue.png", PNG)
    home.artifact(CONV, turn, "chart", "vector", "charts/vector.svg", b"<svg onload='alert(4)'></svg>")
    home.artifact(CONV, turn, "report", "summary", "reports/summary.md", REPORT.encode())
    home.workspace.write_bytes(CONV, f"datasets/{HOSTILE}", b"a,b\n1,2\n")
    home.claim(NODE)
    home.turn(NODE, status="failed", minute=5)
