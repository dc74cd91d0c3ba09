"""alphaagent: the code-execution plane for AI agents."""

__version__ = "0.1.0"
