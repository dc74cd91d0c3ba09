"""Decode bombs in what the backend reads of a run's files (alphaagent/domain/decoding.py): parquet,
xlsx and pdf are decoded only in the bounded child, whatever their size, so a file of a few hundred
bytes that decodes to gigabytes is refused with the reason and the backend's process never holds it;
csv pages stay in the process, bounded per line and per page."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from alphaagent.domain import tools
from alphaagent.domain.decoding import CHILD_MEMORY_BYTES
from alphaagent.domain.profiling import profile_dataset
from alphaagent.errors import DecodeRefusedError, ToolError
from alphaagent.local.workspace import LocalWorkspace
from alphaagent.models.common import ConversationScope
from coder import seeing

SCOPE = ConversationScope(conversation_id="c1")


@pytest.fixture
def ctx(tmp_path: Path) -> Any:
    workspace = LocalWorkspace(tmp_path / "home")
    workspace.ensure_scope(SCOPE)
    return SimpleNamespace(backend=SimpleNamespace(workspace=workspace), scope=SCOPE)


def put(ctx: Any, path: str, data: bytes) -> None:
    ctx.backend.workspace.write_bytes(SCOPE, path, data)


def dictionary_bomb(rows: int, value_bytes: int) -> bytes:
    """A parquet file whose one column repeats one dictionary value of ``value_bytes``: the value is
    stored once (and compresses to almost nothing), the rows are a run-length code of index 0."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    column = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array(["x" * value_bytes]))
    out = io.BytesIO()
    pq.write_table(pa.table({"s": column}), out, compression="zstd")
    return out.getvalue()


def test_a_parquet_of_a_few_hundred_bytes_that_decodes_past_the_bound_is_refused_with_the_reason(
    ctx: Any,
) -> None:
    # Given 742 bytes of parquet whose first page decodes to 501 x 8 MiB = 4 GB
    bomb = dictionary_bomb(600, 8 * 2**20)
    assert len(bomb) < 4096 and CHILD_MEMORY_BYTES < 501 * 8 * 2**20
    put(ctx, "datasets/bomb.parquet", bomb)

    # When the coder pages through it, Then it is refused, naming the path and the bound
    with pytest.raises(ToolError, match=r"bomb\.parquet.*more than 2 GiB of memory.*run_in_env"):
        seeing.read_table(ctx, "datasets/bomb.parquet", 0, 500)

    # And its profile (under 1 MiB: it used to be decoded in the backend's process) is bounded too
    with ctx.backend.workspace.open_file(SCOPE, "datasets/bomb.parquet") as reader:
        metadata = profile_dataset(reader, len(bomb), ".parquet")
    assert metadata["row_count"] == 600
    assert all(len(row["s"]) <= 201 for row in metadata["preview"])


