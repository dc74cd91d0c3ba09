"""The "did you mean" of the project. A typo in a spec field, a connector request field, a command
name or a command-line option is answered with the closest known name (``did_you_mean``: a fixed
vocabulary, by ``difflib``). A name of the user's own data that does not exist (an artifact, a
conversation, a turn, an environment, a missing file) is answered with an existing one only when it
is a few edits away (``nearest_name``): an unrelated name is never offered. Only the standard
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


def edit_distance(a: str, b: str) -> int:
    """The number of single-character edits (insert, delete, substitute, or swap two neighbours:
    the optimal string alignment distance) that turn ``a`` into ``b``."""
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        current = [i]
        for j, cb in enumerate(b, start=1):
            best = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                best = min(best, previous2[j - 2] + 1)
            current.append(best)
        previous2, previous = previous, current
    return previous[-1]


def allowed_edits(name: str) -> int:
    """How many edits a name the user typed may be from an existing one for that one to count as
    what was meant: one per four characters (``revenu`` finds ``revenue``, a 26-character ULID
    tolerates 6), none under three characters (``a`` is no typo of ``b``)."""
    return 0 if len(name) < 3 else max(1, len(name) // 4)


def nearest_name(stray: str, known: Iterable[str]) -> str | None:
    """The existing name ``stray`` most likely meant: the one fewest edits away, if within
    ``allowed_edits(stray)`` (the first of equals, in ``known``'s order); ``None`` when none is
    that close (an unrelated name is never offered)."""
    limit = allowed_edits(stray)
    best: tuple[int, str] | None = None
    for name in known:
        if name == stray or abs(len(name) - len(stray)) > limit:
            continue
        distance = edit_distance(stray, name)
        if distance <= limit and (best is None or distance < best[0]):
            best = (distance, name)
    return None if best is None else best[1]


def did_you_mean_name(stray: str, known: Iterable[str]) -> str:
    """`` (did you mean 'revenue'?)`` when one of ``known`` (names that exist: artifacts, ids) is
    ``nearest_name`` to ``stray``, else ``""``. ``known`` must hold only what the asking user may
    see: the answer then says nothing about anyone else's names."""
    guess = nearest_name(stray, known)
    return f" (did you mean {guess!r}?)" if guess is not None else ""
