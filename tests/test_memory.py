"""Memory that scales with the horizon: budgeted prompts, batched summaries, semantic recall across runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time

from memory.condense import condense, split_by_tokens
from memory.context import MESSAGE_OVERHEAD, REPLY_PRIMING
from memory.embeddings import MiniLMEmbedder
from memory.store import MemoryItem, VectorMemory
from memory.tokens import counter_for
from miniagi import Agent, OpenAIModel, Settings
from miniagi.config import Endpoint
from miniagi.state import RunState

from .conftest import MEMORY_ON, act, run_context, run_dirs
from .fake_llm import Stream, Wait

COUNTER = counter_for("gpt-4o-mini")
EMBEDDER = MiniLMEmbedder()


def prompt_tokens(messages):
    return sum(COUNTER.count(m["content"]) + MESSAGE_OVERHEAD for m in messages) + REPLY_PRIMING


def test_the_default_embedder_is_semantic():
    feline, cat, stocks = EMBEDDER.embed(["feline", "a cat sat on the mat", "stock prices fell"])
    assert feline @ cat > feline @ stocks + 0.1


def test_vector_memory_in_chromadb_adds_searches_filters_and_clears(tmp_path):
    store = VectorMemory(tmp_path / "memory", EMBEDDER)
    store.add([MemoryItem("r1:step:1", "The server listens on port 8080", "r1", "step", 1),
               MemoryItem("r1:note:2", "Remember to compress the logs", "r1", "note", 2),
               MemoryItem("r2:step:1", "Quarterly revenue grew by 12 percent", "r2", "step", 1)])
    store.add([MemoryItem("r1:step:1", "The server listens on port 8080", "r1", "step", 1)])  # same id: no copy
    assert store.stats()["items"] == 3 and store.stats()["runs"] == 2
    hits = store.search("which TCP port does the service use?", 3)
    assert hits[0].id == "r1:step:1" and hits[0].run == "r1" and hits[0].step == 1
    assert [h.run for h in store.search("port", 3, where={"run": "r2"})] == ["r2"]
    reopened = VectorMemory(tmp_path / "memory", EMBEDDER)  # persistent
    assert reopened.search("money earned", 1)[0].id == "r2:step:1"
    assert reopened.delete({"run": "r1"}) == 2 and reopened.stats()["items"] == 1


def test_split_by_tokens_respects_the_limit_and_natural_boundaries():
    paragraphs = [f"Paragraph {i}. " + "Sentence about things. " * 30 for i in range(20)]
    text = "\n\n".join(paragraphs)
    chunks = split_by_tokens(text, COUNTER, 300)
    assert all(COUNTER.count(c) <= 300 for c in chunks) and len(chunks) > 5
    assert all(c.startswith("Paragraph") or c.startswith("Sentence") for c in chunks)
    assert "".join(c.replace(" ", "").replace("\n", "") for c in chunks) == text.replace(" ", "").replace("\n", "")
    overlapped = split_by_tokens(text, COUNTER, 300, overlap=20)
    # each chunk after the first begins with the last 20 tokens of the one before, then goes on as it did
    tail = COUNTER.encoding.decode(COUNTER.encoding.encode(chunks[0])[-20:])
    assert len(overlapped) == len(chunks) and overlapped[0] == chunks[0]
    assert overlapped[1] == tail + " " + chunks[1] and COUNTER.count(tail) == 20
    assert split_by_tokens("x" * 10000, COUNTER, 100)  # no boundary at all still splits


def test_condense_reduces_hierarchically_to_one_text():
    calls = []

    def ask(prompt):
        calls.append(prompt)
        if "Merge them into ONE" in prompt:
            return "MERGED: " + " ".join(line for line in prompt.splitlines() if line.startswith("facts"))[:400]
        part = prompt.split("UNTRUSTED DATA: text, part ")[1].split(".")[0]
        return f"facts of part {part}"

    text = "\n\n".join(f"Section {i}: " + "detail " * 400 for i in range(30))  # ~12k tokens
    result = condense(text, ask, COUNTER, target_tokens=200, chunk_tokens=1000)
    assert result.startswith("MERGED:") and COUNTER.count(result) <= 200
    assert sum("Merge them into ONE" in c for c in calls) == 1  # a single final text
    assert len(calls) > 10


def test_the_summarizer_is_not_asked_to_condense_what_is_within_its_target():
    calls = []
    text = "A short file of ninety-five words or so. " * 10
    assert condense(text, calls.append, COUNTER, target_tokens=COUNTER.count(text)) == text and not calls
    numbers = " ".join(str(4000 + 37 * i) for i in range(200))  # many tokens a word: fewer words asked for
    condense(numbers, lambda prompt: calls.append(prompt) or "short", COUNTER, target_tokens=100)
    asked = int(calls[0].split("at most ")[1].split(" words")[0])
    assert asked < len(numbers.split()) and asked <= 100


def test_a_100_step_run_stays_in_budget_recalls_an_old_fact_and_calls_the_model_rarely(llm, isolated):
    budget = 4000
    agent_calls = []

    def respond(request):
        if request["model"] == "summarizer-model":
            return "Summary: the agent printed many long weather reports and is still going."
        agent_calls.append(request["messages"])
        n = len(agent_calls)
        if n == 1:
            return act("execute_python", "print('The launch code for the rocket is ALPHA-7731.')")
        if n == 60:
            return act("execute_python", "print('checking')", "I need the launch code for the rocket from earlier")
        if n == 100:
            return act("done", "finished")
        return act("execute_python", f"print(('weather report {n}: cloudy with rain, wind from the west. ') * 50)",
                   f"print weather report {n}")

    llm.responder = respond
    settings = Settings(model="gpt-4o-mini", summarizer_model="summarizer-model", yes=True, unattended=True,
                        max_steps=120, max_context_tokens=budget, max_memory_item_tokens=700,
                        workdir=str(isolated.work), home=str(isolated.home))
    model = OpenAIModel(Endpoint(api_key="k", base_url=llm.url))
    result = Agent(settings, model=model).run("Print weather reports, then launch the rocket")
    assert result.status == "done" and result.steps == 100

    sizes = [prompt_tokens(messages) for messages in agent_calls]
    assert max(sizes) <= budget
    all_calls = len(llm.requests)
    assert all_calls / result.steps <= 1.25, f"{all_calls} model calls over {result.steps} steps"
    summaries = [r for r in llm.requests if r["model"] == "summarizer-model"]
    assert summaries, "old steps were never folded into the summary"

    after_question = json.dumps(agent_calls[60])  # the prompt right after the thought asked for it
    assert "ALPHA-7731" in after_question
    assert not any(m["content"].startswith("Observation (step 1):") for m in agent_calls[60])  # out of view
    recalled = agent_calls[60][-1]["content"].split("<<<UNTRUSTED DATA: recalled memories")[1]
    assert "ALPHA-7731" in recalled  # it came back by recall, at the end of the newest message
    assert "SUMMARY OF STEPS 1-" in json.dumps(agent_calls[-1])
    (directory,) = run_dirs(isolated.home)
    kinds = {json.loads(line)["type"] for line in (directory / "trace.jsonl").read_text().splitlines()}
    assert {"summary", "recall"} <= kinds


def test_a_fact_learned_in_one_run_is_recalled_by_the_next_in_a_new_process(cli, llm, isolated):
    llm.add(act("execute_python", "print('The office wifi network is called Nebula and its passphrase is "
                                  "sunflower-42.')"),
            act("done", "Found the wifi details."))
    assert cli("-y", "Find out the office wifi details", env=MEMORY_ON).returncode == 0
    llm.add(act("done", "It is sunflower-42."))
    proc = cli("-y", "How do I join the office wifi?", env=MEMORY_ON)
    assert proc.returncode == 0, proc.stderr
    first_prompt = json.dumps(llm.agent_requests()[-1]["messages"])
    assert "RELEVANT MEMORIES" in first_prompt and "sunflower-42" in first_prompt
    # the trace keeps what was recalled, as the prompt showed it (show and the UI display it)
    trace = [json.loads(line) for line in (run_dirs(isolated.home)[-1] / "trace.jsonl").read_text().splitlines()]
    items = [item for event in trace if event["type"] == "recall" for item in event["items"]]
    assert any("sunflower-42" in item["text"] and item["label"].startswith("run ") for item in items)

    found = cli("memory", "search", "passphrase of the Nebula wifi network", "--json")
    best = json.loads(found.stdout)[0]
    assert found.returncode == 0 and "sunflower-42" in best["text"] and best["kind"] == "step"
    stats = cli("memory", "stats", "--json")
    assert json.loads(stats.stdout)["runs"] == 2
    assert "removed" in cli("memory", "clear", "--yes").stdout
    assert json.loads(cli("memory", "stats", "--json").stdout)["items"] == 0


def test_embeddings_can_come_from_the_endpoint(cli, llm, isolated):
    llm.add(act("memorize_thoughts", "The deploy key lives in the blue vault."), act("done", "ok"))
    assert cli("-y", "--embedding-model", "text-embedding-3-small", "Where is the deploy key?",
               env=MEMORY_ON).returncode == 0
    found = cli("memory", "search", "blue vault", "--json", "--embedding-model", "text-embedding-3-small")
    assert llm.embedding_requests and llm.embedding_requests[0]["model"] == "text-embedding-3-small"
    assert any("blue vault" in hit["text"] for hit in json.loads(found.stdout))
    local = json.loads(cli("memory", "stats", "--json").stdout)
    assert local["items"] == 0 and local["embedder"] == "minilm-l6-v2"  # separate spaces never mix


def test_what_other_runs_did_is_recalled_only_when_relevant(cli, llm, isolated):
    """Issue 22, item 11: a question about arithmetic once recalled another run's objective ("sleep again") and
    another run's ingest_data step; a step of another run that used the same command (execute_python) was near
    enough to be recalled too. Command names are no longer part of what recall compares."""
    (isolated.work / "notes.txt").write_text("Meeting notes. The team agreed to move the release to March.\n" * 5)
    llm.add(act("execute_shell", "sleep 0", "Sleep for a moment again"), act("done", "slept"))
    assert cli("-y", "sleep again", env=MEMORY_ON).returncode == 0
    llm.add(act("ingest_data", "notes.txt", "Read the notes file into memory"), act("done", "read"))
    assert cli("-y", "Read notes.txt into memory", env=MEMORY_ON).returncode == 0
    llm.add(act("execute_python", "print('cloudy with rain')", "print the weather"), act("done", "cloudy"))
    assert cli("-y", "Tell me the weather", env=MEMORY_ON).returncode == 0
    asked = len(llm.agent_requests())
    llm.add(act("execute_python", "print(6 * 7)", "Compute six times seven"), act("done", "42"))
    assert cli("-y", "What is six times seven?", env=MEMORY_ON).returncode == 0
    prompts = json.dumps([request["messages"] for request in llm.agent_requests()[asked:]])
    assert "RELEVANT MEMORIES" not in prompts
    assert not any(word in prompts for word in ("sleep", "release", "cloudy"))


def test_run_scope_keeps_other_runs_out(cli, llm, isolated):
    llm.add(act("execute_python", "print('The staging database host is db-stage-17.')"), act("done", "ok"))
    assert cli("-y", "Find the staging database host", env=MEMORY_ON).returncode == 0
    llm.add(act("done", "unknown"))
    assert cli("-y", "--memory-scope", "run", "Which host runs the staging database?").returncode == 0
    assert "db-stage-17" not in json.dumps(llm.agent_requests()[-1]["messages"])


def test_help_and_runs_without_memory_never_load_chromadb(isolated):
    probe = """
