"""Connectors are plug-ins: a connector is one module, and registering it is all it takes for spec
validation, the settings of both backends and the tool text of the coder and the MCP server to know it.
Each built-in connector's request model refuses unknown fields."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from alphaagent import connectors
from alphaagent.connectors import ConnectorSettings, fetch
from alphaagent.domain.turns import check_spec_against
from alphaagent.environments import StaticRegistry, builtin_local
from alphaagent.errors import InvalidSpecError, ToolError
from alphaagent.models.spec import parse_spec

pytestmark = pytest.mark.mcp_sdk  # imports the MCP SDK in this process (tests/conftest.py)

THROWAWAY = '''
"""A connector that serves pages from a dict: the whole of what a new connector writes."""

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from alphaagent.connectors.base import ConnectorRequest, EnvVar, Fetched, FetchLimits
from alphaagent.errors import ToolError

NAME = "wiki"


class Request(ConnectorRequest):
    page: str = Field(description="The page's title.")


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    wiki_pages: Annotated[
        tuple[str, ...], EnvVar(local="ALPHAAGENT_WIKI_PAGES", aws="CONNECTOR_WIKI_PAGES")
    ] = Field((), description="Pages the wiki connector may read.")


def describe(settings: Settings) -> str:
    return f"'wiki' reads these pages only: {', '.join(settings.wiki_pages) or 'none'}."


def fetch(request: Request, settings: Settings, limits: FetchLimits) -> Fetched:
    if request.page not in settings.wiki_pages:
        raise ToolError(f"request.page: {request.page} is not an allowed page")
    return Fetched(f"# {request.page}".encode(), request.name or f"{request.page}.md", f"wiki://{request.page}")
'''


@pytest.fixture
def wiki(tmp_path: Path) -> Iterator[ModuleType]:
    # Given a connector written as one module file, imported and registered
    path = tmp_path / "wiki_connector.py"
    path.write_text(THROWAWAY)
    spec = importlib.util.spec_from_file_location("wiki_connector", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["wiki_connector"] = module
    spec.loader.exec_module(module)
    connectors.register(module)  # type: ignore[arg-type]
    try:
        yield module
    finally:
        connectors.unregister("wiki")
        sys.modules.pop("wiki_connector", None)


def _spec(connector: str, request: dict[str, Any]) -> Any:
    return parse_spec(
        json.dumps(
            {
                "spec_version": 1,
                "user_id": "analyst@example.com",
                "scope": {"conversation_id": "c1"},
                "goal": "read a page",
                "inputs": [{"kind": "connector", "connector": connector, "request": request}],
                "steps": [{"title": "look", "code": "print(1)"}],
            }
        )
    )


def _check(spec: Any) -> None:
    backend = SimpleNamespace(environments=StaticRegistry([builtin_local()]))
    check_spec_against(backend, spec, None)  # type: ignore[arg-type]


def test_a_registered_connector_is_accepted_by_spec_validation(wiki: ModuleType) -> None:
    # When a spec names it; Then it passes, and its request model's rules apply
    _check(_spec("wiki", {"page": "Penguins"}))
    typo = r"^inputs\[0\]\.request\.pag: unknown field \(did you mean 'page'\?\)$"
    with pytest.raises(InvalidSpecError, match=typo):
        _check(_spec("wiki", {"pag": "Penguins"}))
    with pytest.raises(InvalidSpecError, match=r"^inputs\[0\]\.request\.page: Field required"):
        _check(_spec("wiki", {}))


def test_an_unregistered_connector_is_refused_naming_the_available_ones(wiki: ModuleType) -> None:
    connectors.unregister("wiki")
    with pytest.raises(
        InvalidSpecError,
        match=r'inputs\[0\]\.connector: unknown connector "wiki" \(available: file, http, s3\)',
    ):
        _check(_spec("wiki", {"page": "Penguins"}))


def test_a_registered_connector_gets_its_settings_on_both_backends_and_fetches(wiki: ModuleType) -> None:
    # Its settings field is a keyword of ConnectorSettings, read from its variable on each backend
    local = ConnectorSettings.from_env({"ALPHAAGENT_WIKI_PAGES": "Penguins, Gulls"}, "local")
    aws = ConnectorSettings.from_env({"CONNECTOR_WIKI_PAGES": "Penguins"}, "aws")
    assert local.wiki_pages == ("Penguins", "Gulls") and aws.wiki_pages == ("Penguins",)
    assert local == ConnectorSettings(wiki_pages=("Penguins", "Gulls"), file_roots=local.file_roots)
    assert "ALPHAAGENT_WIKI_PAGES" in connectors.env_variables("local")
    assert "CONNECTOR_WIKI_PAGES" in connectors.env_variables("aws")
    # And fetch goes through it, under its own rule
    assert fetch(aws, "wiki", {"page": "Penguins"}) == ("docs/Penguins.md", b"# Penguins", "wiki://Penguins")
    with pytest.raises(ToolError, match=r"^request\.page: Gulls is not an allowed page"):
        fetch(aws, "wiki", {"page": "Gulls"})


def test_a_registered_connector_is_in_the_coders_and_the_mcp_servers_tool_text(wiki: ModuleType) -> None:
    pytest.importorskip("claude_agent_sdk")
    from coder.tools import _descriptions

    ctx = SimpleNamespace(
        spec=_spec("wiki", {"page": "Penguins"}),
        backend=SimpleNamespace(connectors=ConnectorSettings(wiki_pages=("Penguins",))),
    )
    text = _descriptions(ctx)["connector_fetch"]  # type: ignore[arg-type]
    assert "'wiki' reads these pages only: Penguins." in text
    assert 'wiki: {"page", "name"?}' in text
    assert "'http' fetches a URL on these hosts only: none." in text
    pytest.importorskip("mcp")
    from alphaagent.mcp_server import run_analysis_description

    assert 'wiki: {"page", "name"?}' in run_analysis_description()


@pytest.mark.parametrize(
    ("connector", "request_", "field"),
    [
        ("file", {"path": "/tmp/x.csv", "pth": "/tmp/y.csv"}, "request.pth"),
        ("http", {"url": "https://data.example.org/x.csv", "headers": {}}, "request.headers"),
        ("s3", {"bucket": "b", "key": "k", "version": "1"}, "request.version"),
        ("http", {"url": 5}, "request.url"),
    ],
)
def test_the_builtin_request_models_refuse_unknown_and_mistyped_fields(
    connector: str, request_: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidSpecError, match=rf"^inputs\[0\]\.{field}: "):
        _check(_spec(connector, request_))
    with pytest.raises(ToolError, match=rf"^{field}: "):
        fetch(ConnectorSettings(), connector, request_)


def test_registering_a_module_that_breaks_the_shape_is_refused(wiki: ModuleType) -> None:
    clone = ModuleType("clone")
    clone.__dict__.update({k: getattr(wiki, k) for k in ("Request", "Settings", "describe", "fetch")})
    clone.NAME = "wiki2"  # type: ignore[attr-defined]
    # Its settings field is the wiki's: ConnectorSettings could not route it
    with pytest.raises(ValueError, match="settings field 'wiki_pages' is already 'wiki'"):
        connectors.register(clone)  # type: ignore[arg-type]
    clone.NAME = "Wiki"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="NAME 'Wiki'"):
        connectors.register(clone)  # type: ignore[arg-type]
    assert "wiki2" not in connectors.names()


def test_the_settings_refuse_a_field_no_connector_has() -> None:
    with pytest.raises(TypeError, match="no connector has a setting 'http_host'"):
        ConnectorSettings(http_host=("data.example.org",))


def test_the_local_variables_give_the_local_defaults_and_a_bad_value_names_the_variable() -> None:
    settings = ConnectorSettings.from_env({}, "local")
    assert settings.file_roots and settings.file_roots[0].name == "examples"
    assert settings.http_hosts == () and settings.s3_prefixes == ()
    with pytest.raises(
        ValueError, match=r"^ALPHAAGENT_HTTP_HOSTS: 'data.example.org:8443' is not a lower-case"
    ):
        ConnectorSettings.from_env({"ALPHAAGENT_HTTP_HOSTS": "data.example.org:8443"}, "local")
    # Locally a bare bucket name allows the whole bucket, as it always has; the stack's rule is stricter
    assert ConnectorSettings.from_env({"ALPHAAGENT_S3_PREFIXES": "open"}, "local").s3_prefixes == ("open",)
    with pytest.raises(ValueError, match=r"^CONNECTOR_S3_PREFIXES: 'open' is not bucket/prefix"):
        ConnectorSettings.from_env({"CONNECTOR_S3_PREFIXES": "open"}, "aws")
