"""Reading ``template.yaml`` in tests: CloudFormation's short tags as plain data."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

_SafeLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's parser where PyYAML was built with it: the same safe constructors and resolver, so the
same data, in a tenth of the CPU (template.yaml: ~0.03 s instead of ~0.23 s; one module parses it at
collection, for its parametrize values)."""


class CfnLoader(_SafeLoader):  # type: ignore[misc]
    """A YAML loader that reads CloudFormation's short tags (``!Ref X`` -> ``{"Ref": "X"}``,
    ``!Sub s`` -> ``{"Fn::Sub": s}``, ``!GetAtt A.B`` -> ``{"Fn::GetAtt": ["A", "B"]}``)."""


def _construct_tag(loader: Any, suffix: str, node: yaml.Node) -> dict[str, Any]:
    if isinstance(node, yaml.ScalarNode):
        value: Any = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
    if suffix == "Ref":
        return {"Ref": value}
    if suffix == "GetAtt" and isinstance(value, str):
        value = value.split(".", 1)
    return {f"Fn::{suffix}": value}


CfnLoader.add_multi_constructor("!", _construct_tag)


def load_template(path: Path) -> dict[str, Any]:
    """The template at ``path`` as data (a SafeLoader subclass: no arbitrary objects); the caller's
    own copy, read from the file as it is now."""
    return parse_template(path.read_text())


def parse_template(text: str) -> dict[str, Any]:
    """The template ``text`` as data, as :func:`load_template` reads it; the caller's own copy."""
    return copy.deepcopy(_parsed(text))


@functools.lru_cache(maxsize=16)
def _parsed(text: str) -> dict[str, Any]:
    # Even with libyaml a parse is ~0.03 s of CPU for template.yaml; a test process would pay it
    # for every test that reads the template. Keyed by the text, so an edited file is parsed afresh.
    document: dict[str, Any] = yaml.load(text, Loader=CfnLoader)
    return document
