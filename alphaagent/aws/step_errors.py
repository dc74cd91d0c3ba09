"""The error contract of the turn machine's Lambda steps (STYLE §4, §6; DESIGN §3).

Step Functions matches a ``Retry``/``Catch`` ``ErrorEquals`` against the exact ``errorType`` Lambda
reports, which is the concrete class name of the exception the handler raised: a ``Retry`` on
``RetryableError`` never matches ``StoreConflictError``, its subclass. Each step's handler therefore
declares its contract with :func:`state_machine_errors`: an error that belongs to a contract class
is raised as that class (the concrete name leads the message, so nothing is lost), an AWS SDK error
that is transient (throttling, a 5xx, a dropped connection, after botocore's own retries) is raised as
``RetryableError``, and anything else keeps its own name (the machine's ``States.ALL`` catches it).

``tests/unit/test_error_contract.py`` reads each step's ``error_contract`` and fails when the
machine retries or catches a name the step cannot produce, or a name it can produce is not listed.

Example::

    @state_machine_errors(ScopeBusyError, InvalidSpecError, NotFoundError)
    @logger.inject_lambda_context
    def lambda_handler(event, context): ...
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from alphaagent.aws import sdk
from alphaagent.errors import AlphaAgentError, RetryableError, contract_name

Handler = TypeVar("Handler", bound=Callable[..., Any])

TRANSIENT_AWS_CODES = frozenset(
    {
        "ThrottlingException",
        "Throttling",
        "ThrottledException",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "RequestThrottled",
        "RequestThrottledException",
        "SlowDown",
        "TransactionConflictException",
        "InternalServerError",
        "InternalError",
        "InternalFailure",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "RequestTimeout",
        "RequestTimeoutException",
    }
)
"""AWS error codes that say "try again later" (botocore's retry handler treats the same as transient)."""

_TRANSIENT_SDK_ERRORS = (
    "EndpointConnectionError",
    "ConnectionClosedError",
    "ReadTimeoutError",
    "ConnectTimeoutError",
)


def is_transient_aws_error(error: BaseException) -> bool:
    """Whether ``error`` is an AWS SDK error that a later attempt may not meet: a throttling or
    server-side code, an HTTP 5xx, or a connection that failed or timed out."""
    if not isinstance(error, sdk.sdk_errors()):
        return False
    if type(error).__name__ in _TRANSIENT_SDK_ERRORS:
        return True
    response = getattr(error, "response", None) or {}
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    return sdk.error_code(error) in TRANSIENT_AWS_CODES or status >= 500


def state_machine_errors(*contract: type[AlphaAgentError]) -> Callable[[Handler], Handler]:
    """Decorates a state-machine step's ``lambda_handler`` with its error contract.

    ``contract`` lists the classes whose names the machine's ``Retry``/``Catch`` of this step match,
    most specific first (``ScopeBusyError`` before ``RetryableError``); ``RetryableError`` is always
    part of it, since transient AWS SDK errors are reported under that name. The decorated handler
    carries the tuple as ``error_contract``.

    Raises: whatever the handler raises, as the contract class it belongs to (message
    ``"<ConcreteClass>: <message>"``), or unchanged when it belongs to none.
    """
    classes: tuple[type[AlphaAgentError], ...] = (
        contract if RetryableError in contract else (*contract, RetryableError)
    )

    def decorate(handler: Handler) -> Handler:
        @functools.wraps(handler)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            try:
                return handler(*args, **kwargs)
            except AlphaAgentError as error:
                name = contract_name(error, classes)
                kind = next((c for c in classes if c.__name__ == name), None)
                if kind is None or type(error) is kind:
                    raise
                raise kind(f"{type(error).__name__}: {error}") from error
            except Exception as error:
                if is_transient_aws_error(error):
                    raise RetryableError(f"{type(error).__name__}: {error}") from error
                raise

        wrapped.error_contract = classes  # type: ignore[attr-defined]
        return wrapped  # type: ignore[return-value]

    return decorate
