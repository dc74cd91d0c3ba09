"""The analysis spec (DESIGN §4.5): what an orchestrating agent or a workflow hands over."""

from __future__ import annotations

import difflib
import hashlib
import json
import math
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from alphaagent.errors import InvalidSpecError, PathRuleError
from alphaagent.models.common import (
    ARTIFACT_FOLDERS,
    KIND_SUFFIXES,
    ArtifactKind,
    ArtifactName,
    ConversationScope,
    EnvironmentId,
    NodeId,
    NodeScope,
    Scope,
    Ulid,
    UserId,
    WorkspacePath,
    unknown_field,
)
from alphaagent.models.rules import WORDED_ERRORS, string_rule, union_tag, value_rule
from alphaagent.wording import SHOWN_CHARS, shown_json

if TYPE_CHECKING:
    from pydantic.fields import FieldInfo

TURN_ID_REUSED = "turn_id: already used for a different spec; leave it out to get a fresh one"
"""The refusal of a spec whose ``turn_id`` is another spec's: a turn id is an idempotency key for one
spec (``Spec.digest``). The same words on both backends and in the starter's ``SpecRejected``."""

MAX_SPEC_BYTES = 64 * 1024
"""A spec serialises to at most 64 KiB (DESIGN §4.5): it travels inside SQS messages (256 KiB) and
Step Functions state (256 KiB) with room for the envelope."""


class _Strict(BaseModel):
    """The base of every model of the spec. ``strict``: a spec is JSON from another program, so a
    value must have its field's JSON type: ``"3"`` is not a number and ``true`` is not 1 (pydantic's
    lax mode would take both). A type error is worded by ``describe_validation_error``."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _exactly_an_integer(value: Any) -> Any:
    """Refuse a boolean or a float for a literal integer (``spec_version``): pydantic's literal
    check compares by equality even in strict mode, and ``true == 1.0 == 1`` in Python."""
    if isinstance(value, bool | float):
        raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": "1"})
    return value


class DocumentInput(_Strict):
    """A document already in the scope (uploaded), made available under ``docs/``."""

    kind: Literal["document"]
    path: WorkspacePath


class DatasetInput(_Strict):
    """A dataset registered in this scope; ``version`` omitted means the latest."""

    kind: Literal["dataset"]
    name: ArtifactName
    version: int | None = Field(None, ge=1)


class ConnectorInput(_Strict):
    """A point-in-time copy fetched through a configured connector (``file``, ``http``, ``s3``)."""

    kind: Literal["connector"]
    connector: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$")]
    request: dict[str, Any]


class NodeArtifactInput(_Strict):
    """An artifact of another node of the same workflow execution (an explicit, recorded copy)."""

    kind: Literal["node_artifact"]
    node_id: NodeId
    artifact: ArtifactName
    version: int | None = Field(None, ge=1)


SpecInput = Annotated[
    DocumentInput | DatasetInput | ConnectorInput | NodeArtifactInput, Field(discriminator="kind")
]


class SpecOutput(_Strict):
    """An output the turn must register; ``path`` defaults to the kind's folder + name."""

    kind: ArtifactKind
    name: ArtifactName
    description: str | None = Field(None, max_length=2000)
    path: WorkspacePath | None = None


class Step(_Strict):
    """Pinned code: steps run in order without a model."""

    title: str = Field(min_length=1, max_length=200)
    code: str = Field(min_length=1)
    fresh: bool = False
    """Run with empty globals, leaving the session's saved live state as it is (DESIGN §4.7)."""


class Constraints(_Strict):
    """Bounds of one turn. ``max_runs`` counts run_in_env calls; timeouts are seconds."""

    max_runs: int = Field(20, ge=1, le=500)
    run_timeout_s: float = Field(60.0, gt=0, le=900)
    turn_timeout_s: float = Field(900.0, gt=0, le=86_400)


