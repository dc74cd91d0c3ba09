"""How a scope is named in messages, on both backends (a module of its own so that the reads, the
viewer and the clients name scopes without importing the turn driver)."""

from __future__ import annotations

from alphaagent.models.common import ConversationScope, Scope


def scope_label(scope: Scope) -> str:
    """How a scope is named in messages: built only from what the caller gave."""
    if isinstance(scope, ConversationScope):
        return f"conversation {scope.conversation_id}"
    return f"workflow {scope.workflow_execution_id} node {scope.node_id}"
