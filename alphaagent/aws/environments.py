"""The AWS backend's environment registry (DESIGN §4.9): items of the state table.

``DynamoEnvironmentRegistry`` implements ``alphaagent.environments.EnvironmentRegistry`` over the
same table as ``DynamoStore``. ``builtin`` is never stored: it is the main stack's own function and
``get``/``list`` always answer it (``builtin_lambda()``). Every other environment is one item,
written by ``make env-deploy`` once its stack (``env_images/environment.yaml``) is deployed::

    entity        pk            sk                 holds
    environment   ENVIRONMENT   ENV#{environment_id}   record (the Environment's JSON)

The Prepare step and the coder read it (``GetItem``, ``Query``: the grants they have on the table);
only the operator who deploys an environment writes it (``PutItem``, ``UpdateItem``). A removed
environment keeps its item with status ``removed`` so the turns that used it still read it.

Example::

    registry = DynamoEnvironmentRegistry("alphaagent-state")
    registry.register(Environment(environment_id="gpu-ml", start=LambdaStart(
        function_name=function_name("gpu-ml"), image_uri=uri)))
    check_environment(registry, "gpu-ml")
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any, Final

from alphaagent.aws import sdk
from alphaagent.environments import BUILTIN_ID, Environment, LambdaStart, builtin_lambda, function_name
from alphaagent.errors import InvalidRequestError

PARTITION: Final = "ENVIRONMENT"
"""The one partition of the registry's items (a few dozen environments at most: one Query reads all)."""


def _sort_key(environment_id: str) -> str:
    return f"ENV#{environment_id}"


class DynamoEnvironmentRegistry:
    """The environments of one stack, in its state table ``table_name``.

    ``client`` is a boto3 DynamoDB client; if omitted, one is created on first use. Reads are
    strongly consistent, so an environment registered a moment ago is seen by the next turn.
    """

    def __init__(self, table_name: str, *, client: Any = None) -> None:
        self._table = table_name
        self._client_value = client
        self._client_lock = threading.Lock()

    @property
    def _client(self) -> Any:
        if self._client_value is None:
            with self._client_lock:
                if self._client_value is None:
                    self._client_value = sdk.client("dynamodb")
        return self._client_value

    def get(self, environment_id: str) -> Environment | None:
        """The environment (ready or removed), or None if it was never registered."""
        if environment_id == BUILTIN_ID:
            return builtin_lambda()
        item = self._client.get_item(
            TableName=self._table,
            Key={"pk": {"S": PARTITION}, "sk": {"S": _sort_key(environment_id)}},
            ConsistentRead=True,
        ).get("Item")
        return None if item is None else Environment.model_validate_json(item["record"]["S"])

    def list(self) -> list[Environment]:
        """The ready environments, ``builtin`` first, then by id."""
        found = [builtin_lambda()]
        arguments: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :env)",
            "ExpressionAttributeValues": {":pk": {"S": PARTITION}, ":env": {"S": "ENV#"}},
            "ConsistentRead": True,
        }
        while True:
            page = self._client.query(**arguments)
            for item in page.get("Items", []):
                environment = Environment.model_validate_json(item["record"]["S"])
                if environment.status == "ready":
                    found.append(environment)
            if "LastEvaluatedKey" not in page:
                break
            arguments["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        return [found[0], *sorted(found[1:], key=lambda e: e.environment_id)]

    def register(self, environment: Environment) -> None:
        """Record ``environment`` (a redeploy replaces its item; a removed one becomes ready again).

        Raises:
            InvalidRequestError: ``environment_id`` is ``builtin`` (the main stack's own), or its start
                is not the function ``alphaagent-env-{environment_id}``.
        """
        if environment.environment_id == BUILTIN_ID:
            raise InvalidRequestError("environment_id: builtin is the main stack's own and is not registered")
        start = environment.start
        if not isinstance(start, LambdaStart) or start.function_name != function_name(
            environment.environment_id
        ):
            raise InvalidRequestError(
                f"start: environment {environment.environment_id!r} runs in the function"
                f" alphaagent-env-{environment.environment_id} on AWS"
            )
        self._client.put_item(
            TableName=self._table,
            Item={
                "pk": {"S": PARTITION},
                "sk": {"S": _sort_key(environment.environment_id)},
                "entity": {"S": "environment"},
                "record": {"S": environment.model_dump_json()},
            },
        )

    def remove(self, environment_id: str) -> Environment:
        """Mark the environment removed (its specs are refused from now on); returns it.

        Raises:
            InvalidRequestError: it is ``builtin``, or it is not registered.
        """
        if environment_id == BUILTIN_ID:
            raise InvalidRequestError("environment_id: builtin cannot be removed")
        found = self.get(environment_id)
        if found is None:
            raise InvalidRequestError(f"environment_id: unknown environment {environment_id!r}")
        removed = found.model_copy(update={"status": "removed", "removed_at": datetime.now(UTC)})
        self._client.put_item(
            TableName=self._table,
            Item={
                "pk": {"S": PARTITION},
                "sk": {"S": _sort_key(environment_id)},
                "entity": {"S": "environment"},
                "record": {"S": removed.model_dump_json()},
            },
        )
        return removed