class Spec(_Strict):
    """The analysis spec. ``scope`` is a conversation or one node of a workflow run."""

    spec_version: Annotated[Literal[1], BeforeValidator(_exactly_an_integer)]
    turn_id: Ulid | None = None
    user_id: UserId
    scope: ConversationScope | NodeScope
    environment_id: EnvironmentId = "builtin"
    goal: str = Field(min_length=1, max_length=16_000)
    inputs: list[SpecInput] = Field(default_factory=list, max_length=100)
    outputs: list[SpecOutput] = Field(default_factory=list, max_length=100)
    steps: list[Step] | None = Field(None, min_length=1, max_length=100)
    constraints: Constraints = Field(default_factory=Constraints)

    @field_validator("outputs")
    @classmethod
    def _unique_output_names(cls, outputs: list[SpecOutput]) -> list[SpecOutput]:
        names = [o.name for o in outputs]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"output names must be unique: {', '.join(duplicates)}")
        return outputs

    def digest(self) -> str:
        """The SHA-256 (hex) of this spec without its ``turn_id``, as canonical JSON (sorted keys,
        defaults filled in): the fingerprint a turn id is an idempotency key for. Two specs that parse
        to the same model have the same digest, however their JSON was spelled."""
        canonical = json.dumps(
            self.model_dump(mode="json", exclude={"turn_id"}), sort_keys=True, separators=(",", ":")
        )
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _location(loc: tuple[int | str, ...]) -> str:
    """An error's location as a reader writes it (``inputs[0].connector``): see ``_walk``."""
    return _walk(loc)[0]


def _walk(loc: tuple[int | str, ...]) -> tuple[str, list[type[BaseModel]]]:
    """Follow an error's location through the spec's models: the location as a reader writes it,
    and the models at its end (the candidates of a union, one model otherwise). Pydantic inserts the
    name of the union branch it tried where a union is (``inputs, 0, "connector", "connector"``:
    the second is the field), so a part is left out only where the spec's models are a union and it
    names one of them, never where it is a field: a field may share a branch's name."""
    text = ""
    models: list[type[BaseModel]] = [Spec]
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"  # an item of the list the previous part named
            continue
        branch = [m for m in models if m.__name__ == part or _kind_of(m) == part]
        if branch and len(models) > 1:
            models = branch  # the discriminated union's branch name: noise to a reader
            continue
        owning = [m for m in models if part in m.model_fields]
        if not owning and not str(part).isidentifier():
            continue  # a validator's name pydantic gives a union of plain types (`function-after[...]`)
        models = [x for m in owning for x in _models_in(m.model_fields[str(part)].annotation)]
        text += f".{part}" if text else str(part)
    return text or "spec", models


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation may hold (through ``list``, ``X | Y``, ``Annotated`` and ``None``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in get_args(annotation) for model in _models_in(arg)]


def _kind_of(model: type[BaseModel]) -> str | None:
    """The ``kind`` a tagged union member is chosen by (``"connector"``), or None."""
    kind = model.model_fields.get("kind")
    values = get_args(kind.annotation) if kind is not None else ()
    return str(values[0]) if len(values) == 1 else None


def _fields_at(loc: tuple[int | str, ...]) -> list[str]:
    """The field names of the spec's model at ``loc`` (an error's location without its last part),
    for a suggestion; a union's branch name in ``loc`` (``connector``, ``NodeScope``) picks it."""
    return sorted({name for model in _models_at(loc) for name in model.model_fields})


def _models_at(loc: tuple[int | str, ...]) -> list[type[BaseModel]]:
    """The spec's models at ``loc`` (the candidates of a union, one model otherwise): see ``_walk``."""
    return _walk(loc)[1]


def _field_at(loc: tuple[int | str, ...]) -> FieldInfo | None:
    """The spec's field at ``loc`` (an error's location), or None (an item of a list, a union)."""
    if not loc or isinstance(loc[-1], int):
        return None
    fields = [m.model_fields[str(loc[-1])] for m in _models_at(loc[:-1]) if str(loc[-1]) in m.model_fields]
    return fields[0] if fields else None


_UNION_BRANCHES: frozenset[str] = frozenset(model.__name__ for model in get_args(Scope))
"""The names pydantic puts in an error's location for the branch of the (untagged) scope union it
tried: ``scope.ConversationScope.conversation_id``."""


def _errors_of_meant_branch(errors: list[Any]) -> list[Any]:
    """``errors`` with those of the union branch the user meant first, and those of the other
    branches of the same union left out. Pydantic tries every branch of ``conversation_id`` |
    ``workflow_execution_id`` + ``node_id`` and lists the conversation's errors first, so a typo in
    a workflow scope would be reported as a missing ``conversation_id``. The branch meant is the one
    with the fewest errors: the one whose other keys match (``{"workflow_execution_id", "nod_id"}``
    is one typo from a node scope, three from a conversation scope); a tie keeps pydantic's order."""
    first = tuple(errors[0]["loc"])
    at = next((i for i, part in enumerate(first) if part in _UNION_BRANCHES), None)
    if at is None:
        return errors
    by_branch: dict[str, list[Any]] = {}
    rest = []
    for error in errors:
        loc = tuple(error["loc"])
        if len(loc) > at and loc[:at] == first[:at] and loc[at] in _UNION_BRANCHES:
            by_branch.setdefault(str(loc[at]), []).append(error)
        else:
            rest.append(error)
    return [*min(by_branch.values(), key=len), *rest]


