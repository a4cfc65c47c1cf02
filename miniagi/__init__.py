"""miniagi: an autonomous agent that works toward an objective in short, inspectable steps.

Kept light on purpose: the Python worker imports this package, and `miniagi --help` must be fast.
"""

import os as _os
import sys as _sys

# Started as a command (`miniagi …`, or `python -m miniagi`, where argv[0] is "-m" while the package is located),
# the work directory may be on sys.path: Python puts it first for -m, and an empty PYTHONPATH element (the common
# `export PYTHONPATH=$PYTHONPATH:/x`) puts it in too. Code the agent ran can have written a `memory/` or `json.py`
# there that would stand in for our own modules, and run as the user, outside the sandbox: such entries go, unless
# miniagi itself lives there. (Imported as a library, the program that imports it keeps its sys.path.)
if _sys.argv[:1] == ["-m"] or _os.path.basename(_sys.argv[0] if _sys.argv else "") == "miniagi":
    _here, _cwd = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))), _os.getcwd()
    _sys.path[:] = [_entry for _entry in _sys.path
                    if _os.path.abspath(_entry or ".") != _cwd or _os.path.abspath(_entry or ".") == _here]
    del _here, _cwd

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
