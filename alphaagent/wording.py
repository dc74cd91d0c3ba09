"""How a line for people says things: a number of things (``1 turn``, ``2 turns``, no ``turn(s)``),
the rule of a numeric value (``a whole number from 1 to 500``), and a value a refusal shows.

Stdlib only and tiny: the CLI imports it at startup, the MCP server, the spec's and the settings'
refusals, the pinned-steps summary and the export manifest share it so every line reads one way.

**The one rule for showing the value a refusal got** (``..., got VALUE``): the value *as given*,
in the language it was given in.

- Text a person typed (a command-line option, an environment variable): quoted as text,
  ``shown_typed``: ``--limit: must be a whole number ≥ 1, got '0'``,
  ``ALPHAAGENT_LOCK_LEASE_S: must be a number > 0, got 'abc'``.
- A JSON value (a spec's field, an MCP tool's argument, a Python client's spec): as JSON,
  ``shown_json``: ``constraints.max_runs: must be a whole number ≥ 1, got 0``; the string ``"3"``
  shows as ``"3"``, the boolean as ``true``, a missing value as ``null``: a reader tells the string
  from the number by the quotes, as in the document they sent.
"""

from __future__ import annotations

import json
from typing import Any

SHOWN_CHARS = 80
"""At most this many characters of a value are shown (a refused 16,000-character goal is not
echoed whole); a longer one is cut and ends with ``…``."""


SCOPE_ID_RULE = "1-80 characters of letters, digits, '_' and '-'"
"""A conversation, workflow execution or node id (DESIGN §4.1: ``[A-Za-z0-9_-]{1,80}``)."""
USER_ID_RULE = "1-128 characters of letters, digits and . _ @ : -"
"""A user id (DESIGN §4.1: ``[A-Za-z0-9._@:-]{1,128}``)."""
ENVIRONMENT_ID_RULE = "1-32 characters of a-z, 0-9 and '-', starting with a letter"
"""An environment id (``[a-z][a-z0-9-]{0,31}``)."""
ARTIFACT_NAME_RULE = "1-64 characters of a-z, 0-9, '.', '_' and '-', starting with a letter or digit"
"""An artifact name (DESIGN §4.1: ``[a-z0-9][a-z0-9._-]{0,63}``)."""
CONNECTOR_NAME_RULE = "1-32 characters of a-z, 0-9, '_' and '-', starting with a letter"
"""A connector's name (``[a-z][a-z0-9_-]{0,31}``)."""


def id_refusal(rule: str, shown: str) -> str:
    """The one wording of an id that breaks its rule, for a spec's field, an option and a setting
    alike: ``must be RULE, got VALUE`` (``shown`` by ``shown_json`` or ``shown_typed``)."""
    return f"must be {rule}, got {shown}"


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``1 older turn``, ``2 older turns``: ``n`` and ``noun``, plural (``noun + "s"`` unless
    ``plural`` is given) when ``n`` is not 1."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"


def _cut(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"


def shown_typed(text: str) -> str:
    """Text a person typed, quoted as text (``'0'``, ``'abc'``): see the module's rule."""
    return _cut(repr(text))


def shown_json(value: Any) -> str:
    """A JSON value as JSON (``0``, ``"3"``, ``true``, ``null``, ``[1]``): see the module's rule.
    Characters a terminal would act on are escaped (``\\u001b``); a value that is not JSON (a
    Python client's object) is shown as ``repr`` does."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return _cut(repr(value))
    if not text.isprintable():
        text = json.dumps(value, ensure_ascii=True)
    return _cut(text)


def number_rule(
    whole: bool,
    *,
    low: float | None = None,
    high: float | None = None,
    above: float | None = None,
    unit: str = "",
) -> str:
    """The one wording of a numeric rule, for an option (``cli._Number``), a spec's field and a
    setting alike: ``a whole number from 1 to 500``, ``a number of seconds > 0 and ≤ 900``,
    ``a whole number ≥ 1``. ``low``/``high`` are inclusive, ``above`` an exclusive lower bound."""
    noun = ("a whole number" if whole else "a number") + (f" of {unit}" if unit else "")
    if low is not None and high is not None:
        return f"{noun} from {low:g} to {high:g}"
    bounds = [f"> {above:g}" if above is not None else "", f"≥ {low:g}" if low is not None else ""]
    bounds.append(f"≤ {high:g}" if high is not None else "")
    return " ".join([noun, " and ".join(b for b in bounds if b)]).strip()
