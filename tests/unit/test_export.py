"""Behaviour of the workspace zip export (DESIGN §4.3): the inclusive 25 MiB per-file ceiling and the
manifest of omitted files (ZIP-01), no symlink content ever archived (PATH-01), entry names safe to
extract on any OS (PATH-03), and an archive that is whole or absent."""

from __future__ import annotations

import io
import json
import os
import re
import tracemalloc
import zipfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from alphaagent.local.export import export_scope, safe_archive_name
from alphaagent.local.workspace import LocalWorkspace
from alphaagent.models.common import ConversationScope, Scope
from alphaagent.ports import FileInfo

MiB = 2**20
CEILING = 25 * MiB  # DESIGN §4.3: workspace export, per file
WINDOWS_RESERVED = re.compile(r"^(CON|PRN|AUX|NUL|COM[0-9¹²³]|LPT[0-9¹²³])$", re.IGNORECASE)


@pytest.fixture
def workspace(tmp_path: Path) -> LocalWorkspace:
    return LocalWorkspace(tmp_path / "home")


@pytest.fixture
def scope(workspace: LocalWorkspace) -> ConversationScope:
    scope = ConversationScope(conversation_id="c1")
    workspace.ensure_scope(scope)
    return scope


@pytest.fixture
def out(tmp_path: Path) -> Path:
    folder = tmp_path / "exports"
    folder.mkdir()
    return folder / "c1.zip"


