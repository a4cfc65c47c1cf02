"""The run's exact archive and the `recall` command: nothing a run has seen is lost to recall, however long the run,
whatever the shape of what it saw; a fact a later step replaced comes back labelled so."""

from __future__ import annotations

import json
import re
import string
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory.archive import Archive, facts
from memory.budget import Budget
from memory.context import ContextBuilder, StepRecord, message_text
from memory.run_memory import RunMemory
from memory.tokens import counter_for
from miniagi import Agent, OpenAIModel, Settings
from miniagi.config import Endpoint
from miniagi.state import RunState

from .conftest import act, run_context, run_dirs
from .fake_llm import Calls

COUNTER = counter_for("gpt-4o-mini")


def agent_for(llm, isolated, **options) -> Agent:
    options.setdefault("memory_scope", "off")
    settings = Settings(model="gpt-4o-mini", summarizer_model="reader", yes=True, unattended=True,
                        workdir=str(isolated.work), home=str(isolated.home), **options)
    return Agent(settings, model=OpenAIModel(Endpoint(api_key="k", base_url=llm.url)))


def observations(isolated) -> dict[int, str]:
    trace = (run_dirs(isolated.home)[-1] / "trace.jsonl").read_text().splitlines()
    return {e["step"]: e["text"] for e in map(json.loads, trace) if e["type"] == "observation"}


RECALL = {  # a memo printed, then recalled by its code, in each format; the last step recalls from Python
    "tags": [act("execute_python", "print('Security memo: the vault code is PLUM-4471.')"), act("recall", "vault code"),
             act("execute_python", "print(recall('PLUM-4471'))"), act("done", "PLUM-4471")],
    "json": [json.dumps({"thought": "read", "command": "execute_python",
                         "args": {"code": "print('Security memo: the vault code is PLUM-4471.')"}}),
             json.dumps({"thought": "look", "command": "recall", "args": {"query": "vault code"}}),
             json.dumps({"thought": "py", "command": "execute_python", "args": {"code": "print(recall('PLUM-4471'))"}}),
             json.dumps({"thought": "done", "command": "done", "args": {"answer": "PLUM-4471"}})],
    "tools": [Calls([("execute_python", json.dumps({"code": "print('Security memo: the vault code is PLUM-4471.')"}))]),
              Calls([("recall", json.dumps({"query": "vault code"}))]),
              Calls([("execute_python", json.dumps({"code": "print(recall('PLUM-4471'))"}))]),
              Calls([("done", json.dumps({"answer": "PLUM-4471"}))])],
}


@pytest.mark.parametrize("protocol", ["tags", "json", "tools"])
def test_recall_is_a_command_in_every_format_and_a_function_in_python(llm, isolated, protocol):
    llm.add(*RECALL[protocol])
    result = agent_for(llm, isolated, protocol=protocol).run("Open the vault")
    assert result.status == "done"
    seen = observations(isolated)
    for step in (2, 3):  # the command, and the function inside execute_python
        assert "[step 1]" in seen[step] and "Security memo: the vault code is PLUM-4471." in seen[step]
    assert "UNTRUSTED DATA: recalled items" in seen[2]  # outputs are outside text, recalled or not
    assert (run_dirs(isolated.home)[-1] / "archive.sqlite").is_file()  # under the run's folder, hidden from code


def test_a_replaced_fact_comes_back_labelled_superseded_by_the_step_that_replaced_it(llm, isolated):
    llm.add(act("memorize_thoughts", "door code RED-1"), act("execute_shell", "echo 'The door code is now BLUE-2.'"),
            act("recall", "door code"), act("done", "BLUE-2"))
    agent_for(llm, isolated).run("Open the door")
    shown = observations(isolated)[3]
    assert "[step 1, note, superseded by step 2]\ndoor code RED-1" in shown
    assert "[step 2]" in shown and "The door code is now BLUE-2." in shown


