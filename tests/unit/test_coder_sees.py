"""The coder sees what it made (issue 17, items 1-3): a chart comes back as a picture, a dataset as
its profile, a table page by page, and every run result opens with a status line and ends with the
next steps the platform knows. Through the real Agent SDK and its CLI against the scripted Messages
API: the assertions are on the request bodies the model endpoint received."""

from __future__ import annotations

import base64
import io
import json
import struct
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from installed import skip_unless_installed
from scripted_api import Reply, ScriptedMessagesAPI, text, tool_use

from alphaagent.api import AlphaAgent
from alphaagent.domain.backend import ConnectorSettings, TurnSettings
from alphaagent.models.run import FileChangeReport, RunError, RunResult
from coder import seeing
from coder.settings import CoderSettings

skip_unless_installed("claude_agent_sdk")

pytestmark = pytest.mark.mcp_sdk  # imports the MCP SDK in this process (tests/conftest.py)

if TYPE_CHECKING:
    from PIL import Image


@pytest.fixture(scope="module")
def api() -> Iterator[ScriptedMessagesAPI]:
    with ScriptedMessagesAPI() as server:
        yield server


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory, api: ScriptedMessagesAPI) -> Iterator[AlphaAgent]:
    from coder.agent import make_coder

    settings = CoderSettings(
        provider="anthropic", anthropic_api_key="sk-ant-test", anthropic_base_url=api.base_url, max_retries=0
    )
    with AlphaAgent(
        tmp_path_factory.mktemp("home"),
        connectors=ConnectorSettings(file_roots=()),
        turns=TurnSettings(lock_wait_s=30),
        coder=make_coder(settings),
    ) as shared:
        yield shared


def call(tool: str, /, **arguments: Any) -> dict[str, Any]:
    return tool_use(f"mcp__alphaagent__{tool}", arguments)