def make_file(root: Path, rel: str, size: int, fill: bytes | None = None) -> None:
    """Create a file as user code would; sparse (quick to make) unless ``fill`` is given."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        if fill is None:
            handle.truncate(size)
        else:
            handle.write(fill * size)


def manifest_of(archive: zipfile.ZipFile) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads(archive.read("MANIFEST.json"))
    return manifest


def assert_safe_entry_name(name: str) -> None:
    assert not name.startswith("/")
    assert "\\" not in name
    assert not re.search(r'[<>:"|?*\x00-\x1f\x7f]', name), name
    for segment in name.split("/"):
        assert segment not in ("", ".", ".."), name
        assert not segment.endswith((".", " ")), name
        assert not WINDOWS_RESERVED.match(segment.split(".", 1)[0].rstrip(" ")), name


# -- ZIP-01: the per-file ceiling ---------------------------------------------------------------------


def test_zip01_a_file_over_the_ceiling_is_omitted_and_listed_and_one_at_the_ceiling_is_included(
    workspace: LocalWorkspace, scope: ConversationScope, out: Path
) -> None:
    # Given the ZIP-01 workspace: a 30 MiB dataset, one of exactly 25 MiB, and a short report
    root = workspace.local_root(scope)
    make_file(root, "datasets/full.csv", 30 * MiB, b"x")
    make_file(root, "datasets/edge.csv", 25 * MiB, b"y")
    (root / "reports/summary.md").write_text("# summary\n")

    # When the workspace is exported
    report = export_scope(workspace, scope, out)

    # Then the export succeeds; edge.csv (exactly 25 MiB) and summary.md are in, full.csv is out,
    # in the report with its size and the reason ...
    assert report.path == out
    assert report.max_file_bytes == CEILING == 26_214_400
    assert report.included == [("datasets/edge.csv", 26_214_400), ("reports/summary.md", 10)]
    assert report.omitted == [("datasets/full.csv", 31_457_280, "too_large")]
    assert report.total_bytes == 26_214_410
    assert report.archive_bytes == out.stat().st_size

    # ... in the machine-readable manifest inside the zip, with the ceiling ...
    with zipfile.ZipFile(out) as archive:
        assert archive.testzip() is None
        assert archive.namelist() == [
            "datasets/edge.csv",
            "reports/summary.md",
            "MANIFEST.json",
            "MANIFEST.txt",
        ]
        manifest = manifest_of(archive)
        assert manifest["max_file_bytes"] == 26_214_400
        assert manifest["omitted"] == [
            {
                "path": "datasets/full.csv",
                "size_bytes": 31_457_280,
                "reason": "too_large",
                "detail": "larger than the per-file export ceiling",
                "max_file_bytes": 26_214_400,
            }
        ]
        assert [item["path"] for item in manifest["included"]] == ["datasets/edge.csv", "reports/summary.md"]
        # ... and in the human manifest
        text = archive.read("MANIFEST.txt").decode()
        assert "datasets/full.csv  31,457,280 bytes" in text
        assert "26,214,400 bytes (25 MiB)" in text
        # The included files are complete
        assert archive.getinfo("datasets/edge.csv").file_size == 26_214_400
        with archive.open("datasets/edge.csv") as entry:
            while chunk := entry.read(4 * MiB):
                assert chunk == b"y" * len(chunk)
        assert archive.read("reports/summary.md") == b"# summary\n"


def test_zip01_one_byte_over_the_ceiling_is_omitted(
    workspace: LocalWorkspace, scope: ConversationScope, out: Path
) -> None:
    # Given a dataset of 25 MiB + 1 byte
    make_file(workspace.local_root(scope), "datasets/edge_plus_one.csv", CEILING + 1)

    # When the workspace is exported
    report = export_scope(workspace, scope, out)

    # Then it is omitted, and listed with its size and the ceiling
    assert report.included == []
    assert report.omitted == [("datasets/edge_plus_one.csv", 26_214_401, "too_large")]
    with zipfile.ZipFile(out) as archive:
        assert archive.namelist() == ["MANIFEST.json", "MANIFEST.txt"]
        omitted = manifest_of(archive)["omitted"]
        assert omitted == [
            {
                "path": "datasets/edge_plus_one.csv",
                "size_bytes": 26_214_401,
                "reason": "too_large",
                "detail": "larger than the per-file export ceiling",
                "max_file_bytes": 26_214_400,
            }
        ]


def test_a_configured_ceiling_is_inclusive_too(
    workspace: LocalWorkspace, scope: ConversationScope, out: Path
) -> None:
    # Given files of 10 and 11 bytes and a ceiling of 10 bytes
    workspace.write_bytes(scope, "work/ten.txt", b"0123456789")
    workspace.write_bytes(scope, "work/eleven.txt", b"0123456789A")

    # When the workspace is exported with that ceiling
    report = export_scope(workspace, scope, out, max_file_bytes=10)

    # Then 10 bytes are in and 11 bytes are out
    assert report.included == [("work/ten.txt", 10)]
    assert report.omitted == [("work/eleven.txt", 11, "too_large")]
    with zipfile.ZipFile(out) as archive:
        assert manifest_of(archive)["max_file_bytes"] == 10


def test_export_streams_in_constant_memory(
    workspace: LocalWorkspace, scope: ConversationScope, out: Path
) -> None:
    # Given a 20 MiB dataset (sparse)
    make_file(workspace.local_root(scope), "datasets/big.bin", 20 * MiB)

    # When it is exported while Python allocations are traced
    tracemalloc.start()
    try:
        report = export_scope(workspace, scope, out)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    # Then it is archived whole, and memory stayed near one 1 MiB block
    assert report.included == [("datasets/big.bin", 20 * MiB)]
    assert peak < 6 * MiB


# -- PATH-01: symlinks and special files ----------------------------------------------------------------


def test_path01_symlinked_files_and_directories_are_neither_listed_nor_archived(
    workspace: LocalWorkspace, scope: ConversationScope, out: Path
) -> None:
    # Given the PATH-01 run's links: the process environment, runner source, /etc/passwd, /usr
    root = workspace.local_root(scope)
    os.symlink("/proc/self/environ", root / "reports/env.txt")
    os.symlink("/var/task", root / "work/runner_src")
    os.symlink("/usr", root / "work/usr")
    os.symlink("/etc/passwd", root / "datasets/users.csv")
    os.mkfifo(root / "work/pipe")
    workspace.write_bytes(scope, "reports/ok.md", b"# ok\n")

    # When the workspace is listed and exported
    listed = [info.path for info in workspace.list_files(scope)]
    report = export_scope(workspace, scope, out)

    # Then only the regular file is listed and archived, and the skipped links are named (PATH-01:
    # "skips them and reports the skipped names"), never followed ...
    assert listed == ["reports/ok.md"]
    assert report.included == [("reports/ok.md", 5)]
    assert sorted((o.path, o.reason) for o in report.omitted) == [
        ("datasets/users.csv", "symlink"),
        ("reports/env.txt", "symlink"),
        ("work/pipe", "fifo"),
        ("work/runner_src", "symlink"),
        ("work/usr", "symlink"),
    ]
    with zipfile.ZipFile(out) as archive:
        assert archive.namelist() == ["reports/ok.md", "MANIFEST.json", "MANIFEST.txt"]
        contents = b"".join(archive.read(name) for name in archive.namelist())

    # ... and no byte of the environment, passwd or /usr made it in
    passwd_lines = [line for line in Path("/etc/passwd").read_bytes().splitlines() if line]
    environ = [item for item in Path("/proc/self/environ").read_bytes().split(b"\0") if len(item) > 8]
    assert passwd_lines and not any(line in contents for line in passwd_lines)
    assert not any(item in contents for item in environ)
    assert b"ELF" not in contents


# -- PATH-03 and Windows: safe, distinct entry names -----------------------------------------------------

UNSAFE_NAMES = {
    "reports/CON": "reports/_CON",
    "reports/con.txt": "reports/_con.txt",
    "reports/Aux.tar.gz": "reports/_Aux.tar.gz",
    "reports/com1.csv": "reports/_com1.csv",
    "reports/LPT9.md": "reports/_LPT9.md",
    "reports/nul.": "reports/nul_",
    "reports/what?.csv": "reports/what_~2.csv",
    "reports/what_.csv": "reports/what_.csv",
    "reports/a<b>c.md": "reports/a_b_c.md",
    'reports/quote".txt': "reports/quote_.txt",
    "reports/pipe|star*.txt": "reports/pipe_star_.txt",
    "reports/trailing ": "reports/trailing_",
    "reports/dots...": "reports/dots___",
    "reports/Report.md": "reports/Report.md",
    "reports/report.md": "reports/report~2.md",
    "C:/x.txt": "C_/x.txt",
    "MANIFEST.json": "MANIFEST~2.json",
    "..%2F..%2Fetc%2Fpasswd": "..%2F..%2Fetc%2Fpasswd",
}


def test_windows_unsafe_names_are_sanitised_deduplicated_and_mapped_in_the_manifest(
    workspace: LocalWorkspace, scope: ConversationScope, out: Path
) -> None:
    # Given files whose names are valid workspace paths but unsafe or colliding on Windows
    for path in UNSAFE_NAMES:
        workspace.write_bytes(scope, path, f"content of {path}".encode())

    # When the workspace is exported
    report = export_scope(workspace, scope, out)

    # Then every file is included under the expected safe name, names already safe are kept, and the
    # report and manifest map each workspace path to its archive name
    assert report.omitted == []
    assert report.archive_names == UNSAFE_NAMES
    with zipfile.ZipFile(out) as archive:
        assert archive.testzip() is None
        names = archive.namelist()
        mapping = {item["path"]: item["archive_name"] for item in manifest_of(archive)["included"]}
        assert mapping == UNSAFE_NAMES
        for path, name in mapping.items():
            assert archive.read(name) == f"content of {path}".encode()
        assert "reports/what?.csv -> reports/what_~2.csv" in archive.read("MANIFEST.txt").decode()

    # And every name is safe and distinct, even case-insensitively
    for name in names:
        assert_safe_entry_name(name)
    assert len({name.casefold() for name in names}) == len(names)
    # And entries come in sorted order of their workspace path, with the manifests last
    assert names[:-2] == [UNSAFE_NAMES[path] for path in sorted(UNSAFE_NAMES)]
    assert names[-2:] == ["MANIFEST.json", "MANIFEST.txt"]


def test_a_file_and_a_folder_that_land_on_the_same_name_are_kept_apart(
    workspace: LocalWorkspace, scope: ConversationScope, out: Path
) -> None:
    # Given a file 'x:' (safe name 'x_') and a folder 'x_' holding a file
    workspace.write_bytes(scope, "work/x:", b"file")
    workspace.write_bytes(scope, "work/x_/y.csv", b"nested")

    # When the workspace is exported
    report = export_scope(workspace, scope, out)

    # Then the already-safe folder keeps its name and the file gets a distinct one
    assert report.archive_names == {"work/x_/y.csv": "work/x_/y.csv", "work/x:": "work/x_~2"}
    with zipfile.ZipFile(out) as archive:
        assert archive.read("work/x_~2") == b"file"
        assert archive.read("work/x_/y.csv") == b"nested"


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/etc/hosts", "etc/hosts"),
        ("../../conv-OTHER/reports/leak.md", "__/__/conv-OTHER/reports/leak.md"),
        ("charts/../../../spec/override.json", "charts/__/__/__/spec/override.json"),
        ("a/./b", "a/_/b"),
        ("C:\\Windows\\system.ini", "C__Windows_system.ini"),
        ("a//b/", "a/b"),
        ("tab\there\nnew", "tab_here_new"),
        ("lpt1 .txt", "_lpt1 .txt"),
        ("COM¹", "_COM¹"),
        ("console.txt", "console.txt"),
        ("", "_"),
    ],
)
def test_safe_archive_name_never_escapes_the_extraction_folder(path: str, expected: str) -> None:
    # Given a path from any source, even one the workspace rules would have refused
    # When it is mapped to an entry name
    name = safe_archive_name(path)

    # Then the name is the expected safe one: no leading '/', no '..', no backslash, no device name
    assert name == expected
    assert_safe_entry_name(name)


# -- whole or nothing -------------------------------------------------------------------------------------


class FakeWorkspace:
    """A ``Workspace`` of our own whose files are in memory; some fail when read."""

    def __init__(self, files: dict[str, bytes], *, fail_midway: str = "", vanished: str = "") -> None:
        self.files, self.fail_midway, self.vanished = files, fail_midway, vanished

    def list_files(
        self, scope: Scope, prefix: str = "", skipped: list[tuple[str, str]] | None = None
    ) -> list[FileInfo]:
        moment = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)
        return [FileInfo(path, len(data), moment) for path, data in sorted(self.files.items())]

    def open_file(self, scope: Scope, path: str) -> BinaryIO:
        if path == self.vanished:
            raise FileNotFoundError(path)
        if path == self.fail_midway:
            return FailingReader(self.files[path])
        return io.BytesIO(self.files[path])


class FailingReader(io.BytesIO):
    """Returns a few bytes, then fails as a disk would."""

    def read(self, size: int | None = -1) -> bytes:
        if self.tell() > 0:
            raise OSError(5, "Input/output error")
        return super().read(3)


def test_a_failure_midway_leaves_no_archive_and_an_older_one_untouched(tmp_path: Path, out: Path) -> None:
    # Given an earlier export at ``out``, and a workspace whose second file fails while being copied
    out.write_bytes(b"the previous export")
    fake = FakeWorkspace({"a.txt": b"fine", "b.txt": b"breaks midway"}, fail_midway="b.txt")
    scope = ConversationScope(conversation_id="c1")

    # When the workspace is exported
    with pytest.raises(OSError, match="Input/output"):
        export_scope(fake, scope, out)  # type: ignore[arg-type]

    # Then the earlier archive is unchanged and no temporary file is left next to it
    assert out.read_bytes() == b"the previous export"
    assert os.listdir(out.parent) == [out.name]


def test_a_file_that_vanishes_before_it_is_copied_is_listed_as_omitted(out: Path) -> None:
    # Given a workspace where one listed file is gone by the time it is opened
    fake = FakeWorkspace({"a.txt": b"here", "gone.txt": b"was here"}, vanished="gone.txt")

    # When the workspace is exported
    report = export_scope(fake, ConversationScope(conversation_id="c1"), out)  # type: ignore[arg-type]

    # Then it is not silently dropped: the report and the manifest list it as unreadable
    assert report.included == [("a.txt", 4)]
    assert report.omitted == [("gone.txt", 8, "unreadable")]
    with zipfile.ZipFile(out) as archive:
        assert [item["path"] for item in manifest_of(archive)["omitted"]] == ["gone.txt"]
        assert archive.getinfo("a.txt").date_time == (2024, 1, 2, 3, 4, 4)  # DOS time: 2-second steps


@pytest.mark.slow
def test_an_archive_of_more_than_65535_entries_is_valid_zip64(out: Path) -> None:
    # Given a workspace of 65,600 small files (more than the classic zip format can count)
    files = {f"work/f{index:05d}.txt": b"x" for index in range(65_600)}

    # When it is exported
    report = export_scope(FakeWorkspace(files), ConversationScope(conversation_id="c1"), out)  # type: ignore[arg-type]

    # Then the archive opens with every entry
    assert len(report.included) == 65_600
    with zipfile.ZipFile(out) as archive:
        assert len(archive.infolist()) == 65_602
        assert archive.read("work/f65599.txt") == b"x"


def test_small_files_and_compressed_formats_are_stored_and_the_rest_deflated(
    workspace: LocalWorkspace, scope: ConversationScope, out: Path
) -> None:
    # Given a file of 64 bytes, one of 65, and a larger picture (already compressed)
    files = {
        "work/small.csv": b"a," * 32,
        "work/larger.csv": b"a," * 32 + b"b",
        "charts/p.png": b"\x89PNG" + b"p" * 4000,
    }
    for path, data in files.items():
        workspace.write_bytes(scope, path, data)
    # When the scope is exported
    export_scope(workspace, scope, out)
    # Then the small file and the picture are stored, the larger text is deflated, all byte for byte
    with zipfile.ZipFile(out) as archive:
        kinds = {path: archive.getinfo(path).compress_type for path in files}
        assert all(archive.read(path) == data for path, data in files.items())
    assert kinds == {
        "work/small.csv": zipfile.ZIP_STORED,
        "work/larger.csv": zipfile.ZIP_DEFLATED,
        "charts/p.png": zipfile.ZIP_STORED,
    }


def test_an_empty_scope_exports_just_the_manifests(
    workspace: LocalWorkspace, scope: ConversationScope, out: Path
) -> None:
    # Given a scope with its folders but no files
    # When it is exported
    report = export_scope(workspace, scope, out)

    # Then the archive holds the two manifests and says nothing was omitted
    assert report.included == [] and report.omitted == []
    with zipfile.ZipFile(out) as archive:
        assert archive.namelist() == ["MANIFEST.json", "MANIFEST.txt"]
        assert manifest_of(archive)["omitted"] == []
