"""A count in a line for people: ``1 turn``, ``2 turns``, never ``turn(s)``."""

from __future__ import annotations

import pytest

from alphaagent.wording import count


@pytest.mark.parametrize(
    ("n", "noun", "plural", "said"),
    [
        (0, "turn", None, "0 turns"),
        (1, "turn", None, "1 turn"),
        (2, "artifact version", None, "2 artifact versions"),
        (1, "older turn", None, "1 older turn"),
        (3, "child", "children", "3 children"),
        (1, "child", "children", "1 child"),
    ],
)
def test_a_count_is_singular_for_one_and_plural_otherwise(
    n: int, noun: str, plural: str | None, said: str
) -> None:
    assert count(n, noun, plural) == said
