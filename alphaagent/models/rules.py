"""A value of the wrong type or out of its bounds, refused in the project's words: ``must be RULE,
got VALUE``.

Pydantic words a type error in its own terms ("Input should be a valid integer, got a number with a
fractional part"); every boundary that takes values from another program or a person (the spec, an
MCP tool's arguments, a connector's request, a settings variable) says instead the rule of the field
(``a whole number from 1 to 500``, ``true or false``, ``a string``: the wording of the CLI's
options, ``alphaagent.wording.number_rule``) and the value as it was given (``shown``: JSON for a
JSON value, quoted text for typed text; the rule is in ``alphaagent.wording``'s docstring).

Example::

    value_rule(error, Constraints.model_fields["max_runs"], shown_json, "max_runs")
    # 'must be a whole number from 1 to 500, got "3"' (for the input "3")
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from alphaagent.models.bounds import ENVIRONMENT_ID_PATTERN, SCOPE_ID_PATTERN
from alphaagent.wording import (
    ARTIFACT_NAME_RULE,
    CONNECTOR_NAME_RULE,
    ENVIRONMENT_ID_RULE,
    SCOPE_ID_RULE,
    USER_ID_RULE,
    count,
    id_refusal,
    number_rule,
    shown_json,
)

_NUMBER_ERRORS = frozenset(
    {
        "int_type",
        "int_parsing",
        "int_from_float",
        "int_parsing_size",
        "float_type",
        "float_parsing",
        "finite_number",
        "bool_type",
        "bool_parsing",
        "literal_error",
    }
)
"""Pydantic's error types of a value that is not the number, boolean or constant its field takes:
the message is the field's whole rule (``field_rule``)."""

_SHAPE_ERRORS = {
    "string_type": "a string",
    "list_type": "a list",
    "tuple_type": "a list",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
}
"""Pydantic's error types of a value that is not the JSON shape its field takes, and that shape."""

TYPE_ERRORS = _NUMBER_ERRORS | frozenset(_SHAPE_ERRORS) | {"union_tag_invalid"}
"""Every type error ``value_rule`` words."""

_BOUNDS = {
    "greater_than_equal": ("ge", "≥"),
    "greater_than": ("gt", ">"),
    "less_than_equal": ("le", "≤"),
    "less_than": ("lt", "<"),
}
"""Pydantic's error types for a numeric bound of a field, its ``ctx`` key and the sign the CLI's
options use (``alphaagent.wording.number_rule``): every bound is worded the one way."""

WORDED_ERRORS = TYPE_ERRORS | frozenset(_BOUNDS)
"""Every error type ``value_rule`` words: a value of the wrong type or out of bounds."""

_UNITS = {"_s": "seconds", "_seconds": "seconds", "_mb": "MiB", "_bytes": "bytes"}
"""The unit a field's name ends with (``run_timeout_s``, ``ALPHAAGENT_LOCK_LEASE_S``), as the CLI's
options name theirs (``--timeout: must be a number of seconds > 0 and ≤ 900``)."""


ID_RULES: dict[str, str] = {
    SCOPE_ID_PATTERN: SCOPE_ID_RULE,
    r"^[A-Za-z0-9._@:-]{1,128}$": USER_ID_RULE,
    ENVIRONMENT_ID_PATTERN: ENVIRONMENT_ID_RULE,
    r"^[a-z0-9][a-z0-9._-]{0,63}$": ARTIFACT_NAME_RULE,
    r"^[a-z][a-z0-9_-]{0,31}$": CONNECTOR_NAME_RULE,
}
"""The words of each id pattern of the models (``alphaagent.models.common``; a test keeps every
pattern of the spec here), for ``string_rule``."""


def string_rule(error: ErrorDetails, shown: Callable[[Any], str]) -> str | None:
    """``must be RULE, got VALUE`` for an id that breaks its pattern (``ID_RULES``), a string out of
    its length bounds or a list out of its item bounds; None for any other error."""
    kind, ctx = error["type"], error.get("ctx", {})
    got = shown(error.get("input"))
    if kind == "string_pattern_mismatch" and str(ctx.get("pattern")) in ID_RULES:
        return id_refusal(ID_RULES[str(ctx["pattern"])], got)
    if kind == "string_too_short":
        return f"must be at least {count(int(ctx['min_length']), 'character')}, got {got}"
    if kind == "string_too_long":
        length = len(error["input"]) if isinstance(error.get("input"), str) else 0
        return (
            f"must be at most {count(int(ctx['max_length']), 'character')}, got {count(length, 'character')}"
        )
    if kind == "too_short":
        return f"must have at least {count(int(ctx['min_length']), 'item')}, got {got}"
    if kind == "too_long":
        items = count(int(ctx["actual_length"]), "item")
        return f"must have at most {count(int(ctx['max_length']), 'item')}, got {items}"
    return None


