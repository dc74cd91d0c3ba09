"""The one "did you mean" of the project: a typo in a spec field, a connector request field, a
command name or a command-line option is answered with the closest known name. Only the standard
library, so that a usage error of the command line imports nothing more (``bench/cli_start.py``)."""

from __future__ import annotations

from collections.abc import Iterable

CLOSE_MATCH_CUTOFF = 0.5
"""``difflib`` ratio (0-1) a known name needs to be offered: at 0.5 ``histroy`` finds ``history``
and ``--conversaton`` finds ``--conversation``, while an unrelated word gets no guess."""


def did_you_mean(stray: str, known: Iterable[str]) -> str:
    """`` (did you mean 'history'?)`` when one of ``known`` is close to ``stray``, else ``""``."""
    import difflib

    guess = difflib.get_close_matches(stray, list(known), n=1, cutoff=CLOSE_MATCH_CUTOFF)
    return f" (did you mean {guess[0]!r}?)" if guess else ""
