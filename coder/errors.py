"""Why the coder could not finish a turn. Each is an ``AlphaAgentError``, so the turn driver ends the
turn ``failed`` with the class name and the message; class names are a contract (the worker's
``SendTaskFailure`` error and the state machine's ``Catch`` match on them)."""

from __future__ import annotations

from alphaagent.errors import AlphaAgentError


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
