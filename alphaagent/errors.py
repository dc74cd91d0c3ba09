"""The one error hierarchy of alphaagent.

Class names are a contract: the state machine's ``Retry``/``Catch`` and the CLI's exit codes match on
them, never on message text. A failure of user code is never one of these: it is data in the run
result (``error: {name, value, traceback}``).
"""

from __future__ import annotations


class AlphaAgentError(Exception):
    """Base of every error alphaagent raises on purpose."""


class InvalidRequestError(AlphaAgentError):
    """Input broke a documented rule; the message names the field or path and the rule."""


class SandboxError(AlphaAgentError):
    """The sandbox itself failed (the zygote died, a run could not be set up): a platform failure.

    ``recorded`` is True when the platform already recorded the run as failed (``RunFailed``), as the
    env function's failure destination does on AWS; ``run_in_env`` then publishes nothing more.
    """

    recorded: bool = False


class RetryableError(AlphaAgentError):
    """A transient failure; the same request may succeed if retried."""


class InvalidSpecError(InvalidRequestError):
    """The analysis spec is malformed, too large, or names something that does not exist."""


class NotFoundError(AlphaAgentError):
    """The thing does not exist — or belongs to another user, which is answered identically.

    The message never reveals which (DESIGN §4.7): it is built from what the caller asked for only.
    """


class ScopeBusyError(RetryableError):
    """Another turn holds the scope's lease; retry after it ends or the lease expires."""


class ArtifactError(InvalidRequestError):
    """An artifact registration broke a rule (missing file, not a regular file, wrong type)."""


class ForgedRunResponseError(AlphaAgentError):
    """An env function's success response names another run or another object than the run's own
    claim check: not the handler's answer (user code in the execution environment can post to the
    Runtime API). Nothing is recorded from it; the recorder fails, and the event ends in its
    dead-letter queue for inspection."""


class EventRejectedError(AlphaAgentError):
    """EventBridge refused an event's entry for a reason another attempt cannot fix (a validation
    error such as ``MalformedDetail`` or ``InvalidArgument``); the message names the event and the code.
    Throttling and internal errors are retried by the bus and end as ``EventPublishError`` instead."""


class EnvThrottledError(SandboxError, RetryableError):
    """Lambda throttled the invocation of an environment function (HTTP 429,
    ``TooManyRequestsException``: the function's or the account's concurrency, or the request rate)
    on every attempt: the run never started, so asking again later is safe. The message names the
    function and the number of attempts."""


class EnvStartError(SandboxError):
    """The execution environment could not start (its interpreter or zygote failed during start-up):
    a platform failure, recorded as the run's ``RunFailed`` with this name."""