def test_recall_with_nothing_matching_says_so_and_suggests_other_words(llm, isolated):
    llm.add(act("execute_shell", "echo hello"), act("recall", "ZANZIBAR-77"), act("done", "none"))
    agent_for(llm, isolated).run("Look for a code")
    assert "Nothing stored matches 'ZANZIBAR-77'" in observations(isolated)[2]


def test_an_earlier_run_is_searched_by_scope_and_labelled_with_its_run(llm, isolated):
    llm.add(act("execute_shell", "echo 'the staging host is kiwi-17.internal'"), act("done", "noted"))
    first = agent_for(llm, isolated, memory_scope="run").run("Find the staging host")
    llm.add(act("recall", "staging host"), act("done", "kiwi-17"))
    agent_for(llm, isolated, memory_scope="run").run("Which host?")
    assert "Nothing stored matches" in observations(isolated)[1]  # run scope: this run only
    llm.add(act("recall", "kiwi-17.internal"), act("done", "kiwi-17"))
    agent_for(llm, isolated, memory_scope="workdir").run("Which host again?")
    assert f"[run {first.run_id}, step 1]" in observations(isolated)[1]


def test_facts_tell_a_changed_value_from_another_record_of_the_same_shape():
    assert facts("door code RED-1")[0][:3] == ("door code", "", "red-1")
    assert facts("The door code is now BLUE-2.")[0][:3] == ("door code", "", "blue-2")
    bay3, bay4 = facts("FACT 03: the pump in bay 3 runs at 4111 rpm.")[0], facts("FACT 04: the pump in bay 4 runs "
                                                                                  "at 4148 rpm.")[0]
    assert bay3[0] == bay4[0] and bay3[1] != bay4[1]  # one shape, two records: neither replaces the other
    assert facts("exit code 0") == [] and facts("a long sentence " * 10 + "42") == []


# --- the promise, on generated runs: any fact printed at any step is returned whole by recall -------------------
SHAPES = st.sampled_from(["prose", "json", "table", "longline", "traceback", "nonascii"])
CODES = st.text(string.ascii_uppercase, min_size=3, max_size=6)


