"""matplotlib's font list kept from an interpreter's first zygote for its later ones
(``alphaagent.sandbox.fontcache``): seeded into each new config dir, read only when a zygote is
ready (before any run), so nothing a run writes there reaches the next zygote.

The zygotes here preload nothing: their warm-up writes a stand-in font list where matplotlib
writes its own (``$MPLCONFIGDIR/fontlist-v*.json``), which is all the supervisor looks at.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from assertions import assert_status
from sandboxes import light

from alphaagent.models.run import RunLimits
from alphaagent.sandbox import fontcache
from alphaagent.sandbox.supervisor import Sandbox

LIST_NAME = "fontlist-v999.json"
WRITE_LIST = f"import os\nopen(os.path.join(os.environ['MPLCONFIGDIR'], {LIST_NAME!r}), 'w').write('{{\"fonts\": 1}}')\n"


@pytest.fixture(autouse=True)
def no_kept_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no font list kept (the process's own stay untouched)."""
    monkeypatch.setattr(fontcache, "_lists", {})


def test_a_font_list_is_kept_once_and_seeded_alone(tmp_path: Path) -> None:
    # Given a config dir holding a font list and other files
    first = tmp_path / "first"
    first.mkdir()
    (first / LIST_NAME).write_text('{"fonts": 1}')
    (first / "matplotlibrc").write_text("backend: TkAgg\n")
    (first / "fontlist-v1.json.tmp").write_text("partial")
    fontcache.remember(first, "/py")
    # When a later dir of the same interpreter has another list, Then the first one stays kept
    later = tmp_path / "later"
    later.mkdir()
    (later / LIST_NAME).write_text('{"fonts": 2}')
    fontcache.remember(later, "/py")
    # And a new config dir gets exactly that list, for that interpreter only
    fresh, other = tmp_path / "fresh", tmp_path / "other"
    fresh.mkdir()
    other.mkdir()
    assert fontcache.seed(fresh, "/py") == 1 and fontcache.seed(other, "/other-py") == 0
    assert sorted(os.listdir(fresh)) == [LIST_NAME] and os.listdir(other) == []
    assert (fresh / LIST_NAME).read_text() == '{"fonts": 1}'


def test_a_symlinked_or_oversized_font_list_is_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a font list that is a symlink to a file elsewhere, and one over the size bound
    secret = tmp_path / "secret"
    secret.write_text("acct=ACME-123")
    config = tmp_path / "config"
    config.mkdir()
    (config / "fontlist-v1.json").symlink_to(secret)
    (config / "fontlist-v2.json").write_bytes(b"x" * 101)
    monkeypatch.setattr(fontcache, "MAX_FONT_LIST_BYTES", 100)
    # When the dir is remembered, Then neither is kept (the next zygote builds its own)
    fontcache.remember(config, "/py")
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert fontcache.seed(fresh, "/py") == 0 and os.listdir(fresh) == []


def test_what_a_run_writes_over_the_font_list_never_reaches_the_next_zygote(tmp_path: Path) -> None:
    # Given a zygote whose start wrote a font list (at the process level, a run can write its
    # scratch root), and a run that overwrites that list
    config = light(isolation="process", pool_size=0, warmup=WRITE_LIST)
    scope = tmp_path / "scope"
    scope.mkdir()
    with Sandbox(config) as first:
        assert first._scratch_root is not None
        planted = first._scratch_root / "mplconfig" / LIST_NAME
        code = f"open({str(planted)!r}, 'w').write('poisoned')"
        assert_status(first.run(code, cwd=scope, limits=RunLimits(timeout_s=10)), "ok")
        assert planted.read_text() == "poisoned"
    # When the next zygote of the interpreter starts (no warm-up of its own this time)
    with Sandbox(light(isolation="process", pool_size=0)) as second:
        assert second._scratch_root is not None
        seeded = second._scratch_root / "mplconfig" / LIST_NAME
        # Then it starts with the list as the first zygote built it, before any run
        assert seeded.read_text() == '{"fonts": 1}'
        assert second.info["preload_errors"] == {}
