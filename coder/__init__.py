"""The coder: a Claude Agent SDK loop that turns a spec without steps into code, runs, artifacts and
a cited answer (DESIGN §4.6), using exactly five platform tools.

``coder.settings`` needs only pydantic; ``coder.agent`` and ``coder.tools`` need the ``coder`` extra
(claude-agent-sdk with its bundled CLI). Use::

    from coder.agent import make_coder
    from coder.settings import coder_settings

    settings = coder_settings()  # None when no model is configured
    agent = AlphaAgent(coder=make_coder(settings) if settings else None)
"""
