"""The IAM harness itself (``tests/iam.py``): what it maps each call to, and how it decides.

The end-to-end tests trust it to refuse what AWS refuses; these pin the rules that matter most,
taken from the Service Authorization Reference and the IAM policy evaluation logic. No AWS.
"""

from __future__ import annotations

from iam import Need, allowed, required

REGION, ACCOUNT = "eu-west-1", "123456789012"
BUCKET = "arn:aws:s3:::b"


def needs(service: str, operation: str, **params: object) -> list[tuple[str, str]]:
    return [(n.action, n.resource) for n in required(service, operation, dict(params), REGION, ACCOUNT)]


def test_a_copy_needs_the_source_read_and_the_target_write_and_a_version_needs_get_object_version() -> None:
    assert needs("s3", "CopyObject", Bucket="b", Key="blobs/x", CopySource={"Bucket": "b", "Key": "a/f"}) == [
        ("s3:GetObject", f"{BUCKET}/a/f"),
        ("s3:PutObject", f"{BUCKET}/blobs/x"),
    ]
    versioned = {"Bucket": "b", "Key": "a/f", "VersionId": "v1"}
    assert needs("s3", "CopyObject", Bucket="b", Key="blobs/x", CopySource=versioned)[0] == (
        "s3:GetObjectVersion",
        f"{BUCKET}/a/f",
    )
    # The string form botocore may have built by then says the same
    assert needs("s3", "CopyObject", Bucket="b", Key="k", CopySource="b/a%20f?versionId=v1")[0] == (
        "s3:GetObjectVersion",
        f"{BUCKET}/a f",
    )


def test_reads_and_deletes_of_a_version_need_the_version_actions() -> None:
    assert needs("s3", "HeadObject", Bucket="b", Key="k", VersionId="v") == [
        ("s3:GetObjectVersion", f"{BUCKET}/k")
    ]
    assert needs("s3", "DeleteObject", Bucket="b", Key="k", VersionId="v") == [
        ("s3:DeleteObjectVersion", f"{BUCKET}/k")
    ]
    assert needs("s3", "ListObjectsV2", Bucket="b", Prefix="p/") == [("s3:ListBucket", BUCKET)]


def test_a_transaction_needs_each_items_own_action_on_its_table() -> None:
    items = [
        {"Put": {"TableName": "t", "Item": {}}},
        {"ConditionCheck": {"TableName": "t", "Key": {}, "ConditionExpression": "x"}},
        {"Delete": {"TableName": "u", "Key": {}}},
    ]
    table = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table"
    assert needs("dynamodb", "TransactWriteItems", TransactItems=items) == [
        ("dynamodb:PutItem", f"{table}/t"),
        ("dynamodb:ConditionCheckItem", f"{table}/t"),
        ("dynamodb:DeleteItem", f"{table}/u"),
    ]
    assert needs("dynamodb", "Query", TableName="t", IndexName="i") == [
        ("dynamodb:Query", f"{table}/t/index/i")
    ]


def test_put_events_is_checked_per_entry_on_its_bus_and_invoke_on_the_qualified_function() -> None:
    entries = [{"EventBusName": "alphaagent", "Source": "s"}, {"Source": "s"}]
    assert [r for _, r in needs("events", "PutEvents", Entries=entries)] == [
        f"arn:aws:events:{REGION}:{ACCOUNT}:event-bus/alphaagent",
        f"arn:aws:events:{REGION}:{ACCOUNT}:event-bus/default",
    ]
    assert needs("lambda", "Invoke", FunctionName="f", Qualifier="live") == [
        ("lambda:InvokeFunction", f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:f:live")
    ]


def test_an_operation_without_a_mapping_is_not_let_through() -> None:
    try:
        needs("s3", "PutBucketPolicy", Bucket="b")
    except KeyError:
        return
    raise AssertionError("an unmapped operation must raise, so the harness refuses it")


def test_the_decision_is_iams_deny_wins_wildcards_and_missing_condition_keys() -> None:
    objects = {"Effect": "Allow", "Action": ["s3:Get*"], "Resource": f"{BUCKET}/conversations/*"}
    assert allowed([objects], "s3:GetObject", f"{BUCKET}/conversations/c/f", {})
    assert allowed([objects], "S3:getobject", f"{BUCKET}/conversations/c/f", {})  # actions ignore case
    assert not allowed([objects], "s3:GetObject", f"{BUCKET}/blobs/x", {})  # resources do not match
    assert not allowed([objects], "s3:PutObject", f"{BUCKET}/conversations/c/f", {})
    deny = {"Effect": "Deny", "Action": "s3:*", "Resource": "*"}
    assert not allowed([objects, deny], "s3:GetObject", f"{BUCKET}/conversations/c/f", {})
    listing = {
        "Effect": "Allow",
        "Action": "s3:ListBucket",
        "Resource": BUCKET,
        "Condition": {"StringLike": {"s3:prefix": ["conversations/*"]}},
    }
    assert allowed([listing], "s3:ListBucket", BUCKET, {"s3:prefix": "conversations/c/"})
    # A request without the key (a HEAD carries no s3:prefix) does not meet the condition
    assert not allowed([listing], "s3:ListBucket", BUCKET, {})
    assert Need("s3:ListBucket", BUCKET).context == ()


def test_invoke_carries_the_functions_tags_for_aws_resource_tag_conditions() -> None:
    # Lambda authorizes InvokeFunction on aws:ResourceTag/{key} (Lambda's ABAC): the harness looks the
    # function's tags up in moto and a tag condition decides as IAM would.
    import boto3
    from moto import mock_aws

    statement = {
        "Effect": "Allow",
        "Action": "lambda:InvokeFunction",
        "Resource": f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:alphaagent-env-*",
        "Condition": {"StringEquals": {"aws:ResourceTag/alphaagent-stack": "alphaagent"}},
    }
    with mock_aws():
        iam_client = boto3.client("iam", region_name=REGION)
        role = iam_client.create_role(RoleName="r", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        client = boto3.client("lambda", region_name=REGION)
        for name, tags in (
            ("alphaagent-env-ours", {"alphaagent-stack": "alphaagent"}),
            ("alphaagent-env-x", {}),
        ):
            client.create_function(
                FunctionName=name,
                Runtime="python3.13",
                Role=role,
                Handler="h.h",
                Code={"ZipFile": b"PK\x05\x06" + b"\x00" * 18},
                Tags=tags,
            )
        decisions = {}
        for name in ("alphaagent-env-ours", "alphaagent-env-x", "alphaagent-env-missing"):
            [need] = required("lambda", "Invoke", {"FunctionName": name}, REGION, ACCOUNT)
            decisions[name] = allowed([statement], need.action, need.resource, dict(need.context))
    assert decisions == {
        "alphaagent-env-ours": True,
        "alphaagent-env-x": False,
        "alphaagent-env-missing": False,
    }