def describe_validation_error(exc: ValidationError, missing: Mapping[str, str] | None = None) -> str:
    """One line naming the first offending field and its rule, e.g. ``inputs[2].path: ...``.
    ``missing`` says, for a top-level field, how to supply it when it is left out (the CLI's
    ``--conversation`` for ``scope``) instead of pydantic's ``Field required``."""
    errors = _errors_of_meant_branch(list(exc.errors()))
    first = errors[0]
    message = str(first["msg"]).removeprefix("Value error, ")
    location = _location(tuple(first["loc"]))
    if first["type"] == "extra_forbidden":
        if len(first["loc"]) == 1:
            # The closest field when one is close (`outpts`), as nested fields get; else the list.
            from alphaagent.suggest import did_you_mean

            closest = did_you_mean(str(first["loc"][0]), Spec.model_fields)
            message = "unknown field" + (closest or f" (expected one of: {', '.join(Spec.model_fields)})")
        else:
            # The same help as for a top-level typo, from the field names of the model it is in.
            message = unknown_field(str(first["loc"][-1]), _fields_at(tuple(first["loc"][:-1])))
    elif first["type"] in WORDED_ERRORS:
        # The field's rule and the value as sent, as JSON (`got "3"`), not pydantic's words.
        loc = tuple(first["loc"])
        tag = union_tag(first)
        if tag is not None:
            location = f"{location}.{tag}"
        name = str(loc[-1]) if loc else ""
        message = value_rule(first, _field_at(loc), shown_json, name) or message
    elif first["type"] == "value_error" and isinstance(first.get("ctx", {}).get("error"), PathRuleError):
        # A workspace path's rule (DESIGN §4.2) and the value as sent: `outputs[0].path: must stay
        # inside the scope (...), got "../x.csv"`, not the rule alone.
        rule = str(first["ctx"]["error"]).removeprefix("path ")
        message = f"{rule}, got {shown_json(first.get('input'))}"
    elif first["type"] == "union_tag_not_found":
        # An input without its `kind`: which kinds there are, not "Unable to extract tag".
        tags = [tag for model in _models_at(tuple(first["loc"])) if (tag := _kind_of(model))]
        location = f"{location}.kind"
        message = "required, one of " + ", ".join(json.dumps(tag) for tag in tags)
    elif location == "turn_id" and first["type"] == "string_pattern_mismatch":
        message = "a 26-character ULID; leave it out to get a fresh one"
    elif (worded := string_rule(first, shown_json)) is not None:
        message = worded  # an id's rule in words, a length or item bound, and the value as JSON
    elif first["type"] == "missing":
        # A misspelled required field is reported by pydantic as missing plus an unknown sibling:
        # the typo is named where it is, with the suggestion every unknown field gets.
        parent = tuple(first["loc"][:-1])
        strays = [
            str(error["loc"][-1])
            for error in errors
            if error["type"] == "extra_forbidden" and tuple(error["loc"][:-1]) == parent
        ]
        wanted = str(first["loc"][-1])
        guess = difflib.get_close_matches(wanted, strays, n=1, cutoff=0.5)
        if guess:
            return f"{_location((*parent, guess[0]))}: unknown field (did you mean {wanted!r}?)"
        if not parent and wanted in (missing or {}):
            message = (missing or {})[wanted]
        if strays:
            message += f" (the object also has the unknown field {strays[0]!r})"
    return f"{location}: {message}"


class _NotJsonNumber(str):
    """The text of a number JSON has not (``NaN``, ``Infinity``, ``-Infinity``, which Python's
    ``json`` reads; or ``1e400``, which overflows a float to infinity), left in the parsed
    document where it was so that its refusal names the field (``_refuse_numbers_not_json``)."""


def _finite_or_not_json(text: str) -> float | _NotJsonNumber:
    value = float(text)
    return value if math.isfinite(value) else _NotJsonNumber(text)


