"""What decoding parquet in the bounded child costs (alphaagent/domain/decoding.py), side by side in
one run: a 50-row page of a small parquet decoded in this process (what ``read_table`` did before
the child), from a child forked by the decoding server (what it does now) and from a new
interpreter of its own (what each decode did before the server, and does where no server can
start); and a csv page at an offset past the end skipped line by line (before) against block by
block (now). The server's start (its imports, paid once per backend process) is measured apart.

Usage, from the repository root::

    .venv/bin/python bench/decoding.py [--repeat 5]

Prints JSON: the median seconds of each, the ratio, and the machine (with its load average).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from machine import machine

from alphaagent.domain import decode_server, decoding
from alphaagent.domain.decoding import decode_in_child


def _median(step: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    import pandas as pd
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory() as folder:
        parquet = Path(folder) / "t.parquet"
        pd.DataFrame({"n": range(100_000), "s": [f"v{i}" for i in range(100_000)]}).to_parquet(parquet)

        def in_process() -> object:
            with parquet.open("rb") as reader:
                batch = next(pq.ParquetFile(reader).iter_batches(batch_size=51))
                return batch.to_pandas()

        def in_child() -> object:
            with parquet.open("rb") as reader:
                return decode_in_child("parquet_page", reader, {"offset": 0, "limit": 50, "max_columns": 50})

        def in_spawned_child() -> object:
            def no_server(*_args: object) -> decode_server.ForkServer:
                raise decode_server.ServerUnavailableError(0, "measuring the spawned child")

            forked, decoding.shared_server = decoding.shared_server, no_server  # type: ignore[assignment]
            try:
                return in_child()
            finally:
                decoding.shared_server = forked

        started = time.perf_counter()
        decode_server.shared_server(decoding._PACKAGE_ROOT, decoding._CHILD_ENV)
        server_start_s = time.perf_counter() - started

        csv = Path(folder) / "long.csv"
        csv.write_bytes(b"n\n" + b"".join(b"%d\n" % n for n in range(2_000_000)))

        def lines() -> object:
            with csv.open("rb") as raw:
                raw.readline(2**20 + 1)
                while raw.readline(2**20 + 1):
                    pass
            return None

        def blocks() -> object:
            from coder.seeing import _Lines

            with csv.open("rb") as raw:
                return _Lines(raw).skip(10**12)

        figures = {
            "parquet_page_in_process_s": _median(in_process, args.repeat),
            "parquet_page_in_forked_child_s": _median(in_child, args.repeat),
            "parquet_page_in_spawned_child_s": _median(in_spawned_child, args.repeat),
            "decoding_server_start_s": server_start_s,
            "csv_skip_2M_rows_by_line_s": _median(lines, args.repeat),
            "csv_skip_2M_rows_by_block_s": _median(blocks, args.repeat),
        }
    figures["forked_child_over_in_process"] = round(
        figures["parquet_page_in_forked_child_s"] / figures["parquet_page_in_process_s"], 1
    )
    figures["spawned_over_forked_child"] = round(
        figures["parquet_page_in_spawned_child_s"] / figures["parquet_page_in_forked_child_s"], 1
    )
    figures["line_over_block"] = round(
        figures["csv_skip_2M_rows_by_line_s"] / figures["csv_skip_2M_rows_by_block_s"], 1
    )
    print(json.dumps({"figures": figures, "machine": machine(load)}, indent=2))


if __name__ == "__main__":
    main()
