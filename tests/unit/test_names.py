"""One naming rule for the files a run writes, on the local backend (the AWS env function applies
the same ``settle_run_names``; tests/integration/test_env_function.py checks it there): a file is
stored, listed, read, exported and registered under its NFC name; every skip names the rule and the
measured value."""

from __future__ import annotations

import json
import unicodedata
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from assertions import assert_status
from sandboxes import light, light_agent

from alphaagent.api import AlphaAgent
from alphaagent.domain.names import settle_names
from alphaagent.ids import new_ulid
from alphaagent.local.executor import SandboxExecutor
from alphaagent.models.common import ConversationScope
from alphaagent.models.run import FileChangeReport, RunLimits, RunOrigin

USER = "names-user"
NFD = unicodedata.normalize("NFD", "reports/café.md")
NFC = unicodedata.normalize("NFC", NFD)


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AlphaAgent]:
    with light_agent(tmp_path_factory.mktemp("home")) as shared:
        yield shared


def _spec(conversation: str, code: str, **fields: object) -> dict[str, object]:
    return {
        "spec_version": 1,
        "user_id": USER,
        "scope": {"conversation_id": conversation},
        "goal": "names",
        "steps": [{"title": "write", "code": code}],
        **fields,
    }


def test_a_decomposed_name_is_stored_listed_read_exported_and_registered_as_nfc(
    agent: AlphaAgent, tmp_path: Path
) -> None:
    # Given code that writes a report under its decomposed (NFD) name, registered under that spelling
    conversation = "c-" + new_ulid().lower()
    code = f"open({NFD!r}, 'w').write('# caf\\u00e9\\n')"
    outputs = [{"kind": "report", "name": "cafe", "path": NFD}]
    # When the turn runs
    result = agent.run_analysis(_spec(conversation, code, outputs=outputs))
    # Then the artifact is registered, under the NFC path
    assert_status(result, "completed")
    scope = ConversationScope(conversation_id=conversation)
    (version,) = agent.artifacts(USER, scope)
    assert version.path == NFC and version.size_bytes == len("# café\n".encode())
    # And the file is listed under its NFC name, readable under both spellings, and exported whole
    assert [f.path for f in agent.files(USER, scope, "reports")] == [NFC]
    assert agent.read_file(USER, scope, NFD) == agent.read_file(USER, scope, NFC) == "# café\n".encode()
    report = agent.export(USER, scope, tmp_path / "out.zip")
    with zipfile.ZipFile(report.path) as archive:
        assert archive.read(report.archive_names[NFC]) == "# café\n".encode()
    # And the run's history names the NFC path
    (run,) = agent.history(USER, scope)
    assert run.files_changed == [NFC]


def _run(tmp_path: Path, code: str) -> FileChangeReport:
    scope = ConversationScope(conversation_id="c-names")
    root = tmp_path / scope.key
    (root / "reports").mkdir(parents=True)
    origin = RunOrigin(turn_id=new_ulid(), session_id="s" * 32, user_id=USER, scope=scope)
    executor = SandboxExecutor(light())  # the names rule, not the preload, is the subject
    try:
        result = executor.run(root, code, limits=RunLimits(timeout_s=30), run_id=new_ulid(), origin=origin)
    finally:
        executor.close()
    assert_status(result, "ok", result.stderr)
    assert result.files_changed == sorted({*result.files.created, *result.files.modified})
    return result.files


def test_two_spellings_of_one_name_keep_the_nfc_one_and_skip_the_other_with_the_reason(
    tmp_path: Path,
) -> None:
    # Given code that writes the same name in NFC and in NFD, and two NFD-only spellings of another
    other_nfd = unicodedata.normalize("NFD", "reports/ñu.md")
    code = (
        f"open({NFC!r}, 'w').write('composed')\n"
        f"open({NFD!r}, 'w').write('decomposed')\n"
        f"open({other_nfd!r}, 'w').write('only decomposed')\n"
    )
    # When it runs
    files = _run(tmp_path, code)
    # Then the NFC file keeps its content, the NFD duplicate is skipped naming the NFC name
    root = tmp_path / "conversations/c-names"
    other = unicodedata.normalize("NFC", other_nfd)
    assert files.created == sorted([NFC, other])
    assert (root / NFC).read_text() == "composed"
    (skip,) = files.skipped
    assert skip.path == NFD
    assert skip.reason.startswith(f"not stored: its NFC name {NFC!r} is another file's"), skip.reason
    # And the NFD-only file was renamed to its NFC name
    assert (root / other).read_text() == "only decomposed" and not (root / other_nfd).exists()


