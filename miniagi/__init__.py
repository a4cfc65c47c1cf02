"""miniagi: an autonomous agent that works toward an objective in short, inspectable steps.

Kept light on purpose: the Python worker imports this package, and `miniagi --help` must be fast.
"""

__version__ = "0.1.0"
__all__ = ["Agent", "RunResult", "Settings", "ScriptedModel", "OpenAIModel", "__version__"]


def __getattr__(name: str):
    if name in ("Agent", "RunResult"):
        from . import agent

        return getattr(agent, name)
    if name == "Settings":
        from .config import Settings

        return Settings
    if name == "ScriptedModel":
        from .model import ScriptedModel

        return ScriptedModel
    if name == "OpenAIModel":
        from .endpoint import OpenAIModel

        return OpenAIModel
    raise AttributeError(f"module 'miniagi' has no attribute {name!r}")
