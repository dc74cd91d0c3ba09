"""The README's event catalogue matches the event models (STYLE §5)."""

from __future__ import annotations

import re
from pathlib import Path

from alphaagent.models.events import EVENT_MODELS, EVENT_SOURCES, EventDetail

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_catalogue_lists_exactly_the_event_models() -> None:
    # Given the README's event table
    section = README.read_text().split("## Events", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| `([\w.]+)` \|", section, flags=re.MULTILINE)
    # Then it names every detail-type with its source, and nothing else
    assert dict(rows) == EVENT_SOURCES
    assert set(EVENT_MODELS) == set(EVENT_SOURCES)


def test_every_detail_carries_schema_version_turn_and_scope() -> None:
    for name, model in EVENT_MODELS.items():
        assert issubclass(model, EventDetail), name
        assert {"schema_version", "turn_id", "scope"} <= set(model.model_fields), name
        assert name[0].isupper() and name.endswith(("ed", "Submitted")), name