def test_no_parquet_xlsx_or_pdf_is_decoded_in_the_backends_process(
    ctx: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pandas as pd
    import pyarrow.parquet as pq

    # Given small, valid files of each compressed format (all far under the 1 MiB that used to be
    # decoded in the calling process)
    frame = pd.DataFrame({"species": ["Adelie", "Gentoo", None], "mass_g": [3700, None, 5000]})
    parquet, xlsx = io.BytesIO(), io.BytesIO()
    frame.to_parquet(parquet)
    frame.to_excel(xlsx, index=False)
    put(ctx, "datasets/mass.parquet", parquet.getvalue())
    put(ctx, "datasets/mass.xlsx", xlsx.getvalue())
    from pypdf import PdfWriter

    pdf = io.BytesIO()
    writer = PdfWriter()
    writer.add_blank_page(width=72, height=72)
    writer.write(pdf)
    put(ctx, "docs/blank.pdf", pdf.getvalue())

    # And decoders that fail if the backend's process calls them
    def in_backend(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("decoded in the backend's process")

    monkeypatch.setattr(pq, "ParquetFile", in_backend)
    monkeypatch.setattr(pd, "read_excel", in_backend)
    import pypdf

    monkeypatch.setattr(pypdf, "PdfReader", in_backend)

    # When each is paged, profiled and read, Then the answers come (from the child)
    page = seeing.read_table(ctx, "datasets/mass.parquet", 0, 50).splitlines()
    assert page[2:] == ["| Adelie | 3700.0 |", "| Gentoo | null |", "| null | 5000.0 |"]
    assert '"total_rows": 3' in page[0]
    sheet = seeing.read_table(ctx, "datasets/mass.xlsx", 1, 50).splitlines()
    assert sheet[2:] == ["| Gentoo | null |", "| null | 5000.0 |"]
    for name, suffix in (("datasets/mass.parquet", ".parquet"), ("datasets/mass.xlsx", ".xlsx")):
        with ctx.backend.workspace.open_file(SCOPE, name) as reader:
            profile = profile_dataset(reader, 2_000, suffix)
        assert profile["profiled"] is True and profile["row_count"] == 3, profile
    document = tools.read_document(ctx, "docs/blank.pdf")
    assert document.metadata["type"] == "pdf" and document.metadata["pages"] == 1
    # A reader without a descriptor (S3's streaming body) is spooled for the child
    assert profile_dataset(io.BytesIO(parquet.getvalue()), 2_000, ".parquet")["row_count"] == 3


def test_a_parquet_page_far_in_skips_whole_row_groups_by_the_footer(ctx: Any) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = io.BytesIO()
    pq.write_table(pa.table({"n": list(range(100_000))}), out, row_group_size=1_000)
    put(ctx, "datasets/long.parquet", out.getvalue())
    page = seeing.read_table(ctx, "datasets/long.parquet", 98_765, 3).splitlines()
    assert page[2:] == ["| 98765 |", "| 98766 |", "| 98767 |"]
    assert '"next_offset": 98768' in page[0]
    end = seeing.read_table(ctx, "datasets/long.parquet", 99_999, 5).splitlines()
    assert end[2:] == ["| 99999 |"] and '"next_offset": null' in end[0]
    past = seeing.read_table(ctx, "datasets/long.parquet", 10**12, 5).splitlines()
    assert len(past) == 2 and '"rows": 0' in past[0]


class _Counting:
    """A reader that counts the calls made on it (read and readline alike)."""

    def __init__(self, raw: Any) -> None:
        self.raw, self.calls = raw, 0

    def read(self, size: int = -1) -> bytes:
        self.calls += 1
        data: bytes = self.raw.read(size)
        return data

    def readline(self, size: int = -1) -> bytes:
        self.calls += 1
        data: bytes = self.raw.readline(size)
        return data

    def __enter__(self) -> _Counting:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.raw.close()


def test_a_csv_page_at_a_huge_offset_costs_one_pass_in_blocks_not_a_call_per_row(
    ctx: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a csv of 300,000 short rows, and a reader that counts what is asked of it
    put(ctx, "datasets/long.csv", b"n\n" + b"".join(b"%d\n" % n for n in range(300_000)))
    workspace = ctx.backend.workspace
    opened: list[_Counting] = []
    real_open = workspace.open_file

    def counting_open(scope: Any, path: str) -> _Counting:
        opened.append(_Counting(real_open(scope, path)))
        return opened[-1]

    monkeypatch.setattr(workspace, "open_file", counting_open)

    # When a page far past the end is asked for, Then it is empty, says the row count, and the
    # file was read in a few blocks (not 300,000 lines one call each)
    past = seeing.read_table(ctx, "datasets/long.csv", 10**12, 50).splitlines()
    assert '"rows": 0' in past[0] and '"total_rows": 300000' in past[0]
    assert opened[-1].calls < 20, opened[-1].calls

    # And a page near the end is the right rows, found the same way
    near = seeing.read_table(ctx, "datasets/long.csv", 299_998, 5).splitlines()
    assert near[1:] == ["| n |", "| 299998 |", "| 299999 |"] and '"next_offset": null' in near[0]
    assert '"total_rows": 300000' in near[0] and opened[-1].calls < 20
    # a row cut at a block's edge is still whole
    edge = seeing.read_table(ctx, "datasets/long.csv", 150_000, 2).splitlines()
    assert edge[2:] == ["| 150000 |", "| 150001 |"] and '"next_offset": 150002' in edge[0]


def test_a_csv_page_of_wide_rows_stops_at_its_byte_budget(ctx: Any) -> None:
    # Given rows of 600 KB each: 500 of them would be 300 MB for pandas
    row = b"y" * 600_000 + b"\n"
    put(ctx, "datasets/wide.csv", b"s\n" + row * 20)
    header = json.loads(seeing.read_table(ctx, "datasets/wide.csv", 0, 500).splitlines()[0])
    fit = seeing.MAX_CSV_PAGE_BYTES // len(row)  # the rows within the budget, and no more
    assert (header["rows"], header["next_offset"]) == (fit, fit) and fit < 20
    # and a single line of 2 MiB is refused before pandas sees it
    put(ctx, "datasets/one-line.csv", b"s\n" + b"z" * (2 * 2**20))
    with pytest.raises(ToolError, match="row 0 is over 1 MiB"):
        seeing.read_table(ctx, "datasets/one-line.csv", 0, 5)


def test_the_viewer_pages_parquet_and_xlsx_in_the_bounded_child(monkeypatch: pytest.MonkeyPatch) -> None:
    import pandas as pd
    import pyarrow.parquet as pq

    from alphaagent.viewer.preview import dataset_page

    # A bomb is a reason on the page, not gigabytes in the viewer's process (a page of 50 rows of
    # one 48 MiB value is 2.4 GB)
    bomb = dictionary_bomb(60, 48 * 2**20)
    assert len(bomb) < 64 * 2**10
    bombed = dataset_page(bomb, ".parquet")
    assert bombed.rows == [] and bombed.note and "memory" in bombed.note

    # And no parquet or xlsx is decoded in the viewer's process at all
    def in_viewer(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("decoded in the viewer's process")

    monkeypatch.setattr(pq, "ParquetFile", in_viewer)
    import openpyxl

    monkeypatch.setattr(openpyxl, "load_workbook", in_viewer)
    out = io.BytesIO()
    pd.DataFrame({"n": range(75)}).to_parquet(out)
    page = dataset_page(out.getvalue(), ".parquet", page=2, page_rows=50)
    assert page.total_rows == 75 and page.rows[0] == ["50"] and len(page.rows) == 25
    book = io.BytesIO()
    pd.DataFrame({"city": ["x0", "x1"], "n": [0, 1]}).to_excel(book, index=False)
    sheet = dataset_page(book.getvalue(), ".xlsx")
    assert (
        sheet.columns == ["city", "n"] and sheet.rows == [["x0", "0"], ["x1", "1"]] and sheet.total_rows == 2
    )


class _Versions:
    """The two Store methods register_artifact needs: no earlier version, and keep what is added."""

    def get_artifact(self, *_args: object) -> None:
        return None

    def add_artifact_version(self, version: Any) -> Any:
        return version


def test_on_s3_a_large_csv_is_profiled_from_its_sample_never_read_whole(
    tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    from alphaagent.aws.workspace import S3Workspace, workspaces_bucket_name
    from alphaagent.domain.artifacts import MAX_CSV_SAMPLE_BYTES, register_artifact

    bucket = workspaces_bucket_name("123456789012", "us-east-1")
    s3 = request.getfixturevalue("moto").bucket(bucket)
    workspace = S3Workspace(bucket, client=s3, local_dir=tmp_path / "work")
    workspace.ensure_scope(SCOPE)
    row = b"1,abcdefghij\n"
    workspace.write_bytes(SCOPE, "datasets/big.csv", b"a,b\n" + row * (3 * MAX_CSV_SAMPLE_BYTES // len(row)))

    def whole(*_args: object) -> bytes:
        raise AssertionError("the whole blob was read into the backend's memory")

    monkeypatch.setattr(workspace, "read_blob", whole)
    version = register_artifact(
        _Versions(),  # type: ignore[arg-type]
        workspace,
        scope=SCOPE,
        user_id="alice",
        turn_id="t1",
        kind="dataset",
        path="datasets/big.csv",
    )
    assert version.metadata["profiled"] is True, version.metadata
    assert 0 < version.metadata["sampled_bytes"] <= MAX_CSV_SAMPLE_BYTES
    assert version.metadata["schema"] == {"a": "int64", "b": version.metadata["schema"]["b"]}


def test_decoding_children_are_bounded_in_number(ctx: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    import pandas as pd

    from alphaagent.domain import decoding

    # Given every decoding turn taken (as by MAX_CHILDREN calls still decoding)
    turns = threading.BoundedSemaphore(1)
    turns.acquire()
    monkeypatch.setattr(decoding, "_TURNS", turns)
    monkeypatch.setattr(decoding, "CHILD_TIMEOUT_S", 0.2)
    out = io.BytesIO()
    pd.DataFrame({"n": [1]}).to_parquet(out)
    put(ctx, "datasets/one.parquet", out.getvalue())

    # Then another call waits its bound and is refused as busy, starting no child
    with pytest.raises(ToolError, match="every decoder was busy"):
        seeing.read_table(ctx, "datasets/one.parquet", 0, 5)
    # And once a turn is free, the next call decodes
    turns.release()
    monkeypatch.setattr(decoding, "CHILD_TIMEOUT_S", 30.0)
    assert "| 1 |" in seeing.read_table(ctx, "datasets/one.parquet", 0, 5)


def _small_parquet() -> bytes:
    import pandas as pd

    out = io.BytesIO()
    pd.DataFrame({"n": [7, 8]}).to_parquet(out)
    return out.getvalue()


PAGE_ARGS = {"offset": 0, "limit": 5, "max_columns": 5}


def test_each_decode_is_a_fresh_child_of_one_server_with_an_environment_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from alphaagent.domain import decode_server, decoding

    # Given a secret in the backend's environment
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "backend-secret")
    data = _small_parquet()
    # When two pages are decoded
    first = decoding.decode_in_child("parquet_page", data, PAGE_ARGS)
    server = decode_server.shared_server(decoding._PACKAGE_ROOT, decoding._CHILD_ENV)
    second = decoding.decode_in_child("parquet_page", data, PAGE_ARGS)
    # Then both come from the same server (no interpreter start per decode), each from its own child
    assert first["rows"] == second["rows"] == [[7], [8]]
    assert decode_server.shared_server(decoding._PACKAGE_ROOT, decoding._CHILD_ENV) is server
    children = Path(f"/proc/{server.process.pid}/task/{server.process.pid}/children").read_text()
    assert children.split() == []  # every decode's child is gone once it answered
    # And the server (so each child it forks) holds none of the backend's environment
    environ = Path(f"/proc/{server.process.pid}/environ").read_bytes().split(b"\0")
    assert b"AWS_SECRET_ACCESS_KEY=backend-secret" not in environ
    assert sorted(e.split(b"=")[0].decode() for e in environ if e) == sorted(decoding._CHILD_ENV)


def test_a_decode_out_of_time_is_killed_and_the_next_decode_is_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from alphaagent.domain import decoding

    # Given a wall budget no decode can meet
    monkeypatch.setattr(decoding, "CHILD_TIMEOUT_S", 0.001)
    # When a page is decoded, Then it is refused saying so
    with pytest.raises(DecodeRefusedError, match=r"decoding took more than 0\.001 s"):
        decoding.decode_in_child("parquet_page", _small_parquet(), PAGE_ARGS)
    # And with the budget back, the next page is decoded by the same server
    monkeypatch.setattr(decoding, "CHILD_TIMEOUT_S", 30.0)
    assert decoding.decode_in_child("parquet_page", _small_parquet(), PAGE_ARGS)["rows"] == [[7], [8]]


def test_a_dead_server_is_replaced_and_without_one_a_decode_starts_its_own_interpreter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from alphaagent.domain import decode_server, decoding

    # Given the server killed (by the OOM killer, say)
    server = decode_server.shared_server(decoding._PACKAGE_ROOT, decoding._CHILD_ENV)
    server.process.kill()
    server.process.wait(timeout=10)
    # When a page is decoded, Then a new server answers it
    assert decoding.decode_in_child("parquet_page", _small_parquet(), PAGE_ARGS)["rows"] == [[7], [8]]
    replacement = decode_server.shared_server(decoding._PACKAGE_ROOT, decoding._CHILD_ENV)
    assert replacement.process.pid != server.process.pid and replacement.alive

    # And where no server can start, the decode runs in an interpreter of its own (with the same
    # limits: ``run_job`` sets them in both)
    def no_server(*_args: object) -> decode_server.ForkServer:
        raise decode_server.ServerUnavailableError(0, "no server here")

    monkeypatch.setattr(decode_server.ForkServer, "start", no_server)
    monkeypatch.setattr(decode_server, "_server", None)
    assert decoding.decode_in_child("parquet_page", _small_parquet(), PAGE_ARGS)["rows"] == [[7], [8]]


def test_a_decode_that_answered_is_not_refused_for_how_its_interpreter_would_have_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from alphaagent.domain import decode_server, decoding

    # Given decoding children whose interpreter aborts at shutdown (seen under load: pyarrow's thread
    # pool torn down while its threads still ran; the abort came after a complete answer, which was
    # then refused as "needed more than 2 GiB of memory", and the viewer's table came back empty)
    monkeypatch.setattr(decode_server, "PRELOAD", (*decode_server.PRELOAD, "tests.abort_at_exit"))
    monkeypatch.setattr(decode_server, "_server", None)
    try:
        # When a page is decoded, Then it is answered: a child ends once its answer is written
        page = decoding.decode_in_child("parquet_page", _small_parquet(), PAGE_ARGS)
        server = decode_server._server
        assert server is not None and server.preload_errors == []  # the abort was armed
        assert page["rows"] == [[7], [8]]
    finally:
        if decode_server._server is not None:
            decode_server._server.close()  # not one for the tests after this one
