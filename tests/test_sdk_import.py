"""Start-up: the openai SDK is imported without the async transports it would load too."""

from __future__ import annotations

import json
import subprocess
import sys


def test_the_sdk_loads_without_the_async_transports_and_leaves_them_importable():
    """The openai SDK is imported without aiohttp and trio (only its async clients use them: ~0.1 s of CPU and ~11 MB
    at every start), and its client made as for the first request; a later import of either still works."""
    code = """
import importlib, importlib.util, json, sys
from miniagi.config import Endpoint
from miniagi.sdk_client import EndpointClient, load_sdk
ASYNC_ONLY = ("aiohttp", "trio")
openai = load_sdk()
client = EndpointClient(Endpoint("k", "http://127.0.0.1:9/v1"))
client.sdk.chat.completions  # made, as for the first request
loaded = [name for name in ASYNC_ONLY if name in sys.modules]
installed = [name for name in ASYNC_ONLY if importlib.util.find_spec(name) is not None]
imported = [name for name in installed if importlib.import_module(name).__name__ == name]
print(json.dumps({"loaded": loaded, "installed": installed, "imported": imported}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    report = json.loads(out)
    assert report["loaded"] == []
    assert report["imported"] == report["installed"]


NAMES = """
import types
def names(module):  # each name but submodules (which ones are there depends on what was used): by module and name
    return {name: f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', type(value).__name__)}"
            for name, value in ((name, getattr(module, name)) for name in dir(module))
            if not name.startswith("__") and not isinstance(value, types.ModuleType)}
PACKAGES = ("openai", "openai.types", "openai.types.responses")
"""


def _run(code: str) -> dict:
    return json.loads(subprocess.run([sys.executable, "-c", NAMES + code], capture_output=True, text=True,
                                     check=True).stdout)


def test_the_sdk_loads_without_the_packages_of_every_type_and_gives_each_name_when_asked():
    """openai.types and openai.types.responses are imported without their __init__ (every type of every API): the
    client is made as for a request without them; then each name a plain `import openai` offers is there, the same
    object (by its module and name), from threads asking at once too."""
    plain = _run("""
import json, sys
sys.modules.update(aiohttp=None, trio=None)  # as load_sdk leaves them out (the test above)
import openai, openai.types, openai.types.responses
print(json.dumps({package: names(sys.modules[package]) for package in PACKAGES}))
""")
    deferred = _run("""
import json, sys, threading
from miniagi.config import Endpoint
from miniagi.sdk_client import DEFERRED_PACKAGES, EndpointClient, load_sdk
openai = load_sdk()
EndpointClient(Endpoint("k", "http://127.0.0.1:9/v1")).sdk.chat.completions
from openai.lib.streaming._deltas import accumulate_delta
from openai.types.chat import ChatCompletion
waiting = [package for package in DEFERRED_PACKAGES if "__getattr__" in vars(sys.modules[package])]
got = []
def ask(name):
    got.append(getattr(openai.types, name, None) or getattr(openai.types.responses, name))
threads = [threading.Thread(target=ask, args=(name,)) for name in
           ("Batch", "Response", "ResponseInputParam", "Completion", "FileObject", "ResponseStreamEvent")]
[thread.start() for thread in threads]
[thread.join() for thread in threads]
print(json.dumps({"waiting": waiting, "got": len(got),
                  "names": {package: names(sys.modules[package]) for package in PACKAGES}}))
""")
    assert deferred["waiting"] == ["openai.types", "openai.types.responses"]
    assert deferred["got"] == 6
    assert deferred["names"] == plain
