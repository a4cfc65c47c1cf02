"""Start-up: a run's first step does not open the vector store when it can hold nothing to recall for it."""

from __future__ import annotations

import json

import pytest

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


class GatedEmbedder(MiniLMEmbedder):
    """The bundled embedder, whose loading waits until the test opens the gate: chromadb and the model 'still
    loading' when a run ends, whatever the machine's speed."""

    def __init__(self):
        super().__init__()
        import threading

        self.gate = threading.Event()
        self.waiting = threading.Event()

    def _load(self) -> None:
        self.waiting.set()
        assert self.gate.wait(60), "the test never opened the gate"
        super()._load()


def recorded(home, run_id: str, workdir: str) -> None:
    """A run's trace as the run wrote it: a journal's items are stored only for a run the home knows, under the
    work directory it recorded."""
    import json

    (home / "runs" / run_id).mkdir(parents=True)
    (home / "runs" / run_id / "trace.jsonl").write_text(
        json.dumps({"type": "run_start", "settings": {"workdir": workdir}}) + "\n")


def test_a_run_that_ends_before_the_store_has_loaded_journals_its_memories_and_the_next_open_stores_them(tmp_path):
    path = tmp_path / "memory"
    embedder = GatedEmbedder()
    store = VectorMemory(path, embedder, redact=lambda text: text.replace("hunter2", "[REDACTED]"))
    items = [MemoryItem(id="r1:step:1", text="The deploy key is in vault B7 (password hunter2).", run="r1",
                        kind="step", step=1, workdir="/a"),
             MemoryItem(id="r1:answer:1", text="Final answer: vault B7", run="r1", kind="answer", workdir="/a")]
    store.add_later(items)
    assert embedder.waiting.wait(60)  # the writer is loading, and cannot finish
    store.finish()  # returns without waiting for it
    journals = list((path / "journal").glob("*.jsonl"))
    assert len(journals) == 1 and "hunter2" not in journals[0].read_text() and "B7" in journals[0].read_text()
    recorded(tmp_path, "r1", "/a")
    later = VectorMemory(path, MiniLMEmbedder())  # another process, later
    assert later.might_hold({"workdir": "/a"}) and not later.might_hold({"workdir": "/b"})
    hits = later.search("where is the deploy key", limit=2, where={"workdir": "/a"})
    assert [hit.id for hit in hits][0] == "r1:step:1" and "[REDACTED]" in hits[0].text
    assert not list((path / "journal").iterdir())  # stored, then removed
    embedder.gate.set()  # the first writer finishes too: storing the same ids again changes nothing
    store.flush()
    assert later.count() == 2