def _kinds(annotation: Any) -> list[Any]:
    """The types and literal values an annotation allows, through ``Optional``, unions and
    ``Annotated`` (``int | None`` → ``[int, NoneType]``; ``Literal[1]`` → ``[Literal, 1]``)."""
    origin = get_origin(annotation)
    if origin is Literal:
        return [Literal, *get_args(annotation)]
    if origin is Union or (origin is not None and type(annotation).__name__ == "UnionType"):
        return [kind for arg in get_args(annotation) for kind in _kinds(arg)]
    if origin is not None and hasattr(annotation, "__metadata__"):  # Annotated[...]
        return _kinds(get_args(annotation)[0])
    return [annotation]


def _unit(name: str) -> str:
    lowered = name.lower()
    return next((unit for suffix, unit in _UNITS.items() if lowered.endswith(suffix)), "")


def field_rule(info: FieldInfo, name: str = "") -> str | None:
    """The whole rule of a number, boolean or constant field, in the CLI's words: ``a whole number
    from 1 to 500``, ``a number of seconds > 0 and ≤ 900`` (the unit from ``name``'s suffix),
    ``true or false``, ``1``, ``one of "dataset", "chart", "report"``; None for any other field."""
    kinds = _kinds(info.annotation)
    if Literal in kinds:
        values = [json.dumps(kind) for kind in kinds if kind is not Literal and kind is not type(None)]
        return values[0] if len(values) == 1 else "one of " + ", ".join(values)
    if bool in kinds:
        return "true or false"
    if int not in kinds and float not in kinds:
        return None
    bounds: dict[str, float] = {}
    for item in info.metadata:
        for key in ("ge", "gt", "le", "lt"):
            value = getattr(item, key, None)
            if isinstance(value, int | float):
                bounds[key] = value
    # No field of these models has an exclusive upper bound (``lt``): ``number_rule`` states none.
    return number_rule(
        float not in kinds,
        low=bounds.get("ge"),
        high=bounds.get("le"),
        above=bounds.get("gt"),
        unit=_unit(name),
    )


def value_rule(
    error: ErrorDetails, info: FieldInfo | None, shown: Callable[[Any], str], name: str = ""
) -> str | None:
    """``must be RULE, got VALUE`` for a type or bound error of the field ``info`` (called ``name``;
    None when unknown), the value shown by ``shown``; None when ``error`` is neither
    (``WORDED_ERRORS``). A type error says the field's whole rule (``a whole number from 1 to
    500``); a bound error the bound it broke (``a whole number ≥ 1``)."""
    kind = error["type"]
    got = f", got {shown(error.get('input'))}"
    if kind in _BOUNDS and "ctx" in error:
        key, sign = _BOUNDS[kind]
        whole = info is not None and int in _kinds(info.annotation) and float not in _kinds(info.annotation)
        unit = _unit(name)
        noun = ("a whole number" if whole else "a number") + (f" of {unit}" if unit else "")
        return f"must be {noun} {sign} {error['ctx'][key]:g}{got}"
    if kind in _NUMBER_ERRORS:
        rule = field_rule(info, name) if info is not None else None
        if rule is None:
            rule = "true or false" if kind.startswith("bool") else number_rule(kind.startswith("int"))
        return f"must be {rule}{got}"
    if kind in _SHAPE_ERRORS:
        return f"must be {_SHAPE_ERRORS[kind]}{got}"
    if kind == "union_tag_invalid":
        tags = re.findall(r"'([^']*)'", str(error.get("ctx", {}).get("expected_tags", "")))
        expected = ", ".join(json.dumps(tag) for tag in tags)
        return f"must be one of {expected}, got {shown(error.get('ctx', {}).get('tag'))}"
    return None


def union_tag(error: ErrorDetails) -> str | None:
    """The field a tagged union is chosen by (``kind``), for a ``union_tag_invalid`` error, whose
    location pydantic ends at the object: the refusal names the field."""
    if error["type"] != "union_tag_invalid":
        return None
    return str(error.get("ctx", {}).get("discriminator", "")).strip("'") or None


def arguments_refusal(exc: ValidationError, model: type[BaseModel]) -> str:
    """One line naming the first offending argument of a tool whose arguments ``model`` is (an MCP
    tool's, a coder tool's) and its rule: an unknown argument first, with the closest known name
    (a misspelt one is reported by pydantic as missing, too); a value of the wrong JSON type or out
    of its bounds as ``ARG: must be RULE, got VALUE``, the value as JSON (``got "3"``)."""
    from alphaagent.suggest import did_you_mean

    names = list(model.model_fields)
    errors = sorted(exc.errors(), key=lambda error: error["type"] != "extra_forbidden")
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"]) or "arguments"
    if first["type"] == "extra_forbidden" and len(first["loc"]) == 1:
        guess = did_you_mean(where, names) or " (arguments: " + ", ".join(names) + ")"
        return f"{where}: unknown argument{guess}"
    info = model.model_fields.get(str(first["loc"][0])) if len(first["loc"]) == 1 else None
    rule = value_rule(first, info, shown_json, where) or string_rule(first, shown_json)
    return f"{where}: {rule or str(first['msg']).splitlines()[0]}"
