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


class PathRuleError(InvalidRequestError, ValueError):
    """A workspace path broke a rule of DESIGN §4.2; the message names the rule.

    Also a ``ValueError`` so that a pydantic validator raising it reports a validation error."""


class StoreError(AlphaAgentError):
    """The record store cannot be used as asked (its file is unusable, it was closed, or it holds
    what this version cannot read)."""


class StoreSchemaError(StoreError):
    """The database was written by a newer alphaagent (a schema version this code does not know);
    it is left untouched rather than read or migrated wrongly."""


class StoreBusyError(RetryableError):
    """Other writers kept the database locked for longer than the busy timeout (10 s); retry."""


class StoreConflictError(RetryableError):
    """Concurrent writers kept winning the race for the same items (the next artifact version, or a
    transaction's items); the request may succeed if retried."""


class FileChangedError(RetryableError):
    """``put_blob``: the file was rewritten between hashing and copying (in a bucket without
    versioning, where the hashed version cannot be pinned); nothing was stored. Retrying hashes the new
    content."""


class EventPublishError(RetryableError):
    """EventBridge did not accept the entry (``FailedEntryCount`` > 0); the message names the event and
    the ``ErrorCode``/``ErrorMessage`` EventBridge gave. Publishing again may succeed (throttling,
    internal failure)."""


class EventTooLargeError(AlphaAgentError):
    """A detail is over EventBridge's 256 KiB entry limit and the bus has no claim check to carry it."""


class MissingSettingError(AlphaAgentError):
    """A function needs an environment variable that its template entry does not set."""


class NoExecutorError(AlphaAgentError):
    """Code was to be run in a process that has no executor (the turn-step functions)."""


class MissingOriginError(AlphaAgentError):
    """``LambdaExecutor.run`` was called without ``origin``: the env function must know the turn,
    session, user, scope and environment of the run."""


class EnvPayloadTooLargeError(InvalidRequestError):
    """The invocation payload (mostly the code) would not fit the 256 KiB limit of an asynchronous
    invocation and its destination record (``MAX_ASYNC_PAYLOAD_BYTES``); nothing was invoked. Write
    large inputs to files in the scope and read them from shorter code."""


class EnvInvokeError(SandboxError):
    """The Invoke call itself failed (throttled, function missing, access denied): the run never
    started and nothing recorded it."""


class EnvFunctionError(SandboxError):
    """The env function failed (crashed, timed out, ran out of memory, or a sync failed): the recorder
    has recorded the run as failed from the OnFailure destination (``RunFailed``)."""

    recorded = True


class EnvResultTimeoutError(SandboxError):
    """Neither a result nor a failure record appeared within the run's timeout plus the start-up
    margin; the run may still finish later."""


class EnvLeaseLostError(SandboxError):
    """The request's turn does not hold its scope's lease: nothing (more) is run or kept there."""


class EnvRequestExpiredError(SandboxError):
    """The invocation started, or its run ended, after the request's ``not_after``: the caller no
    longer waits, so nothing is run or kept (the failure destination records the run as failed)."""


class EnvDuplicateDeliveryError(SandboxError):
    """Another delivery of the same request (Lambda delivers an asynchronous event at least once)
    claimed the run, and its claim check did not appear while this invocation could wait: the code is
    not run a second time (DESIGN §3 step 6), so this invocation has no result to return. The other
    delivery may still finish, or it failed and its own failure was recorded."""


class TurnWaitTimeoutError(AlphaAgentError):
    """``wait_for_turn`` saw no result for the turn before its deadline. The turn itself is not
    affected: it may still be queued or running, and its result can be read later."""

    def __init__(self, turn_id: str, waited_s: float, last_status: str) -> None:
        self.turn_id = turn_id
        self.waited_s = waited_s
        self.last_status = last_status
        if last_status == "queued":  # alphaagent.aws.client.QUEUED
            # The same words for "not started yet" and "another user's turn" (DESIGN §4.7).
            state = "no turn record yet: still queued, or not a turn of this user"
        else:
            state = f"last status: {last_status}"
        super().__init__(f"turn {turn_id}: no result after {round(waited_s, 1):g} s ({state})")