import sys
from miniagi.cli import main
try:
    main(["--help"])
except SystemExit:
    pass
assert "chromadb" not in sys.modules and "onnxruntime" not in sys.modules, "--help loaded memory"
from miniagi import Agent, ScriptedModel, Settings
Agent(Settings(memory_scope="off", unattended=True), model=ScriptedModel(["<r>t</r><c>done</c>ok"])).run("x")
print("chromadb" in sys.modules, "onnxruntime" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=isolated.work,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1].split() == ["False", "False"]


def test_a_summary_over_its_cap_is_condensed_never_cut_and_says_what_moved_out(isolated):
    """The limit the summarizer is told is the one enforced: a summary over it is condensed by one more call; a
    summarizer that ignores that too has its newest lines kept and a first line saying what moved out and how to get
    it back (recall: the steps are whole in the archive), never a text cut in the middle."""
    from memory.context import ContextBuilder, StepRecord
    from memory.run_memory import RunMemory
    from memory.summarizer import MOVED_OUT

    prompts = []

    def ask(prompt):
        prompts.append(prompt)
        if prompt.startswith("This summary") and len(prompts) % 2:  # the first condensing keeps to its words
            return "Condensed: the listing was read, line by line."
        return "\n".join(f"Line {i}: a long summary sentence about output line {i}." for i in range(400))

    builder = ContextBuilder(COUNTER, 3000)
    memory = RunMemory(builder=builder, summarizer_counter=COUNTER, ask_summarizer=ask, store=None, scope="global",
                       run_id="r", state=RunState(objective="objective"))
    steps = [StepRecord(i, f"t{i}", "execute_shell", "ls", "output line\n" * 150) for i in range(1, 30)]
    for number in range(2, 30):
        context, folded = run_context(memory, system="system", steps=steps[:number - 1], next_step=number, alerts="")
        assert context.tokens <= 3000
    condensing = [p for p in prompts if p.startswith("This summary")]
    assert condensing and all(re.search(r"at most \d+ words", p) for p in condensing)
    summary = memory.summary.text
    assert COUNTER.count(summary) <= memory.summary_cap + builder.notes_cap  # no notes: all theirs
    if summary.startswith(MOVED_OUT):  # the newest lines, whole, after what moved out
        assert re.match(r"Moved out \(use recall to get them back\): \d+ earlier lines", summary)
        assert summary.endswith("Line 399: a long summary sentence about output line 399.")
        assert all(re.fullmatch(r"Line \d+: a long summary sentence about output line \d+\.", line)
                   for line in summary.split("\n")[1:])
    else:
        assert summary == "Condensed: the listing was read, line by line."
    assert "the rest was cut" not in summary