def _spec(conversation: str, outputs: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {
        "spec_version": 1,
        "user_id": "seer",
        "scope": {"conversation_id": conversation},
        "goal": "look at what you made",
        "outputs": outputs or [],
        "constraints": {"max_runs": 5, "run_timeout_s": 60},
    }


def _images(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The image blocks of one tool_result as the API received them."""
    return [block for block in result["content"] if block.get("type") == "image"]


def _decoded(block: dict[str, Any]) -> Image.Image:
    from PIL import Image

    source = block["source"]
    assert source["type"] == "base64" and source["media_type"] in ("image/png", "image/jpeg")
    return Image.open(io.BytesIO(base64.b64decode(source["data"])))


CHART = """\
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(8, 4.5), dpi=200)  # 1600 x 900: over MAX_SIDE, a quarter of the pixels
ax.bar(["Adelie", "Chinstrap", "Gentoo"], [3700, 3733, 5076])
ax.set_title("Mean body mass")
fig.savefig("charts/mass.png")
print("saved")
"""


def test_a_chart_a_run_saves_reaches_the_model_as_a_bounded_picture(
    agent: AlphaAgent, api: ScriptedMessagesAPI
) -> None:
    api.load(
        [
            Reply([call("run_in_env", code=CHART)]),
            Reply([call("register_artifact", kind="chart", path="charts/mass.png", name="mass")]),
            Reply([text("The chart shows Gentoo heaviest.")]),
        ]
    )

    result = agent.run_analysis(_spec("sees-chart", [{"kind": "chart", "name": "mass"}]))

    assert result.status == "completed", result.error
    requests = api.message_requests()
    run_result = requests[1].tool_results()[0]
    assert run_result["text"].startswith("[run ok] exit 0 · ")
    assert "files: 1 created" in run_result["text"].splitlines()[0]
    assert "charts: charts/mass.png: shown below (1600 x 900 px, shown at 1024 x 576)" in run_result["text"]
    [picture] = _images(run_result)
    image = _decoded(picture)
    assert max(image.size) <= seeing.MAX_SIDE and image.size == (1024, 576)
    assert len(image.getcolors(maxcolors=1 << 16) or range(1 << 16)) > 2, "a real picture, not a blank"
    assert len(base64.b64decode(picture["source"]["data"])) <= seeing.MAX_IMAGE_BYTES
    # register_artifact of the chart returns the picture too, after its JSON
    registered = requests[2].tool_results()[0]
    assert json.loads(registered["text"].split("\n\n")[0])["name"] == "mass"
    assert len(_images(registered)) == 1


HUGE_AND_MANY = """\
import zlib, struct
def png(width, height):
    # An 8-bit greyscale PNG whose header says width x height, with the data of one row only (the
    # decoder would fill in the rest, decoding it like the whole image): compressing all 100 Mpx
    # row by row costs the run ~0.5 CPU-s, and what the tool must refuse is in the header
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    body = zlib.compress(b"\\x00" * (width + 1))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", header) + chunk(b"IDAT", body) + chunk(b"IEND", b"")
open("charts/huge.png", "wb").write(png(10_000, 10_000))
import matplotlib.pyplot as plt
for i in range(5):
    fig, ax = plt.subplots()
    ax.plot(range(10), [x * i for x in range(10)])
    fig.savefig(f"charts/small{i}.png")
open("charts/broken.png", "wb").write(b"not a png")
"""


def test_pictures_stay_bounded_for_a_10000_px_png_many_charts_and_a_broken_one(
    agent: AlphaAgent, api: ScriptedMessagesAPI
) -> None:
    api.load([Reply([call("run_in_env", code=HUGE_AND_MANY)]), Reply([text("done")])])

    result = agent.run_analysis(_spec("sees-bounds"))

    assert result.status == "completed", result.error
    run_result = api.message_requests()[1].tool_results()[0]
    assert not run_result["is_error"]
    images = _images(run_result)
    assert len(images) == seeing.MAX_IMAGES
    assert sum(len(base64.b64decode(b["source"]["data"])) for b in images) <= seeing.MAX_IMAGE_BYTES
    notes = run_result["text"]
    assert "charts/huge.png: 10000 x 10000 px is over the 40 Mpx this tool decodes" in notes
    assert f"not shown (at most {seeing.MAX_IMAGES} pictures per result)" in notes
    assert "charts/broken.png: not a readable png" in notes


WIDE = """\
columns = ",".join(f"c{i}" for i in range(20_000))
open("datasets/wide.csv", "w").write(columns + "\\n" + ",".join("1" for _ in range(20_000)) + "\\n")
import pandas as pd
pd.DataFrame({"species": ["Adelie", "Gentoo", None], "mass_g": [3700, None, 5000]}).to_parquet(
    "datasets/mass.parquet")
pd.DataFrame({"n": range(1000)}).to_csv("datasets/long.csv", index=False)
open("datasets/wide-header.csv", "w").write("x" * (2 * 2**20) + "\\n1\\n")
"""


def test_a_dataset_registration_returns_its_profile_bounded_and_tables_page_by_rows(
    agent: AlphaAgent, api: ScriptedMessagesAPI
) -> None:
    api.load(
        [
            Reply([call("run_in_env", code=WIDE)]),
            Reply([call("register_artifact", kind="dataset", path="datasets/mass.parquet", name="mass")]),
            Reply([call("register_artifact", kind="dataset", path="datasets/wide.csv", name="wide")]),
            Reply([call("read_document", path="datasets/long.csv", offset=990, limit=20)]),
            Reply([call("read_document", path="datasets/mass.parquet")]),
            Reply([call("read_document", path="datasets/wide-header.csv")]),
            Reply([text("done")]),
        ]
    )

    result = agent.run_analysis(_spec("sees-data"))

    assert result.status == "completed", result.error
    requests = api.message_requests()
    mass = requests[2].tool_results()[0]["text"]
    profile = mass.split("\n\n", 1)[1]
    assert profile.startswith("profile: 3 rows, 2 columns")
    assert "species: " in profile and "1 null" in profile and "| Adelie | 3700" in profile
    wide = requests[3].tool_results()[0]["text"].split("\n\n", 1)[1]
    assert len(wide) <= seeing.MAX_PROFILE_CHARS and "... 140 more" in wide

    page = requests[4].tool_results()[0]["text"].splitlines()
    assert page and page[0].startswith("{"), requests[4].tool_results()[0]["text"][:500]
    header = json.loads(page[0])
    assert (header["offset"], header["rows"], header["next_offset"]) == (990, 10, None)
    assert page[1] == "| n |" and page[2] == "| 990 |" and page[-1] == "| 999 |"
    parquet = requests[5].tool_results()[0]["text"].splitlines()
    assert json.loads(parquet[0])["total_rows"] == 3 and parquet[2:] == [
        "| Adelie | 3700.0 |",
        "| Gentoo | null |",
        "| null | 5000.0 |",
    ]
    refused = requests[6].tool_results()[0]
    assert refused["is_error"] and "header line is over 1 MiB" in refused["text"]


def _result(**fields: Any) -> RunResult:
    base: dict[str, Any] = {
        "run_id": "01RUN",
        "status": "ok",
        "exit_code": 0,
        "stdout": "",
        "stderr": "",
        "stdout_bytes": 0,
        "stderr_bytes": 0,
        "stdout_truncated": False,
        "stderr_truncated": False,
        "error": None,
        "duration_ms": 12,
        "files_changed": [],
        "files": FileChangeReport(),
        "limits": {"timeout_s": 30},
        "isolation": "process",
        "network": "off",
    }
    return RunResult(**(base | fields))


def test_the_status_line_and_the_next_steps_say_what_to_do() -> None:
    from coder.tools import next_steps, status_line

    changed = FileChangeReport(created=["a.csv", "b.csv"], modified=["c.csv"])
    assert status_line(_result(files=changed)) == "[run ok] exit 0 · 12 ms · files: 2 created, 1 modified"

    timeout = next_steps(_result(status="timeout", exit_code=None))
    assert timeout and "30 s limit" in timeout[0] and "smaller runs" in timeout[0]

    missing = _result(
        status="error",
        exit_code=1,
        error=RunError(name="ModuleNotFoundError", value="No module named 'sklearn'", traceback=""),
    )
    envs = [("builtin", ("pandas==2.2.3",)), ("ml", ("scikit-learn==1.5.0", "sklearn==0.0"))]
    [hint] = next_steps(missing, envs)
    assert "sklearn is not installed here" in hint and "ml have it" in hint
    [none] = next_steps(missing, [("builtin", ("pandas==2.2.3",))])
    assert "No registered environment lists it" in none

    cut = next_steps(_result(stdout_truncated=True, stdout_path="work/runs/01RUN/stdout.txt"))
    assert cut == [
        "next: the whole stdout is in work/runs/01RUN/stdout.txt; page through it with read_document."
    ]


def _png_header(width: int, height: int) -> bytes:
    """A greyscale PNG whose header says ``width`` x ``height``, with the data of one row only (the
    decoder fills in the rest): built in no time, where a real 100 Mpx PNG takes ~0.5 CPU-s to
    encode, and decoded like one (the whole ``width`` x ``height`` image)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    row = zlib.compress(b"\x00" * (width + 1))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", row) + chunk(b"IEND", b"")


def test_a_picture_is_never_decoded_past_its_pixel_bound() -> None:

    # The header alone says 10,000 x 10,000: nothing is decompressed
    shown = seeing._picture(_png_header(10_000, 10_000), "PNG")
    assert isinstance(shown, str) and "10000 x 10000 px" in shown
    # and the same file under the bound is decoded and shown: it is the bound that refused the first
    small = seeing._picture(_png_header(100, 100), "PNG")
    assert isinstance(small, tuple) and small[2] == "100 x 100 px"