def test_an_over_long_key_is_skipped_with_its_byte_count_and_the_limit(tmp_path: Path) -> None:
    # Given code that writes a file whose full key is over S3's 1,024 bytes (each segment is fine)
    deep = "/".join(["d" * 200] * 5)
    code = f"import os\nos.makedirs('reports/{deep}')\nopen('reports/{deep}/x.txt', 'w').write('x')\n"
    # When it runs
    files = _run(tmp_path, code)
    # Then it is not listed as created; the skip names the rule, the measured key size and the limit
    assert files.created == []
    (skip,) = files.skipped
    key_bytes = len(f"conversations/c-names/reports/{deep}/x.txt".encode())
    assert skip.reason == (
        f"not stored: path is too long: the full key is {key_bytes} UTF-8 bytes, over S3's"
        " 1024-byte key limit"
    ), skip.reason


def test_settling_is_idempotent_and_leaves_nfc_names_alone(tmp_path: Path) -> None:
    # Given a report with NFC names only
    (tmp_path / "reports").mkdir()
    (tmp_path / NFC).write_text("x")
    report = FileChangeReport(created=[NFC], modified=["reports/b.md"])
    (tmp_path / "reports/b.md").write_text("y")
    # When it is settled twice; Then nothing changes
    once = settle_names(tmp_path, report, key_prefix="conversations/c1/")
    assert once == report.model_copy(update={"created": [NFC], "modified": ["reports/b.md"]})
    assert settle_names(tmp_path, once, key_prefix="conversations/c1/") == once
    assert json.loads(once.model_dump_json())["skipped"] == []


def test_a_missing_output_names_the_closest_existing_file(agent: AlphaAgent) -> None:
    # Given code that wrote its report somewhere else than the spec's output path
    conversation = "c-" + new_ulid().lower()
    code = "import os\nos.makedirs('work/out')\nopen('work/out/report.pdf', 'wb').write(b'%PDF-1.4')\n"
    outputs = [{"kind": "report", "name": "report", "path": "reports/report.pdf"}]
    # When the turn runs
    result = agent.run_analysis(_spec(conversation, code, outputs=outputs))
    # Then it fails naming the missing path and the file the code did write
    assert_status(result, "failed")
    assert result.error is not None
    assert "path 'reports/report.pdf': no regular file there" in result.error.value
    assert "the closest existing file is 'work/out/report.pdf'" in result.error.value, result.error.value


def test_a_missing_output_with_no_close_file_names_none(agent: AlphaAgent) -> None:
    # Given code that wrote an unrelated file in the output's folder
    conversation = "c-" + new_ulid().lower()
    code = "import os\nos.makedirs('reports', exist_ok=True)\nopen('reports/survey.md', 'w').write('# s')\n"
    outputs = [{"kind": "report", "name": "summary", "path": "reports/summary.md"}]
    # When the turn runs
    result = agent.run_analysis(_spec(conversation, code, outputs=outputs))
    # Then it fails naming the missing path, and offers no file as a near match
    assert_status(result, "failed")
    assert result.error is not None
    assert (result.failed_step, result.error.value) == (
        "outputs[0]",
        "path 'reports/summary.md': no regular file there (missing, a directory or a symlink)",
    ), result.error.value


@pytest.mark.parametrize(
    ("wanted", "existing", "closest"),
    [
        ("reports/report.pdf", ["datasets/a.csv", "work/out/report.pdf"], "work/out/report.pdf"),
        ("charts/revenue.png", ["charts/revenu.png", "charts/other.png"], "charts/revenu.png"),
        ("datasets/sales.csv", ["reports/notes.md"], None),
        ("reports/summary.md", ["work/a/summary.md", "reports/x/summary.md"], "reports/x/summary.md"),
        # Only a file that is really close (new-user review: an unrelated file of the same folder
        # was offered, its path being similar through the folder alone)
        ("reports/summary.md", ["reports/survey.md", "reports/notes.md"], None),
        ("datasets/revenue.csv", ["datasets/regions.csv"], None),
        ("charts/a.png", ["charts/b.png"], None),
        ("reports/summary.md", ["reports/summary.txt", "work/summary.html"], "reports/summary.txt"),
        ("datasets/sales.csv", ["work/sales.csv.bak", "datasets/scales.csv"], "datasets/scales.csv"),
    ],
)
def test_closest_file_prefers_the_same_name_then_the_most_similar_path(
    wanted: str, existing: list[str], closest: str | None
) -> None:
    from alphaagent.domain.artifacts import closest_file

    assert closest_file(wanted, existing) == closest