def test_machines_share_one_memory_through_a_chromadb_server(cli, llm, tmp_path):
    import socket
    import time
    from pathlib import Path

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    chroma = Path(sys.executable).parent / "chroma"
    server = subprocess.Popen([str(chroma), "run", "--path", str(tmp_path / "server"), "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        url = f"http://127.0.0.1:{port}"
        llm.add(act("execute_python", "print('The build server of the Orion team is called hopper-9.')"),
                act("done", "noted"))
        first_machine = {**MEMORY_ON, "MINIAGI_HOME": str(tmp_path / "machine-a"), "MINIAGI_MEMORY_URL": url}
        assert cli("-y", "Find the Orion team's build server", env=first_machine).returncode == 0
        llm.add(act("done", "hopper-9"))
        second_machine = {**MEMORY_ON, "MINIAGI_HOME": str(tmp_path / "machine-b"), "MINIAGI_MEMORY_URL": url}
        assert cli("-y", "Which build server does the Orion team use?", env=second_machine).returncode == 0
        assert "hopper-9" in json.dumps(llm.agent_requests()[-1]["messages"])  # recalled from the other machine
        assert not (tmp_path / "machine-a" / "memory").exists() and not (tmp_path / "machine-b" / "memory").exists()
        stats = json.loads(cli("memory", "stats", "--json", env=second_machine).stdout)
        assert stats["runs"] == 2 and stats["path"] == url
    finally:
        server.terminate()
        server.wait(timeout=10)
    # with the server gone, a run warns and goes on without vector memory
    llm.add(act("done", "still fine"))
    proc = cli("-y", "Carry on", env={**MEMORY_ON, "MINIAGI_MEMORY_URL": url})
    assert proc.returncode == 0 and "vector memory disabled" in proc.stderr


def test_a_fact_from_step_1_is_recalled_after_30_unrelated_steps(llm, isolated):
    """The shape that once lost the fact in 2 of 5 runs on a busy machine: what leaves the view is flushed to
    the store first, so recall does not depend on how far the background writer lags."""
    agent_calls = []

    def respond(request):
        if request["model"] == "summarizer-model":
            return "Summary: the agent printed weather reports."
        agent_calls.append(request["messages"])
        n = len(agent_calls)
        if n == 1:
            return act("execute_python", "print('Security memo: the vault code is PLUM-4471.')", "read the memo")
        if n == 32:
            return act("memorize_thoughts", "I need the vault code from the security memo",
                       "I need the vault code from the security memo")
        if n == 33:
            return act("done", "PLUM-4471")
        return act("execute_python", f"print(('Weather report {n}: cloudy, light rain, wind from the west. ') * 30)",
                   f"print weather report {n}")

    llm.responder = respond
    settings = Settings(model="gpt-4o-mini", summarizer_model="summarizer-model", yes=True, unattended=True,
                        max_context_tokens=4000, workdir=str(isolated.work), home=str(isolated.home))
    result = Agent(settings, model=OpenAIModel(Endpoint(api_key="k", base_url=llm.url))).run("Open the vault")
    assert result.status == "done"
    final = agent_calls[-1]
    assert not any(m["content"].startswith("Observation (step 1):") for m in final)  # long out of view
    assert "PLUM-4471" in json.dumps(final)


def test_a_memorize_thoughts_step_leaves_only_its_note_in_the_store(llm, isolated):
    """The note is always in view under YOUR NOTES: storing its step too would have recall show it twice."""
    settings = Settings(model="gpt-4o-mini", yes=True, unattended=True, workdir=str(isolated.work),
                        home=str(isolated.home), memory_scope="run")
    agent = Agent(settings, model=OpenAIModel(Endpoint(api_key="k", base_url=llm.url)), quiet=True)
    llm.add(act("memorize_thoughts", "The gate code is 5521."), act("execute_shell", "echo checked"),
            act("done", "5521"))
    result = agent.run("Find the gate code")
    ids = set(agent.makings.vectors.collection.get(where={"run": result.run_id}, include=[])["ids"])
    run = result.run_id
    assert f"{run}:note:1" in ids and f"{run}:step:2" in ids and f"{run}:step:1" not in ids


def test_an_output_over_the_item_budget_keeps_what_the_step_asked_for_not_its_head_and_tail(cli, llm):
    """The first cut of a long output (to --max-memory-item-tokens) keeps the lines that matter to the step's
    thought and argument, wherever they are, and says how to see the rest: a head-and-tail cut lost the middle."""
    code = ("for i in range(400):\n"
            "    print(f'row {i}: status nominal, nothing to report here today')\n"
            "    if i == 200:\n"
            "        print('the gate key is ZETA-9157')")
    llm.add(act("execute_python", code, "find the gate key in the rows"), act("done", "ZETA-9157"))
    proc = cli("-y", "--max-memory-item-tokens", "300", "Find the gate key")
    assert proc.returncode == 0, proc.stderr
    shown = json.dumps(llm.agent_requests()[1]["messages"])
    assert "the gate key is ZETA-9157" in shown
    assert "print a part of it (a slice, a search) to see the rest" in shown


def test_recall_finds_an_out_of_view_step_the_writer_has_not_written_yet_without_a_flush(tmp_path, monkeypatch):
    """Recall searches what the background writer holds beside what chromadb holds: an out-of-view step of this
    run is found while its write still lingers, and recall neither flushes nor waits for it."""
    import memory.store as store_module
    from memory.context import ContextBuilder, StepRecord, Summary
    from memory.run_memory import RunMemory

    monkeypatch.setattr(store_module, "WRITE_LINGER_S", 600.0)  # the writer holds its batch: nothing is written
    store = VectorMemory(tmp_path / "memory", EMBEDDER)
    store.add([MemoryItem("old:step:1", "Unrelated: the cafeteria serves soup on Tuesdays", "old", "step", 1)])
    builder = ContextBuilder(COUNTER, 4000)
    memory = RunMemory(builder=builder, summarizer_counter=COUNTER, ask_summarizer=lambda prompt: "unused",
                       store=store, scope="run", run_id="r",
                       state=RunState(objective="Open the vault",
                                      summary=Summary("The agent read a memo, then weather reports.", 3)))
    steps = [StepRecord(1, "read the security memo", "execute_python", "print(memo)",
                        "Security memo: the vault code is PLUM-4471."),
             *[StepRecord(i, f"print weather report {i}", "execute_python", "print(w)", f"Weather {i}: cloudy.")
               for i in range(2, 6)]]
    for record in steps:
        memory.remember(*memory.step_items(record))
    memory.remember(MemoryItem("other:step:1", "the vault code is FAKE-0000 in another run", "other", "step", 1))
    assert store.pending(["r:step:1"]) and store.count() == 1
    steps.append(StepRecord(6, "I need the vault code from the security memo", "execute_python", "print(1)", "1"))
    context, _ = memory.context(system="system", steps=steps, next_step=7)
    assert [item.id for item in memory.last_recalled][:1] == ["r:step:1"]
    assert "PLUM-4471" in json.dumps(context.messages) and "FAKE-0000" not in json.dumps(context.messages)
    assert store.pending(["r:step:1"]) and store.count() == 1  # found while still unwritten: no flush
    store.flush()
    assert store.count() == 7


def test_a_search_merges_pending_items_with_stored_ones_at_the_stores_own_distances(tmp_path, monkeypatch):
    """What the writer has not written yet is ranked by exactly the distance chromadb gives it once written,
    under the same filter; a pending new version of a stored item replaces it."""
    import memory.store as store_module

    monkeypatch.setattr(store_module, "WRITE_LINGER_S", 600.0)
    store = VectorMemory(tmp_path / "memory", EMBEDDER)
    store.add([MemoryItem("a:step:1", "The server listens on port 8080", "a", "step", 1),
               MemoryItem("a:step:2", "Quarterly revenue grew by 12 percent", "a", "step", 2)])
    store.add_later([MemoryItem("b:step:1", "The database listens on port 5432", "b", "step", 1),
                     MemoryItem("a:step:2", "The proxy forwards port 443 to port 8443", "a", "step", 2),
                     MemoryItem("b:step:2", "Lunch is at noon", "b", "step", 2, workdir="/w")])
    query = [store.embed_one("which port does the service listen on?")]
    before = store.search_by(query, 3)
    assert store.pending(["b:step:1"]) and store.count() == 2
    assert "Quarterly" not in " ".join(hit.text for hit in before)  # replaced by its pending version
    assert [hit.run for hit in store.search_by(query, 5, {"run": "b"})] == ["b", "b"]
    assert [hit.id for hit in store.search_by(query, 5, {"workdir": "/w"})] == ["b:step:2"]
    assert store.search_by(query, 5, {"$and": [{"run": "b"}, {"step": {"$gte": 2}}]})[0].id == "b:step:2"
    store.flush()
    after = store.search_by(query, 3)
    assert [hit.id for hit in after] == [hit.id for hit in before]

    def same(a: dict, b: dict) -> bool:  # chromadb may give a stored time back a last digit off (1e-7 s)
        return a.keys() == b.keys() and all(a[k] == b[k] or (k == "time" and abs(a[k] - b[k]) < 1e-3) for k in a)

    assert all(abs(x.distance - y.distance) < 1e-4 and x.text == y.text and same(x.metadata, y.metadata)
               for x, y in zip(before, after)), [(x.id, x.distance, y.distance, x.metadata, y.metadata)
                                                 for x, y in zip(before, after)]


def test_the_terminal_says_when_steps_leave_the_view_for_the_summary(cli, llm):
    """Found by a capable model in the loop: nothing on the terminal showed the memory at work. When steps leave the
    view, a line says what covers them now."""
    llm.responder = lambda request: ("The agent printed long reports of rows." if request["model"] == "summarizer-model"
                                     else None)
    code = "for i in range(60):\n    print(f'report {n}, row {{i}}: the pump at bay {{i}} runs at {{4000 + i}} rpm')"
    llm.add(*[act("execute_python", code.format(n=n), f"read report {n}") for n in range(1, 9)], act("done", "read"))
    proc = cli("-y", "--max-context-tokens", "2500", "--summarizer-model", "summarizer-model", "Read the reports")
    assert proc.returncode == 0, proc.stderr
    summaries = [r for r in llm.requests if r["model"] == "summarizer-model"]
    assert summaries  # steps left the view
    assert "memory: the summary now covers steps 1-" in proc.stdout + proc.stderr


class _Watched(threading.Event):
    """An event that remembers whether a wait for it ran out (the scripted stream resumed without it)."""

    ran_out = False

    def wait(self, timeout=None):
        done = super().wait(timeout)
        self.ran_out = self.ran_out or not done
        return done


def test_the_next_recall_is_looked_up_while_the_reply_still_streams_in(llm, isolated, monkeypatch):
    """Recall asks about what the agent is doing (its thought): that is known as soon as the reply names its command,
    so the lookup (embedding the query, searching) starts then, while the rest of the reply (the code) streams in,
    off the loop's path, once recall searches the vector store: here after the recall command asked it by meaning
    (it holds an earlier item). The stream is held until the query has been embedded."""
    VectorMemory(isolated.home / "memory", EMBEDDER).add(  # the store holds something: the recall command opens it
        [MemoryItem("old:step:1", "The pressure gauges were read last week", "old", "step", 1)])
    embedded = _Watched()
    original = MiniLMEmbedder.embed

    def embed(self, texts):
        if any("compare the gauge figures" in text for text in texts):
            embedded.set()
        return original(self, texts)

    monkeypatch.setattr(MiniLMEmbedder, "embed", embed)
    llm.add(act("recall", "pressure gauges", "what is known of the gauges"),
            act("execute_python", "print('gauge A: 41 kPa')", "read gauge A"),
            Stream(["<r>compare the gauge figures</r>", "<c>execute_python</c>\n", Wait(embedded, 30),
                    "print('gauge B: 44 kPa')"]),
            act("done", "B is higher"))
    settings = Settings(model="gpt-4o-mini", yes=True, unattended=True, workdir=str(isolated.work),
                        home=str(isolated.home), memory_scope="global")
    result = Agent(settings, model=OpenAIModel(Endpoint(api_key="k", base_url=llm.url)), quiet=True).run(
        "Which gauge reads higher?")
    assert result.status == "done"
    assert embedded.is_set() and not embedded.ran_out  # embedded while the reply was held mid-stream


def _drained(memory) -> None:
    """Wait until the lookup thread has done what it was given."""
    done = threading.Event()
    memory.recaller._lookup(done.set)
    assert done.wait(60)


def test_steps_a_summary_will_take_out_of_view_are_embedded_while_the_model_is_asked(tmp_path, monkeypatch):
    """Recall never returns a step in view, so what waits for the writer is embedded for search only once it may
    leave the view: when the loop waits for the model, the steps out of view or that the summary being made will
    take out are embedded (in the lookup thread), so that the search after the fold need not embed them; the steps
    staying in view are left to the writer."""
    import memory.store as store_module
    from memory.context import ContextBuilder, StepRecord, Summary
    from memory.run_memory import Preparation, RunMemory

    monkeypatch.setattr(store_module, "WRITE_LINGER_S", 600.0)  # nothing is written: everything stays pending
    monkeypatch.setattr(VectorMemory, "_ready_soon", lambda self, queued: None)  # nor embedded by the writer
    store = VectorMemory(tmp_path / "memory", EMBEDDER)
    store.add([MemoryItem("old:step:1", "An older run read the gauges", "old", "step", 1)])
    memory = RunMemory(builder=ContextBuilder(COUNTER, 4000), summarizer_counter=COUNTER,
                       ask_summarizer=lambda prompt: "unused", store=store, scope="run", run_id="r",
                       state=RunState(objective="Read the gauges", summary=Summary("Gauges 1-2 were read.", 2)))
    steps = [StepRecord(i, f"read gauge {i}", "execute_python", "print(g)", f"gauge {i}: {40 + i} kPa")
             for i in range(1, 7)]
    for record in steps:
        memory.remember(*memory.step_items(record))
    release = threading.Event()
    memory.preparing = Preparation(memory.summary, lambda cancelled: release.wait(60) and memory.summary,
                                   "steps 3-4", 4)
    try:
        memory.asking()
        _drained(memory)
        ready = {item_id for item_id in store._ready}
        assert {"r:step:1", "r:step:2", "r:step:3", "r:step:4"} <= ready  # out of view, or about to leave it
        assert not ready & {"r:step:5", "r:step:6"}  # staying in view: the writer's
    finally:
        release.set()
        memory.settle()


def test_the_writer_embeds_each_item_as_it_comes_not_when_its_batch_is_full(tmp_path, monkeypatch):
    """The background writer waits for a batch to fill before it writes (a chromadb write costs the same however
    small), but embeds each item as it comes: its CPU time is spread over the steps, and a search finds it ready."""
    import memory.store as store_module

    monkeypatch.setattr(store_module, "WRITE_LINGER_S", 600.0)
    store = VectorMemory(tmp_path / "memory", EMBEDDER)
    store.add([MemoryItem("a:step:1", "stored first", "a", "step", 1)])
    store.add_later([MemoryItem("a:step:2", "The valve on line 3 was replaced", "a", "step", 2)])
    deadline = time.monotonic() + 60
    while "a:step:2" not in store._ready and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "a:step:2" in store._ready and store.pending(["a:step:2"]) and store.count() == 1
    store.flush()
    assert store.count() == 2


def test_while_a_run_goes_the_gil_changes_hands_often_and_afterwards_as_before(llm, isolated):
    """Memory's threads and the loop hand the GIL back and forth around every embedding, search and token count:
    while a run goes the interpreter's switch interval is short (at Python's 5 ms a lookup beside a busy loop took
    ~4x as long as alone), and the one before is back once it ends."""
    seen = []

    def respond(request):
        seen.append(sys.getswitchinterval())
        return act("done", "ok")

    llm.responder = respond
    before = sys.getswitchinterval()
    settings = Settings(model="gpt-4o-mini", yes=True, unattended=True, workdir=str(isolated.work),
                        home=str(isolated.home))
    result = Agent(settings, model=OpenAIModel(Endpoint(api_key="k", base_url=llm.url)), quiet=True).run("Say ok")
    assert result.status == "done"
    assert seen and all(interval <= 0.0002 + 1e-9 for interval in seen)
    assert sys.getswitchinterval() == before


def test_result_json_follows_a_fast_run_at_most_half_a_second_behind(llm, isolated, monkeypatch):
    """A fast loop's steps are milliseconds apart: result.json (a snapshot; the trace has every event at once) is
    rewritten at most every half second while the run goes, and a write put off is made when that time is up, so the
    file shows the latest step even while the run waits long for the model."""
    import miniagi.run

    monkeypatch.setattr(miniagi.run, "RUNNING_SAVE_S", 3.0)  # longer than the steps take, even on a busy machine
    held = threading.Event()
    llm.add(act("execute_python", "print(1)"), act("execute_python", "print(2)"),
            Stream(["<r>now the third</r>", Wait(held, 60), "<c>done</c>\nthree"]))
    settings = Settings(model="gpt-4o-mini", yes=True, unattended=True, workdir=str(isolated.work),
                        home=str(isolated.home))
    agent = Agent(settings, model=OpenAIModel(Endpoint(api_key="k", base_url=llm.url)), quiet=True)
    outcome = []
    runner = threading.Thread(target=lambda: outcome.append(agent.run("Count to three")))
    runner.start()
    try:
        deadline, seen = time.monotonic() + 30, None
        while time.monotonic() < deadline:
            found = run_dirs(isolated.home)
            if found and (found[0] / "result.json").exists():
                try:
                    seen = json.loads((found[0] / "result.json").read_text())
                except ValueError:  # (never half-written: renamed whole; read again to be sure)
                    seen = None
                if seen and seen["steps"] == 2:
                    break
            time.sleep(0.02)
        assert seen and seen["steps"] == 2 and seen["status"] == "running", seen
    finally:
        held.set()
        runner.join(60)
    assert outcome and outcome[0].status == "done"
    final = json.loads((run_dirs(isolated.home)[0] / "result.json").read_text())
    assert final["status"] == "done" and final["steps"] == 3


def test_the_newest_output_is_whole_when_the_prompt_has_room_whatever_the_item_limit(cli, llm, isolated):
    """`cat` of a 160-line package (~3,000 tokens) with the prompt at a fraction of its 8,000: shown whole, though
    over --max-memory-item-tokens (1,500); the archive keeps it whole too."""
    lines = [f"def handler_{i}(request):  # bug {i} hides here" if i in (17, 88, 151) else
             f"def handler_{i}(request): return respond(request, code={200 + i})" for i in range(160)]
    (isolated.work / "package.py").write_text("\n".join(lines) + "\n")
    llm.add(act("execute_shell", "cat package.py", "read the whole package"), act("done", "three bugs"))
    proc = cli("-y", "Find the bugs in package.py")
    assert proc.returncode == 0, proc.stderr
    shown = llm.agent_requests()[1]["messages"][-1]["content"]
    assert COUNTER.count("\n".join(lines)) > 1500
    assert all(line in shown for line in lines) and "to see the rest" not in shown
