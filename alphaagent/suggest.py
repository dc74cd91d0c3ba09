"""The one "did you mean" of the project: a typo in a spec field, a connector request field, a
command name or a command-line option is answered with the closest known name. Only the standard
library, so that a usage error of the command line imports nothing more (``bench/cli_start.py``)."""

from __future__ import annotations

from collections.abc import Iterable

CLOSE_MATCH_CUTOFF = 0.6
"""``difflib`` ratio (0-1) a known name needs to be offered: one slip (a letter swapped, missing
or extra) in a name of three letters or more scores 0.75 or more (``hmoe``/``home``, ``usr``/
``user``, ``histroy``/``history``), while two letters shared out of four (``user``/``spec``: 0.5)
is a coincidence, not a guess."""


def _bare(name: str) -> str:
    """What is compared of a name: without the leading dashes of an option, which every option
    shares (with them, any one-letter option was half like any other: ``-V`` offered ``-h``), and
    without case (``-O`` is one key away from ``-o``)."""
    return name.lstrip("-").lower()


def did_you_mean(stray: str, known: Iterable[str]) -> str:
    """`` (did you mean 'history'?)`` when one of ``known`` is close to ``stray``, else ``""``.

    Options are compared without their dashes; a one-letter name (``-V``, ``-c``) is offered only a
    name that is the same letter in the other case: one letter shares too little with anything
    else for a guess to be more likely right than wrong."""
    import difflib

    candidates: dict[str, str] = {}
    for name in known:
        candidates.setdefault(_bare(name), name)
    bare = _bare(stray)
    if len(bare) <= 1:
        found = candidates.get(bare)
        return f" (did you mean {found!r}?)" if found is not None and found != stray else ""
    guess = difflib.get_close_matches(bare, list(candidates), n=1, cutoff=CLOSE_MATCH_CUTOFF)
    return f" (did you mean {candidates[guess[0]]!r}?)" if guess else ""