def output(shape: str, step: int, fact: str, filler: int) -> str:
    """An output of one shape with one fact somewhere in it."""
    rows = [f"row {i}: nothing of note in part {step}" for i in range(filler)]
    if shape == "json":
        rows = [json.dumps({"row": i, "status": "ok", "part": step}) for i in range(filler)]
    elif shape == "table":
        rows = [f"| {i} | ok | {step * i} |" for i in range(filler)]
    elif shape == "longline":
        rows = [" ".join(f"token{i}x{step}" for i in range(filler * 20))]
    elif shape == "traceback":
        rows = ["Traceback (most recent call last):"] + [f'  File "mod{i}.py", line {i}, in f' for i in range(filler)]
    elif shape == "nonascii":
        rows = [f"ligne {i} : rien à signaler — ça va" for i in range(filler)]
    rows.insert(len(rows) // 2, fact)
    return "\n".join(rows)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_any_fact_printed_at_any_step_is_returned_whole_by_recall(tmp_path_factory, data):
    steps = data.draw(st.integers(1, 40), label="steps")
    archive = Archive(tmp_path_factory.mktemp("run") / "archive.sqlite", "r1")
    memory = RunMemory(builder=ContextBuilder(COUNTER, Budget(context=3000)), summarizer_counter=COUNTER,
                       ask_summarizer=lambda prompt: "", store=None, scope="run", run_id="r1", archive=archive,
                       state=RunState())
    printed = {}
    for step in range(1, steps + 1):
        code = f"{data.draw(CODES, label='code')}-{step}"
        fact = f"The key of locker {step} is {code}."
        shape = data.draw(SHAPES, label="shape")
        record = StepRecord(step, f"read part {step}", "execute_shell", f"cat part{step}.txt",
                            output(shape, step, fact, data.draw(st.integers(0, 40), label="filler")))
        memory.remember(*memory.step_items(record))
        printed[step] = (code, fact)
    asked = data.draw(st.integers(1, steps), label="asked")
    code, fact = printed[asked]
    for query in (code, f"locker {asked} key"):
        shown = memory.recall(query, 1500)
        # whole, or (an item bigger than the room) the part around the fact, saying so
        assert re.search(rf"\[step {asked}(\]|; too long to show whole here)", shown) and fact in shown


# --- automatic recall earns its room: on generated runs with values that change -------------------------------
class WordsEmbedder:
    """A tiny deterministic embedder (simonw/llm's tests have one): a bag of hashed words. Every item is near
    enough to be weighed (no relevance cut-off), so what keeps an item out is the recall's own rules."""

    name = "test-words"

    def embed(self, texts):
        import zlib

        import numpy as np

        vectors = np.zeros((len(texts), 64), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                vectors[row, zlib.crc32(word.encode()) % 64] += 1.0
            vectors[row, 63] += 0.01  # never all zero
        return vectors


SUBJECTS = ["door code", "vault code", "backup host", "doubling", "pump limit"]
VALUES = ["RED-1", "BLUE-2", "GREEN-3", "ON", "OFF", "4259", "7731", "kiwi-17"]
FACT_LINE = re.compile(r"^The (?:door code|vault code|backup host|doubling|pump limit) is (?:now )?\S+\.$", re.M)


def changing_step(number: int, kind: str, subject: str, value: str, filler: int) -> StepRecord:
    if kind == "note":
        text = f"{subject} {value}"
        return StepRecord(number, "keep it", "memorize_thoughts", text, "Noted.", notes=(text,))
    verb = "is now" if kind == "update" else "is"
    lines = [f"Routine entry {i}: nothing of note in part {number}." for i in range(filler)]
    lines.insert(len(lines) // 2, f"The {subject} {verb} {value}.")
    return StepRecord(number, f"check the {subject} in part {number}", "execute_shell", f"cat part{number}.txt",
                      "\n".join(lines))


changing_runs = st.lists(st.tuples(st.sampled_from(["fact", "update", "note"]), st.sampled_from(SUBJECTS),
                                   st.sampled_from(VALUES), st.integers(0, 60)), min_size=2, max_size=25)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(shape=changing_runs, budget=st.integers(2000, 5000), summary_keeps=st.booleans(), by_words=st.booleans())
def test_recalled_items_carry_their_step_never_repeat_the_prompt_and_never_pass_a_replacement_unlabelled(
        tmp_path_factory, shape, budget, summary_keeps, by_words):
    from memory.store import VectorMemory
    from miniagi.prompts import system_prompt

    def summarize(prompt: str) -> str:  # faithful to the facts it is shown, or keeping none (recall must serve)
        return "The agent read parts. " + (" ".join(FACT_LINE.findall(prompt)) if summary_keeps else "")

    folder = tmp_path_factory.mktemp("run")
    store = VectorMemory(folder / "memory", WordsEmbedder())
    archive = Archive(folder / "archive.sqlite", "r1")
    memory = RunMemory(builder=ContextBuilder(COUNTER, budget), summarizer_counter=COUNTER, ask_summarizer=summarize,
                       store=store, scope="run", run_id="r1", archive=archive,
                       state=RunState(objective="Keep the codes current"))
    if by_words:  # a store that holds nothing for the run: recall goes by the archive's words, no model loaded
        memory.defer_vectors()
    system, steps = system_prompt("/tmp/work"), []
    for number, (kind, subject, value, filler) in enumerate(shape, start=1):
        steps.append(changing_step(number, kind, subject, value, filler))
        notes = [memory.item("note", note, number) for note in steps[-1].notes]
        memory.remember(*memory.step_items(steps[-1]), *notes)
        context, _ = run_context(memory, system=system, steps=steps, next_step=number + 1)
        memory.settle()
        if not memory.last_recalled:
            continue
        text = "\n".join(message_text(m) for m in context.messages)
        rest = text[:text.index("RELEVANT MEMORIES")]  # the prompt but its recalled items
        replaced = archive.superseded(item.id for item in memory.last_recalled)
        for item in memory.last_recalled:
            assert re.match(r"step \d+", item.label), item.label
            if item.id in replaced:
                assert f"superseded by step {replaced[item.id]}" in item.label
            # it shows a line of output (not the step's own thought or command) that the prompt does not hold
            shown = [line.strip(" …") for line in item.text.split("\n")[3:]] if item.text.startswith("Thought:") \
                else [item.text]
            assert any(line and " ".join(line.split()) not in " ".join(rest.split()) for line in shown), item
    store.flush()



@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(before=changing_runs, shape=changing_runs, budget=st.integers(2000, 5000))
def test_an_earlier_runs_items_recalled_by_words_carry_their_run_and_step_and_never_repeat_the_prompt(
        tmp_path_factory, before, shape, budget):
    """Automatic recall by words (no model loaded) finds earlier runs' items in their archives too: each carries
    `run RUN, step N`, `superseded by step M` when a later step of its run replaced a fact it states, and shows a
    line the prompt does not hold."""
    from memory.store import VectorMemory
    from miniagi.prompts import system_prompt

    runs = tmp_path_factory.mktemp("runs")
    earlier = Archive(runs / "r0" / "archive.sqlite", "r0", "/work")
    first = RunMemory(builder=ContextBuilder(COUNTER, budget), summarizer_counter=COUNTER, ask_summarizer=str,
                      scope="run", run_id="r0", workdir="/work", store=None, archive=earlier, state=RunState())
    for number, (kind, subject, value, filler) in enumerate(before, start=1):
        step = changing_step(number, kind, subject, value, filler)
        first.remember(*first.step_items(step), *[first.item("note", note, number) for note in step.notes])
    first.finish()
    archive = Archive(runs / "r1" / "archive.sqlite", "r1", "/work")
    memory = RunMemory(builder=ContextBuilder(COUNTER, budget), summarizer_counter=COUNTER,
                       ask_summarizer=lambda prompt: "The agent read parts.", scope="workdir", run_id="r1",
                       workdir="/work", store=VectorMemory(runs.parent / "memory", WordsEmbedder()), archive=archive,
                       runs_root=runs, state=RunState(objective="Keep the codes current"))
    memory.defer_vectors(store_holds=True)
    system, steps = system_prompt("/tmp/work"), []
    for number, (kind, subject, value, filler) in enumerate(shape, start=1):
        # asking about the subject: an earlier run's line stating it holds the words of the question
        steps.append(replace(changing_step(number, kind, subject, value, filler), thought=f"the {subject} again"))
        memory.remember(*memory.step_items(steps[-1]), *[memory.item("note", n, number) for n in steps[-1].notes])
        context, _ = run_context(memory, system=system, steps=steps, next_step=number + 1)
        memory.settle()
        text = "\n".join(message_text(m) for m in context.messages)
        rest = text[:text.index("RELEVANT MEMORIES")] if memory.last_recalled else text
        for item in (item for item in memory.last_recalled if item.id.startswith("r0:")):
            replaced = Archive(runs / "r0" / "archive.sqlite", "r0", read_only=True)
            replaced_by = replaced.superseded([item.id]).get(item.id)
            replaced.close()
            assert re.match(r"run r0, step \d+", item.label), item.label
            assert not replaced_by or f"superseded by step {replaced_by}" in item.label, item.label
            lines = [line.strip(" …") for line in item.text.split("\n")]
            assert any(line and " ".join(line.split()) not in " ".join(rest.split()) for line in lines), item
    memory.finish(wait=False)  # journaled
    assert memory.store._collection is None  # nothing loaded chromadb


def test_an_earlier_runs_replaced_fact_is_recalled_only_labelled_superseded(llm, isolated):
    llm.add(act("execute_shell", "echo 'The door code is RED-1.'", "read the door code"),
            act("execute_shell", "echo 'The door code is now BLUE-2.'", "read the new door code"), act("done", "ok"))
    agent_for(llm, isolated, memory_scope="workdir").run("Find the door code")
    llm.add(act("execute_shell", "echo checking", "I need the door code from the earlier run"), act("done", "BLUE-2"))
    agent_for(llm, isolated, memory_scope="workdir").run("What is the door code?")
    trace = (run_dirs(isolated.home)[-1] / "trace.jsonl").read_text().splitlines()
    items = [item for e in map(json.loads, trace) if e["type"] == "recall" for item in e["items"]]
    assert any("BLUE-2" in item["text"] for item in items)  # the other run's steps do come back
    for item in items:
        assert re.match(r"run \S+, (step \d+|objective)", item["label"]), item["label"]
        if "RED-1" in item["text"] and "BLUE-2" not in item["text"]:
            assert "superseded by step 2" in item["label"]


def test_a_long_runs_many_summaries_do_not_crowd_out_the_step_they_restate(tmp_path):
    """Summaries are short, so bm25 ranks them above the long step whose fact they restate; a 1,000-step run folded
    hundreds of times, and the command, shown no summary of this run, found nothing for a fact of step 979."""
    from memory.recall import Recaller

    filler = " ".join(["Routine entry: the line ran as scheduled, no alarms were raised."] * 12)
    archive = Archive(tmp_path / "runs" / "r1" / "archive.sqlite", "r1", "/work")
    archive.add([("r1-step-979", "step", 979, f"{filler}\nFACT 979: the pump in bay 979 runs at 40223 rpm.\n{filler}",
                  ""),
                 *[(f"r1-summary-{n}", "summary", n, f"The pump in bay 979 runs at 40223 rpm; in bay {n}, {n * 7} "
                    "rpm.", "") for n in range(980, 1100)]])
    recaller = Recaller(archive, None, scope="run", workdir="/work", runs_root=tmp_path / "runs",
                        counter=counter_for("gpt-4o-mini"))
    shown = recaller.answer("pump in bay 979 rpm", 2000)
    assert "FACT 979: the pump in bay 979 runs at 40223 rpm." in shown and "[step 979]" in shown, shown


def test_recall_shows_no_summary_that_restates_what_it_found_or_what_the_prompt_holds(tmp_path):
    """Each fold archives a summary: this run's newest is in the prompt and the older ones restate steps the archive
    keeps whole, so the command shows the steps; an earlier run's summaries, only its newest."""
    from memory.recall import Recaller

    earlier = Archive(tmp_path / "runs" / "r1" / "archive.sqlite", "r1", "/work")
    earlier.add([(f"r1-summary-{n}", "summary", n, f"Facts so far: fact 2 code ZX-2-ab, up to fact {n}.", "")
                 for n in (7, 14, 21)])
    earlier.close()
    archive = Archive(tmp_path / "runs" / "r2" / "archive.sqlite", "r2", "/work")
    archive.add([("r2-step-2", "step", 2, "fact 2: code ZX-2-ab", ""),
                 *[(f"r2-summary-{n}", "summary", n, f"Latest: fact 2 code ZX-2-ab and fact {n}.", "")
                   for n in (7, 14, 21, 28)]])
    recaller = Recaller(archive, None, scope="workdir", workdir="/work", runs_root=tmp_path / "runs",
                        counter=counter_for("gpt-4o-mini"))
    shown = recaller.answer("fact 2 code ZX-2-ab", 2000)
    assert "[step 2]" in shown and "Latest:" not in shown, shown
    assert shown.count("Facts so far:") == 1 and "up to fact 21" in shown, shown