def _json_path(path: list[int | str]) -> str:
    """A location in the spec's JSON as the refusals write it (``constraints.run_timeout_s``,
    ``inputs[0].request["a b"]``); the keys are the sender's, so one that is not a name, or is
    longer than a shown value, is JSON (and cut as ``shown_json`` cuts a value)."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part.isidentifier() and len(part) <= SHOWN_CHARS:
            text += f".{part}" if text else part
        else:
            text += f"[{shown_json(part)}]"
    return text or "spec"


def _refuse_numbers_not_json(document: dict[str, Any]) -> None:
    """Refuse a number JSON has not, naming where it is: a spec is JSON (RFC 8259 has no NaN and
    no infinity), and ``NaN`` would otherwise reach a bound's check as ``got nan``. The walk is
    iterative: a document's nesting is bounded only by what ``json.loads`` read."""
    stack: list[tuple[list[int | str], Any]] = [([], document)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, _NotJsonNumber):
            too_large = value not in ("NaN", "Infinity", "-Infinity")
            why = " (beyond the largest number, about 1.8e308)" if too_large else ""
            raise InvalidSpecError(f"{_json_path(path)}: must be a finite JSON number, got {value}{why}")
        items = (
            value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        )
        stack.extend(([*path, key], item) for key, item in reversed(list(items)))


def parse_spec(
    raw: bytes | str,
    overrides: dict[str, Any] | None = None,
    *,
    defaults: dict[str, Any] | None = None,
    missing: Mapping[str, str] | None = None,
) -> Spec:
    """Parse and validate a spec's JSON. Raises ``InvalidSpecError`` with one line naming the field.

    Checks, in order: size (at most 64 KiB of UTF-8), UTF-8, JSON, then the model. ``overrides``
    (e.g. the CLI's ``--user`` and ``--conversation``) replace or supply top-level fields first;
    ``defaults`` (e.g. the user a client is bound to) supply top-level fields the spec leaves out;
    ``missing`` says how to supply a required top-level field left out (``describe_validation_error``).
    """
    data = raw.encode("utf-8") if isinstance(raw, str) else raw
    if len(data) > MAX_SPEC_BYTES:
        raise InvalidSpecError(
            f"spec: {len(data)} bytes is larger than the {MAX_SPEC_BYTES // 1024} KiB limit"
        )
    try:
        document = json.loads(
            data.decode("utf-8"), parse_constant=_NotJsonNumber, parse_float=_finite_or_not_json
        )
    except UnicodeDecodeError as exc:
        raise InvalidSpecError(f"spec: not valid UTF-8 (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise InvalidSpecError(
            f"spec: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    except (RecursionError, ValueError) as exc:  # absurd nesting, integers of thousands of digits
        raise InvalidSpecError(f"spec: cannot be read ({type(exc).__name__})") from None
    if not isinstance(document, dict):
        raise InvalidSpecError("spec: must be a JSON object")
    _refuse_numbers_not_json(document)
    document = {**(defaults or {}), **document, **(overrides or {})}
    try:
        spec = Spec.model_validate(document)
    except ValidationError as exc:
        raise InvalidSpecError(describe_validation_error(exc, missing)) from None
    check_spec_rules(spec)
    return spec


def check_spec_rules(spec: Spec) -> None:
    """The rules between a spec's fields that need no code and no backend, so that a spec that
    could never finish is refused before anything is sent, written or run (and not after its
    steps): ``constraints.max_runs`` is at least the number of ``steps`` (each step is one run), and
    each output's ``path`` is in an artifact folder with a suffix that fits its kind (the rules
    ``register_artifact`` applies to the file later). Raises ``InvalidSpecError`` naming the field."""
    if spec.steps is not None and len(spec.steps) > spec.constraints.max_runs:
        raise InvalidSpecError(
            f"constraints.max_runs: {spec.constraints.max_runs} is fewer than the {len(spec.steps)} steps"
            " (each step is one run); raise max_runs or drop steps"
        )
    for i, output in enumerate(spec.outputs):
        if output.path is None:
            continue
        if output.path.split("/", 1)[0] not in ARTIFACT_FOLDERS or "/" not in output.path:
            raise InvalidSpecError(
                f"outputs[{i}].path: {shown_json(output.path)} must be inside datasets/, charts/, reports/"
                " or work/"
            )
        suffix = PurePosixPath(output.path).suffix.lower()
        if suffix not in KIND_SUFFIXES[output.kind]:
            allowed = ", ".join(KIND_SUFFIXES[output.kind])
            raise InvalidSpecError(
                f"outputs[{i}].path: {shown_json(output.path)} does not fit kind {shown_json(output.kind)}"
                f" (a {output.kind}"
                f" is one of {allowed})"
            )
