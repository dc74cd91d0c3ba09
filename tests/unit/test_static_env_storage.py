"""Static checks of the env functions' storage that moto never sees: the workspaces bucket's lifecycle
for the sessions' live state, the grant its tag needs, and the sync cap following ``/tmp`` in both
stacks (AWS audit L2, L4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from cfn import load_template

from alphaagent.aws.session_state import STATE_TAGGING

ROOT = Path(__file__).resolve().parents[2]


def _template() -> dict[str, Any]:
    return load_template(ROOT / "template.yaml")


def _environment_stack() -> dict[str, Any]:
    return load_template(ROOT / "env_images" / "environment.yaml")


def _object_grants(statements: list[dict[str, Any]]) -> set[str]:
    """The actions of the statements that name the scope prefixes' objects."""
    actions: set[str] = set()
    for statement in statements:
        if "conversations/*" in str(statement.get("Resource")):
            actions.update(statement["Action"])
    return actions


def test_old_versions_of_session_state_expire_within_a_day_and_scope_files_keep_90_days() -> None:
    # Given the workspaces bucket's lifecycle rules
    bucket = _template()["Resources"]["WorkspacesBucket"]["Properties"]
    rules = {rule["Id"]: rule for rule in bucket["LifecycleConfiguration"]["Rules"]}
    # Then the state's objects, selected by the tag the env function puts on them, lose their
    # noncurrent versions after one day (every run of a session replaces its manifest)
    state = rules["ExpireSessionStateVersions"]
    tag_key, tag_value = parse_qsl(STATE_TAGGING)[0]
    assert state["Status"] == "Enabled"
    assert state["TagFilters"] == [{"Key": tag_key, "Value": tag_value}]
    assert state["NoncurrentVersionExpiration"] == {"NoncurrentDays": 1}
    assert "Prefix" not in state, "a prefix cannot name work/sessions/ of every scope"
    # And every other object keeps its old versions 90 days (a user's file stays recoverable)
    assert rules["ExpireOldVersions"]["NoncurrentVersionExpiration"] == {"NoncurrentDays": 90}


def test_every_env_role_may_put_the_state_tag_on_scope_objects() -> None:
    # S3 authorizes a PutObject with Tagging only with s3:PutObjectTagging as well: without it every
    # run of a session would fail its state upload, in builtin and in every environment stack.
    resources = _template()["Resources"]
    builtin = resources["EnvBuiltinFunction"]["Properties"]["Policies"][0]["Statement"]
    boundary = resources["EnvBoundaryPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    stack = _environment_stack()["Resources"]
    custom = next(
        resource["Properties"]["Policies"][0]["Statement"]
        for resource in stack.values()
        if resource["Type"] == "AWS::Serverless::Function"
    )
    for statements in (builtin, boundary, custom):
        assert {"s3:PutObject", "s3:PutObjectTagging"} <= _object_grants(statements)


def test_no_stack_sets_a_sync_cap_apart_from_its_ephemeral_storage() -> None:
    # The cap is half of /tmp's real size at run time (alphaagent.aws.env_run.sync_cap_bytes), so an
    # environment stack's EphemeralStorageSize moves it; a fixed ENV_SYNC_MAX_BYTES could only lower it.
    functions = [
        resource
        for template in (_template(), _environment_stack())
        for resource in template["Resources"].values()
        if resource["Type"] == "AWS::Serverless::Function" and "EphemeralStorage" in resource["Properties"]
    ]
    assert len(functions) == 2
    for function in functions:
        variables = function["Properties"]["Environment"]["Variables"]
        assert "ENV_SYNC_MAX_BYTES" not in variables
