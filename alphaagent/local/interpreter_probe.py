"""What an interpreter is and what it has installed: run as a script under a candidate environment's
Python (``alphaagent env add``), and imported for the interpreter alphaagent itself runs under.

Stdlib-only and free of syntax newer than Python 3.7, so that an old interpreter still runs it far
enough to say which version it is (the caller then refuses it by name). It prints one JSON line::

    {"version": [3, 12, 4], "executable": "/opt/py312/bin/python", "packages": ["numpy==2.1.3", ...]}
"""

from __future__ import annotations

import json
import re
import sys

SKIPPED = ("pip", "setuptools", "wheel")
"""Installers, not libraries analysis code imports: left out of the list the coder sees."""


def installed_packages(limit: int) -> list[str]:
    """``name==version`` of the distributions this interpreter can import, sorted by normalised name
    (PEP 503), the first ``limit`` of them; installers (``SKIPPED``) left out."""
    from importlib.metadata import distributions

    found: dict[str, str] = {}
    for dist in distributions():
        name = dist.metadata["Name"] or ""
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key and key not in SKIPPED and key not in found:
            # The first one found wins, as it does for import (sys.path order).
            found[key] = f"{name}=={dist.version}"[:200]
    return [found[key] for key in sorted(found)][:limit]


def main() -> None:
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    report: dict[str, object] = {
        "version": list(sys.version_info[:3]),
        "executable": sys.executable,
        "packages": [],
    }
    # An old interpreter reports its version (and is refused by it); importlib.metadata is 3.8+.
    if sys.version_info >= (3, 8):  # noqa: UP036
        report["packages"] = installed_packages(limit)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
