"""The patches the suite applies at a module's first import (tests/after_import.py, tests/conftest.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from after_import import when_imported

TESTS = Path(__file__).resolve().parents[1]


def test_a_patch_runs_once_just_after_its_module_first_executes(tmp_path: Path, monkeypatch: object) -> None:
    # Given a module not yet imported, and a patch waiting for it
    (tmp_path / "s6_watched.py").write_text("VALUE = 'as written'\n")
    sys.path.insert(0, str(tmp_path))
    seen: list[str] = []
    try:

        def patch() -> None:
            module = sys.modules["s6_watched"]
            seen.append(module.VALUE)
            module.VALUE = "patched"

        when_imported("s6_watched", patch)
        # When it is imported, twice
        import s6_watched
        import s6_watched as again

        # Then the patch saw the executed module, once, and the importer sees the patched one
        assert seen == ["as written"]
        assert s6_watched.VALUE == again.VALUE == "patched"
        # And a patch for a module already imported runs at once
        when_imported("s6_watched", lambda: seen.append("at once"))
        assert seen == ["as written", "at once"]
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("s6_watched", None)


def test_the_suites_moto_patches_are_in_place_when_a_test_first_imports_moto() -> None:
    # Given a fresh process with the suite's conftest (nothing of moto or botocore imported)
    script = textwrap.dedent(
        """
        import sys
        import conftest
        assert not any(name.split(".")[0] in ("moto", "boto3", "botocore") for name in sys.modules)
        from moto import mock_aws  # as a test would
        from moto.dynamodb.responses import DynamoHandler
        from moto.s3.responses import S3Response
        import botocore.session
        print(getattr(DynamoHandler.call_action, "_serialised", False),
              getattr(S3Response._key_response_put, "_serialised", False),
              botocore.session.create_loader.__module__)
        """
    )
    # When it imports moto's handlers and botocore
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=TESTS, capture_output=True, text=True, check=False, timeout=60
    )
    # Then each patch is applied, as if at start-up
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "sdk_data"]
