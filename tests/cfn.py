"""Reading ``template.yaml`` in tests: CloudFormation's short tags as plain data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class CfnLoader(yaml.SafeLoader):
    """A YAML loader that reads CloudFormation's short tags (``!Ref X`` -> ``{"Ref": "X"}``,
    ``!Sub s`` -> ``{"Fn::Sub": s}``, ``!GetAtt A.B`` -> ``{"Fn::GetAtt": ["A", "B"]}``)."""


def _construct_tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
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
    """The template at ``path`` as data (a SafeLoader subclass: no arbitrary objects)."""
    document: dict[str, Any] = yaml.load(path.read_text(), Loader=CfnLoader)
    return document
