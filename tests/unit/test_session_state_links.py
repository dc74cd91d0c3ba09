"""A session's live state is never read nor written through a link the run planted.

Found by a red-team review: a run writes its scope, so it can make ``work``, ``work/sessions``, the
session's folder or a state file a symlink before the platform makes them. The child's restore then
unpickled whatever the link named (a pickle the run, or a connector input, put in ``docs/``) and its
save wrote through it; on AWS ``state_files``/``state_before``/``state_up`` read the manifest
through it. Every one of them now walks from the scope root with ``O_NOFOLLOW``
(``state.open_state_dir``); only the delete (``drop_state``) did before.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandboxes import light_at

from alphaagent.aws.session_state import state_before
from alphaagent.aws.sync import CarriedFolder, DownReport
from alphaagent.models.run import RunLimits
from alphaagent.sandbox.session import MANIFEST, StateRequest, read_state_file, state_files, state_path
from alphaagent.sandbox.supervisor import Sandbox

SESSION = "s-links"
LEVELS = ("work", "work/sessions", f"work/sessions/{SESSION}", "files")
"""Where the link is planted: a folder on the way to the state, or each state file itself."""


@pytest.fixture(scope="module", params=["namespaces", "process"])
def box(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    with light_at(request.param) as sandbox:
        yield sandbox


@pytest.fixture(scope="module")
def saved_state(box: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A genuine saved state (``planted = 'from the link'``), made by a real run of the session."""
    root = tmp_path_factory.mktemp("donor")
    (root / "work").mkdir()
    result = box.run("planted = 'from the link'", cwd=root, state=StateRequest(SESSION))
    assert result.status == "ok" and result.state is not None and result.state.saved == ["planted"], result
    return root / state_path(SESSION)


def plant(scope: Path, level: str, state: Path) -> Path:
    """Copy ``state`` into the scope's ``docs/decoy`` (where the run may write, and is visible at
    both levels) and link the state's path to it at ``level``; returns the decoy folder."""
    decoy = scope / "docs" / "decoy"
    if level == "files":
        shutil.copytree(state, decoy)
        folder = scope / state_path(SESSION)
        folder.mkdir(parents=True)
        for name in os.listdir(decoy):
            (folder / name).symlink_to(decoy / name)
        return decoy
    # The decoy mirrors what the link stands for: work/, work/sessions/ or the session's folder.
    below = state_path(SESSION)[len(level) :].strip("/")
    shutil.copytree(state, decoy / below if below else decoy)
    link = scope / level
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(decoy, target_is_directory=True)
    return decoy


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("level", LEVELS)
def test_a_planted_link_is_neither_restored_from_nor_saved_through(
    box: Sandbox, saved_state: Path, tmp_path: Path, level: str
) -> None:
    # Given a scope whose state path the run made a link, at `level`, to a real state in docs/
    scope = tmp_path / "scope"
    (scope / "docs").mkdir(parents=True)
    decoy = plant(scope, level, saved_state)
    before = snapshot(decoy)

    # When a run of the session reads its globals, then defines one
    result = box.run(
        "print(globals().get('planted'))\nmine = 1",
        cwd=scope,
        limits=RunLimits(),
        state=StateRequest(SESSION),
    )

    # Then nothing was restored from the link, and nothing was written through it
    assert result.status == "ok", result
    assert result.stdout == "None\n"
    assert result.state is not None and result.state.restored == []
    assert snapshot(decoy) == before
    if level == "files":
        # The folder itself is real: the new state replaces the links (never writes through them).
        assert result.state.saved == ["mine"] and result.state.save_error is None
        folder = scope / state_path(SESSION)
        assert not any(p.is_symlink() for p in folder.iterdir())
    else:
        assert result.state.saved == []
        assert "is a symlink or not a folder" in (result.state.save_error or ""), result.state
        assert "symlink" in result.state.skipped.get("*", ""), result.state.skipped


@pytest.mark.parametrize("level", LEVELS)
def test_the_platforms_readers_of_state_files_follow_no_link(
    saved_state: Path, tmp_path: Path, level: str
) -> None:
    # Given a scope whose state path is a link, at `level`, to a real state
    scope = tmp_path / "scope"
    (scope / "docs").mkdir(parents=True)
    plant(scope, level, saved_state)
    manifest = f"{state_path(SESSION)}/{MANIFEST}"
    assert (scope / manifest).is_file()  # followed by path, it is there

    # When the backends list, read and digest the state (what the env function uploads and compares)
    carried = DownReport(carried={state_path(SESSION): CarriedFolder({manifest: 1}, True)})

    # Then none of them reads through the link
    assert state_files(scope, SESSION) == []
    assert read_state_file(scope, SESSION, MANIFEST) is None
    assert state_before(carried, scope, SESSION).manifest_sha256 is None


def test_the_readers_still_read_a_state_that_is_not_linked(saved_state: Path) -> None:
    # Given the donor's real state (no link anywhere)
    root = saved_state.parents[2]
    manifest = f"{state_path(SESSION)}/{MANIFEST}"
    carried = DownReport(carried={state_path(SESSION): CarriedFolder({manifest: 1}, True)})

    # Then it is listed, read and digested
    assert state_files(root, SESSION)[-1] == manifest
    assert read_state_file(root, SESSION, MANIFEST) == (root / manifest).read_bytes()
    assert state_before(carried, root, SESSION).manifest_sha256 is not None
