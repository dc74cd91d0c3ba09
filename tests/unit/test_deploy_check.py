"""The deploy path as far as it goes offline (issue 9): ``make deploy-check`` runs ``make deploy``'s own
``sam deploy`` (samconfig.toml's saved configuration, the image URIs) with no credentials at all.

It must get past every check SAM makes of its arguments and the template (a missing option, an
invalid value, an image function without a repository) and stop only where it needs an account.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_sam_deploy_with_the_saved_configuration_fails_only_for_want_of_credentials() -> None:
    # Given no credentials anywhere (the target clears them) and the saved configuration
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}

    # When make deploy-check runs sam deploy as make deploy would
    done = subprocess.run(
        ["make", "-s", "deploy-check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )

    # Then SAM stopped only at the credentials, never at its own arguments
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "Unable to locate credentials" in output
    assert "Missing option" not in output and "Invalid value" not in output
