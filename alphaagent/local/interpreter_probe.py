"""What an interpreter is and what it has installed: run as a script under a candidate environment's
Python (``alphaagent env add``), and imported for the interpreter alphaagent itself runs under.

Stdlib-only and free of syntax newer than Python 3.7, so that an old interpreter still runs it far
enough to say which version it is (the caller then refuses it by name). It prints one JSON line::

    {"version": [3, 12, 4], "executable": "/opt/py312/bin/python", "packages": ["numpy==2.1.3", ...]}
"""

from __future__ import annotations

import json
import os
import re
import sys

SKIPPED = ("pip", "setuptools", "wheel")
"""Installers, not libraries analysis code imports: left out of the list the coder sees."""


def installed_packages(limit: int) -> list[str]:
    """``name==version`` of the distributions this interpreter can import, the name normalised
    (PEP 503: ``annotated-types``), sorted, the first ``limit`` of them; installers (``SKIPPED``)
    left out.

    Read from the names of the ``*.dist-info`` / ``*.egg-info`` entries on ``sys.path``
    (``{name}-{version}.dist-info``, the wheel and PEP 376 layout) rather than through
    ``importlib.metadata``, which parses every ``METADATA`` file: ~15 ms per distribution on a
    loaded machine, where a directory listing takes about a millisecond for all of them."""
    found: dict[str, str] = {}
    for entry in sys.path:
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:
            continue  # a zip file or a missing directory on the path
        for item in names:
            stem, dot, kind = item.rpartition(".")
            if not dot or kind not in ("dist-info", "egg-info"):
                continue
            name, _, version = stem.partition("-")
            if kind == "egg-info":
                version = version.split("-py", 1)[0]
            key = re.sub(r"[-_.]+", "-", name).lower()
            if key and version and key not in SKIPPED and key not in found:
                # The first one found wins, as it does for import (sys.path order).
                found[key] = f"{key}=={version}"[:200]
    return [found[key] for key in sorted(found)][:limit]


def main() -> None:
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    report: dict[str, object] = {
        "version": list(sys.version_info[:3]),
        "executable": sys.executable,
        "packages": [],
    }
    report["packages"] = installed_packages(limit)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
