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
