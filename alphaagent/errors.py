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
    """The sandbox itself failed (the zygote died, a run could not be set up): a platform failure."""


class RetryableError(AlphaAgentError):
    """A transient failure; the same request may succeed if retried."""
