"""Dataset profiling off the hot path (issue 11, item 5): parquet from its footer, csv from a bounded
sample, large datasets in a bounded child process."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from alphaagent.domain.artifacts import MAX_CSV_SAMPLE_BYTES, dataset_metadata
from alphaagent.domain.profiling import IN_PROCESS_PROFILE_BYTES, profile_dataset


class CountingReader(io.FileIO):
    """A file reader that counts the bytes read through it."""

    read_bytes = 0

    def read(self, size: int = -1) -> bytes:  # type: ignore[override]
        data = super().read(size)
        self.read_bytes += len(data)
        return data

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        count = super().readinto(buffer) or 0
        self.read_bytes += count
        return count


def test_a_parquet_profile_reads_the_footer_not_the_file(tmp_path: Path) -> None:
    # Given a parquet dataset of ~8 MiB in many row groups
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "big.parquet"
    table = pa.table({"id": range(1_000_000), "value": [float(i) for i in range(1_000_000)]})
    pq.write_table(table, path, row_group_size=50_000, compression="none")
    size = path.stat().st_size

    # When it is profiled from a seekable reader
    with CountingReader(path) as reader:
        metadata = dataset_metadata(reader, ".parquet")
        read = reader.read_bytes

    # Then schema, row count and preview come back, having read a small part of the file
    assert metadata["row_count"] == 1_000_000 and metadata["schema"] == {"id": "int64", "value": "double"}
    assert metadata["preview"][0] == {"id": 0, "value": 0.0}
    assert read < size / 4, (read, size)


def test_a_large_csv_is_profiled_from_a_bounded_sample_in_a_child_process(tmp_path: Path) -> None:
    # Given a csv of ~12 MiB (over the sample and over the in-process bound)
    path = tmp_path / "big.csv"
    with path.open("w") as out:
        out.write("a,b\n")
        for index in range(1_000_000):
            out.write(f"{index},x{index}\n")
    assert path.stat().st_size > max(MAX_CSV_SAMPLE_BYTES, IN_PROCESS_PROFILE_BYTES)

    # When it is profiled through a real descriptor
    with path.open("rb") as reader:
        metadata = profile_dataset(reader, path.stat().st_size, ".csv")

    # Then the schema and preview come from the sample, and the result says it was sampled
    assert metadata["profiled"] is True, metadata
    assert metadata["schema"]["a"] == "int64" and metadata["schema"]["b"] in ("object", "str")
    assert metadata["preview"][0] == {"a": 0, "b": "x0"}
    assert "row_count" not in metadata
    assert 0 < metadata["sampled_bytes"] <= MAX_CSV_SAMPLE_BYTES


def test_a_dataset_that_breaks_the_child_is_registered_unprofiled_with_the_reason(tmp_path: Path) -> None:
    # Given 2 MiB of bytes that are not parquet
    path = tmp_path / "fake.parquet"
    path.write_bytes(b"\x00" * (2 * 2**20))

    # When it is profiled (in a child process: it is over the in-process bound)
    with path.open("rb") as reader:
        metadata = profile_dataset(reader, path.stat().st_size, ".parquet")

    # Then the answer is a reason, not an exception
    assert metadata["profiled"] is False and metadata["reason"]
