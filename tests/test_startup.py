"""Start-up: a run's first step does not open the vector store when it can hold nothing to recall for it."""

from __future__ import annotations

import json

from memory.embeddings import MiniLMEmbedder
from memory.store import MemoryItem, VectorMemory

from .conftest import MEMORY_ON, act, run_dirs


def test_the_store_knows_without_opening_it_whether_it_holds_anything_for_a_folder_or_run(tmp_path):
    path = tmp_path / "memory"
    store = VectorMemory(path, MiniLMEmbedder())
    assert not store.might_hold(None) and not store.might_hold({"workdir": "/a"})
    store.add([MemoryItem(id="1", text="the key is under the mat", run="r1", kind="note", workdir="/a")])
    fresh = VectorMemory(path, MiniLMEmbedder())  # another process, later: chromadb is not opened to answer
    assert fresh.might_hold(None) and fresh.might_hold({"workdir": "/a"}) and fresh.might_hold({"run": "r1"})
    assert not fresh.might_hold({"workdir": "/b"}) and not fresh.might_hold({"run": "r2"})
    assert fresh._collection is None
    fresh.delete()
    assert not VectorMemory(path, MiniLMEmbedder()).might_hold({"workdir": "/a"})


def test_a_first_run_recalls_nothing_at_step_1_and_a_later_run_of_the_folder_does(cli, llm, isolated):
    llm.add(act("memorize_thoughts", "The vault code is 4417."), act("done", "noted"))
    assert cli("-y", "Remember the vault code", env=MEMORY_ON).returncode == 0
    llm.add(act("done", "4417"))
    assert cli("-y", "What is the vault code?", env=MEMORY_ON).returncode == 0
    second = next(d for d in run_dirs(isolated.home) if "What is" in (d / "trace.jsonl").read_text())
    recalls = [e for e in map(json.loads, (second / "trace.jsonl").read_text().splitlines()) if e["type"] == "recall"]
    assert recalls and recalls[0]["step"] == 1
    assert "4417" in llm.agent_requests()[-1]["messages"][-1]["content"] or \
        "4417" in json.dumps(llm.agent_requests()[-1]["messages"])
