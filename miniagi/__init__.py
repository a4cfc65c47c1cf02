"""miniagi: an autonomous agent that works toward an objective in short, inspectable steps.

Kept light on purpose: the Python worker imports this package, and `miniagi --help` must be fast.
"""

import os as _os
import sys as _sys

# Started as `python -m miniagi` in a work directory, Python put that directory first on sys.path, where code the
# agent ran can have written a `memory/` or `json.py` that would stand in for our own modules (and run as the user,
# outside the sandbox). While -m locates this package, argv[0] is "-m": drop the directory unless it holds miniagi.
if _sys.argv[:1] == ["-m"] and _sys.path and _sys.path[0] in ("", _os.getcwd()) \
        and _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))) != _os.getcwd():
    del _sys.path[0]

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