def test_a_journal_claimed_by_a_process_that_died_is_stored_by_the_next_one(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "memory"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    store = VectorMemory(path, GatedEmbedder())
    store._write_journal([MemoryItem(id="r2:note:3", text="The build needs Python 3.11.", run="r2", kind="note",
                                     workdir="/a")])
    journal = next((path / "journal").glob("*.jsonl"))
    journal.rename(journal.with_name(f"{journal.stem}.claimed-{gone.stdout.strip()}"))  # claimed, then it died
    recorded(tmp_path, "r2", "/a")
    assert VectorMemory(path, MiniLMEmbedder()).count({"run": "r2"}) == 1
    assert not list((path / "journal").iterdir())


def test_memories_of_a_short_run_are_found_by_memory_search_and_cleared_by_memory_clear(cli, llm, isolated):
    llm.add(act("memorize_thoughts", "The staging database is on port 6543."), act("done", "noted"))
    assert cli("-y", "Note the staging port", env=MEMORY_ON).returncode == 0
    found = cli("memory", "search", "staging database port", "--json", env=MEMORY_ON)
    assert "6543" in found.stdout
    run_id = run_dirs(isolated.home)[0].name
    cleared = cli("memory", "clear", "--run", run_id, "--yes", env=MEMORY_ON)
    assert cleared.returncode == 0
    assert "6543" not in cli("memory", "search", "staging database port", "--json", env=MEMORY_ON).stdout


def first_request_agent(llm, isolated, **options):
    """An agent on the scripted endpoint, and the number of tokenizer tables loaded when each call was made."""
    from memory import tokens
    from miniagi import Agent, Settings
    from miniagi.config import Endpoint
    from miniagi.endpoint import OpenAIModel

    tokens._loaded.cache_clear()
    tokens.counter_for.cache_clear()  # counts are kept per counter: a fresh one must encode (and load the table)
    loaded_at_call: list[int] = []
    model = OpenAIModel(Endpoint("k", llm.url))
    complete = model.complete

    def counting(messages, **request):
        loaded_at_call.append(tokens._loaded.cache_info().currsize)
        return complete(messages, **request)

    model.complete = counting
    settings = Settings(model="gpt-4o", yes=True, unattended=True, workdir=str(isolated.work),
                        home=str(isolated.home), **options)
    return Agent(settings, model=model, quiet=True), loaded_at_call


@pytest.mark.parametrize("memory_scope", ["off", "workdir"])
def test_a_first_request_goes_out_before_the_tokenizer_loads(llm, isolated, memory_scope):
    """A first prompt that is surely within the budget by its bytes is sent without encoding it (o200k takes
    ~0.3 s to load)."""
    agent, loaded_at_call = first_request_agent(llm, isolated, memory_scope=memory_scope)
    llm.add(act("done", "42"))
    assert agent.run("What is six times seven?").status == "done"
    assert loaded_at_call == [0]


def test_the_cost_limit_is_checked_before_the_first_call_by_a_bound_then_exactly(llm, isolated):
    from miniagi.model import PriceTable

    agent, _ = first_request_agent(llm, isolated, memory_scope="off", max_cost=0, max_reply_tokens=512)
    llm.add(act("done", "42"))
    agent.run("What is six times seven?")
    messages = llm.agent_requests()[0]["messages"]
    exact, bound = (PriceTable().ceiling("gpt-4o", messages, 512, exact=kind) for kind in (True, False))
    assert exact < bound
    # between the two: the bound by bytes would refuse, so the tokens are counted, and the call is made
    agent, loaded_at_call = first_request_agent(llm, isolated, memory_scope="off", max_cost=(exact + bound) / 2,
                                                max_reply_tokens=512)
    llm.add(act("done", "42"))
    assert agent.run("What is six times seven?").status == "done"
    assert loaded_at_call == [1] and llm.agent_requests()[1]["messages"] == messages
    # below the exact ceiling: no call at all
    agent, loaded_at_call = first_request_agent(llm, isolated, memory_scope="off", max_cost=exact * 0.95,
                                                max_reply_tokens=512)
    result = agent.run("What is six times seven?")
    assert result.status != "done" and "cost limit" in result.message and loaded_at_call == []


def test_a_run_that_a_configuration_error_discards_leaves_no_memory_behind(cli, llm, isolated):
    from .fake_llm import Fail

    llm.add(act("done", "fine"))
    assert cli("-y", "Water the ferns", env=MEMORY_ON).returncode == 0
    llm.add(Fail(404, message="model 'gpt-4o-mini' not found"))
    failed = cli("-y", "Repaint the greenhouse door", env=MEMORY_ON)
    assert failed.returncode == 2 and "does not know model" in failed.stderr
    assert len(run_dirs(isolated.home)) == 1
    assert "greenhouse" not in cli("memory", "search", "repaint the greenhouse door", "--json", env=MEMORY_ON).stdout
    assert "from 1 run " in cli("memory", "stats", env=MEMORY_ON).stdout


def test_a_program_using_the_python_api_gets_its_runs_memories_stored_not_journaled(llm, isolated):
    """Only the CLI, whose process ends right after a run, leaves a short run's memories to the journal: a program
    that goes on finds them stored when run() returns (and no thread of ours is left loading chromadb)."""
    agent, _ = first_request_agent(llm, isolated, memory_scope="workdir")
    gate = GatedEmbedder()
    agent.makings.vectors.embedder = gate
    flush = agent.makings.vectors.flush

    def flush_then_open():  # the run's end: from here on the writer may load
        gate.gate.set()
        flush()

    agent.makings.vectors.flush = flush_then_open
    llm.add(act("done", "42"))
    assert agent.run("What is six times seven?").status == "done"
    assert gate.gate.is_set() and not list((isolated.home / "memory" / "journal").glob("*"))
    assert agent.makings.vectors.count({"workdir": str(isolated.work)}) == 2  # the objective and the answer