class ToolError(InvalidRequestError):
    """A tool call broke a rule; the message is written for the model and names the argument."""


# Why the coder could not finish a turn: the turn driver ends the turn ``failed`` with the class name
# and the message (the worker's ``SendTaskFailure`` error and the state machine's ``Catch`` match them).
class CoderError(AlphaAgentError):
    """The coder stopped without a result: the message says why, in words for the person who asked."""

    def with_note(self, note: str) -> CoderError:
        """The same error with ``note`` (e.g. the turn's usage line) appended to its message."""
        return type(self)(f"{self} {note}")


class ModelConfigError(CoderError):
    """The model provider's configuration is incomplete; the message names the variable to set."""


class MaxTurnsError(CoderError):
    """The model used all its turns (``max_turns_for(constraints)``) without finishing."""


class ModelApiError(CoderError):
    """The model API kept failing (HTTP 5xx, 529 overloaded, 429) after the CLI's retries."""


class CoderTimeoutError(CoderError):
    """The turn ran past ``constraints.turn_timeout_s``."""


class BudgetExceededError(CoderError):
    """The turn spent its model budget (``ALPHAAGENT_MAX_BUDGET_USD``)."""


class MissingOutputsError(CoderError):
    """The model finished without registering every output the spec names."""


class InvalidMessageError(CoderError):
    """A CoderQueue message that can never be run: its body or claim check is not a valid spec for
    the scope and turn it names (never retried)."""


def contract_name(error: BaseException, contract: tuple[type[BaseException], ...]) -> str:
    """The error name a state machine's ``Retry``/``Catch`` sees for ``error``: the first class of
    ``contract`` it is an instance of, else its own class name.

    Step Functions matches ``ErrorEquals`` against the exact ``errorType`` (a Lambda's concrete class
    name, a worker's ``SendTaskFailure`` error), never against base classes; so a step names its
    contract and reports every subclass as the contract class it belongs to.

    Example::

        contract_name(StoreConflictError("..."), (ScopeBusyError, RetryableError))  # "RetryableError"
    """
    for kind in contract:
        if isinstance(error, kind):
            return kind.__name__
    return type(error).__name__


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


class InvalidEnvironmentError(InvalidRequestError):
    """An environment to register or remove broke a rule (DESIGN §4.9): ``field`` names what
    (``environment_id``, ``python``, ``preload``, ``description``, ``limits``) and ``detail`` the rule,
    so a command line can name its own flag for the field. Nothing was registered or removed."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field = field
        self.detail = detail


class EnvScopeTooLargeError(SandboxError):
    """The scope's files and the run's session state add up to more than the env function's sync cap
    (half of ``/tmp``, or ``ENV_SYNC_MAX_BYTES`` if lower: ``alphaagent.aws.env_run.sync_cap_bytes``):
    the run is refused before anything is downloaded or run, and recorded as ``RunFailed`` with this
    name. The message names the scope, its size, the state's size and the cap."""


class InvalidSettingError(InvalidRequestError, ValueError):
    """An environment variable has a value its process's settings model refuses (or a required one
    is unset): one line, naming the variable and the rule (``ALPHAAGENT_LOCK_LEASE_S: Input should be
    greater than 0``). Also a ``ValueError``, as the ``pydantic.ValidationError`` it replaces was."""


class DecodeRefusedError(ToolError):
    """A file a run wrote could not be decoded within the bounds of the child process that decodes
    untrusted compressed formats (``alphaagent.domain.decoding``): it needed more memory, CPU time or
    answer than allowed, or its decoder failed. The message says which, with the limit."""


class InvalidArgumentError(InvalidRequestError):
    """An argument of a Python call broke a rule: ``argument`` names the keyword (``queue_url``),
    ``detail`` the rule, so a command line that passed its own flag's value names its flag
    (``--queue-url``) instead of the keyword. The message is ``{argument}: {detail}``."""

    def __init__(self, argument: str, detail: str) -> None:
        super().__init__(f"{argument}: {detail}")
        self.argument = argument
        self.detail = detail
