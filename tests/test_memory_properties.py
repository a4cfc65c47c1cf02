"""The memory's promises over generated runs (issue 19): random output sizes, facts anywhere in an output, notes at
random steps, budgets from 2,500 to 16,000 and resumes at random points; and (issue 28) outputs of every shape —
prose, one long line, JSON, tables, tracebacks, numbers only, long unbroken tokens, non-ASCII — with the fact at the
start, middle, end or anywhere, at budgets from 2,000 to 16,000. The summarizer is faithful (it repeats every fact
and note it is shown, whole, and nothing else), so whatever a prompt lacks, the memory lost."""

from __future__ import annotations

import json
import random
import re
from typing import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory.context import MESSAGE_OVERHEAD, REPLY_PRIMING, ContextBuilder, StepRecord, Summary, message_text
from memory.run_memory import RunMemory
from memory.tokens import counter_for
from miniagi.prompts import system_prompt
from miniagi.state import RunState

from .conftest import run_context
from .fake_llm import rendered_prompt

COUNTER = counter_for("gpt-4o-mini")
SYSTEM = system_prompt("/tmp/work")
FILLER = "Routine entry: the line ran as scheduled and nothing of note was logged. "
FACT = re.compile(r"FACT \d+ is [^\s-]+-\d+\.")
NOTE = re.compile(r"NOTE \d+: [^\n]*?END")
WORDS = ["amber", "basil", "cedar", "delta", "ember", "fjord", "gamma", "hazel"]


def fact(step: int) -> str:
    return f"FACT {step} is {WORDS[step % len(WORDS)]}-{1000 + 37 * step}."


def note(step: int, words: int) -> str:
    return f"NOTE {step}: " + " ".join(WORDS[(step + i) % len(WORDS)] for i in range(words)) + " END"


def faithful(prompt: str) -> str:
    return "The agent read log parts. " + " ".join(FACT.findall(prompt) + NOTE.findall(prompt))


def prompt_tokens(messages: list[dict]) -> int:
    return sum(COUNTER.count(message_text(m)) + MESSAGE_OVERHEAD for m in messages) + REPLY_PRIMING


def new_memory(budget: int, summary: Summary = Summary()) -> RunMemory:
    memory = RunMemory(builder=ContextBuilder(COUNTER, budget), summarizer_counter=COUNTER, ask_summarizer=faithful,
                       store=None, scope="run", run_id="r",
                       state=RunState(objective="Read the log parts and keep what matters"))
    memory.state.summary = summary
    return memory


def make_step(number: int, size: int, position: float, note_words: int) -> StepRecord:
    if note_words:
        text = note(number, note_words)
        return StepRecord(number, "keep it", "memorize_thoughts", text, "Noted.", notes=(text,))
    entries = [FILLER] * (size // 14)
    entries.insert(int(position * len(entries)), fact(number) + " ")
    return StepRecord(number, f"read part {number}", "execute_python", f"print(part({number}))", "".join(entries))


def check(messages: list[dict], steps: list[StepRecord], memory: RunMemory, budget: int,
          fact: Callable[[int], str] = fact) -> None:
    assert prompt_tokens(messages) <= budget
    text = "\n".join(message_text(m) for m in messages)
    steps_text = "\n".join(message_text(m) for m in messages[2:])  # the system prompt's example is no step
    shown = [int(n) for n in re.findall(r"Observation \(step (\d+)\)", steps_text)]
    through = memory.summary.through_step
    # no window: every earlier step is in view, verbatim, or covered by the summary, which the prompt shows (the
    # newest step, when too big for the prompt, is covered by it and shown cut besides)
    assert shown == [s.step for s in steps if s.step > through] or (shown == [through] == [steps[-1].step])
    for record in steps:
        for kept in record.notes:  # every note, whole, in every later prompt
            assert kept in text, f"note of step {record.step} missing"
        if record.command == "execute_python":  # every fact in its step in view, in brief, or in the summary
            assert fact(record.step) in text, f"fact of step {record.step} missing"
    if through:
        assert f"SUMMARY OF STEP{'S 1-' if through > 1 else ' '}{through} " in messages[1]["content"]
    assert "IN BRIEF" not in text and "see the summary" not in text


run_shapes = st.lists(st.tuples(st.integers(min_value=0, max_value=700),  # output tokens, about
                                st.floats(min_value=0, max_value=1),  # where the fact is in the output
                                st.one_of(st.just(0), st.just(0), st.just(0), st.integers(min_value=3, max_value=20))),
                      min_size=1, max_size=30)


@given(budget=st.integers(min_value=2500, max_value=16000), shapes=run_shapes,
       resume_at=st.integers(min_value=0, max_value=30))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_notes_stay_whole_every_step_is_in_view_or_summarized_and_the_budget_holds(budget, shapes, resume_at):
    memory = new_memory(budget)
    steps: list[StepRecord] = []
    for number in range(1, len(shapes) + 2):
        if number == resume_at:  # the process ends; a new one rebuilds the memory from what the trace recorded
            memory.settle()
            resumed = new_memory(budget, memory.summary)
            before, _ = run_context(memory, system=SYSTEM, steps=steps, next_step=number)
            after, _ = run_context(resumed, system=SYSTEM, steps=steps, next_step=number)
            if not before.reshaped and not after.reshaped:
                assert after.messages == before.messages  # resume rebuilds the same view
            memory = resumed
        context, _ = run_context(memory, system=SYSTEM, steps=steps, next_step=number)
        check(context.messages, steps, memory, budget)
        if number <= len(shapes):
            steps.append(make_step(number, *shapes[number - 1]))
    memory.settle()


def test_notes_that_outgrow_their_share_go_into_a_digest_the_prompt_names_and_the_newest_stay_whole():
    prompts = []

    def ask(prompt):
        prompts.append(prompt)
        return "DIGEST: " + " ".join(n.split(":")[0] for n in NOTE.findall(prompt)) if "notes to itself" in prompt \
            else faithful(prompt)

    budget = 2500
    memory = RunMemory(builder=ContextBuilder(COUNTER, budget), summarizer_counter=COUNTER, ask_summarizer=ask,
                       store=None, scope="run", run_id="r", state=RunState(objective="Keep notes"))
    steps = [make_step(n, 300, 0.5, 40 if n % 2 else 0) for n in range(1, 31)]  # a long note every other step
    for number in range(1, 32):
        context, _ = run_context(memory, system=SYSTEM, steps=steps[:number - 1], next_step=number)
        assert prompt_tokens(context.messages) <= budget
    head = context.messages[1]["content"]
    summary = memory.summary
    assert summary.notes_through and f"DIGEST OF YOUR NOTES OF STEPS 1-{summary.notes_through}" in head
    assert "outgrew their room" in head and summary.notes_digest in head
    text = "\n".join(message_text(m) for m in context.messages)
    later = [s for s in steps if s.notes and s.step > summary.notes_through]
    assert later and all(s.notes[0] in text for s in later)  # every note the digest does not hold: whole
    listed = head.split("YOUR NOTES (memorize_thoughts)")[1]
    assert [int(n) for n in re.findall(r"\(step (\d+)\)", listed)] == sorted(
        [s.step for s in later if s.step <= summary.through_step], reverse=True)  # newest first
    assert any("notes to itself" in p for p in prompts)
    # every note the digest is labelled with reached a digest call, whole, and none was condensed again after it
    digest_prompts = "\n".join(p for p in prompts if "notes to itself" in p)
    assert all(s.notes[0] in digest_prompts for s in steps if s.notes and s.step <= summary.notes_through)
    assert not any("condense" in p.lower() and "notes to itself" not in p for p in prompts)


def test_recall_shows_whole_sentences_around_what_matters_and_the_newest_version_of_a_note():
    from memory.excerpt import excerpt, same_note

    log = (FILLER * 6) + "The pump in bay 7 runs at 4259 rpm. " + (FILLER * 6) + "Other plants were not checked."
    shown = excerpt(log, "pump bay 7", COUNTER, 40)
    assert "The pump in bay 7 runs at 4259 rpm." in shown  # the sentence that matters, whole
    assert "[×" in shown or "…" in shown  # repeats collapsed, or what was left out marked between sentences
    assert "tokens cut" not in shown
    varied = " ".join(f"Entry {i}: sensor {i} read {100 + i} units at noon." for i in range(40))
    cut = excerpt(varied, "sensor 17", COUNTER, 30)
    assert "Entry 17: sensor 17 read 117 units at noon." in cut and COUNTER.count(cut) <= 30
    assert all(piece.strip().endswith((".", "…")) for piece in cut.split("\n"))  # never inside a sentence
    assert same_note("Passphrase so far: 1=amber", "Passphrase so far: 1=amber 2=basil 3=cedar")
    assert not same_note("Passphrase so far: 1=amber", "The build server is hopper-9")


# --- outputs of every shape (issue 28) -------------------------------------------------------------------------
SHAPES = ("prose", "longline", "inline", "json", "table", "traceback", "numbers", "blob", "nonascii")
PLACES = ("start", "middle", "end", "anywhere")
ODD_WORDS = ["café", "Zürich", "東京", "naïve", "Ωmega", "amber", "basil", "cedar"]


def shaped_fact(step: int) -> str:
    """A fact per step, some with non-ASCII words."""
    return f"FACT {step} is {ODD_WORDS[step % len(ODD_WORDS)]}-{1000 + 37 * step}."


def shaped_units(shape: str, step: int, count: int, rng: random.Random) -> list[str]:
    word = lambda i: WORDS[(step + i * 3) % len(WORDS)]  # noqa: E731
    if shape == "prose":
        return [f"Entry {i}: the {word(i)} line ran as scheduled, nothing of note logged. " for i in range(count)]
    if shape in ("longline", "inline"):  # words, no sentence end, no line break
        return [" ".join(word(i + j) for j in range(8)) + " " for i in range(count)]
    if shape == "json":
        return [json.dumps({"id": i, "name": word(i), "values": [rng.randrange(1000) for _ in range(4)]}) + ",\n"
                for i in range(count)]
    if shape == "table":
        return [f"| {i:4d} | {word(i):<6} | {rng.randrange(10**6):7d} |\n" for i in range(count)]
    if shape == "traceback":
        return [f'  File "/srv/{word(i)}/mod_{i}.py", line {rng.randrange(1, 900)}, in run_{i}\n    x = f_{i}(y)\n'
                for i in range(count)]
    if shape == "numbers":
        return [" ".join(str(rng.randrange(10**6)) for _ in range(8)) + "\n" for _ in range(count)]
    if shape == "blob":
        return ["".join(f"{rng.getrandbits(32):08x}" for _ in range(rng.randrange(4, 40))) + "\n" for _ in range(count)]
    return [f"Journal n°{i} — l'équipe a vérifié ; 温度は正常、圧力も安定 Ωμέγα ✓ " for i in range(count)]


def shaped_output(step: int, shape: str, size: int, place: str, rng: random.Random) -> str:
    """An output of about `size` tokens with the step's fact at `place`: on a line of its own (in JSON, a string
    value; in a traceback, the error) or, for "inline", inside one long line with no line break at all."""
    units, taken = [], 0
    for unit in shaped_units(shape, step, max(1000, size), rng):
        if taken >= size:
            break
        units.append(unit)
        taken += max(1, len(unit) // 4)
    line = shaped_fact(step)
    line = {"json": json.dumps({"finding": line}, ensure_ascii=False) + ",\n", "traceback": f"RuntimeError: {line}\n",
            "inline": line + " ", "prose": line + " "}.get(shape, line + "\n")
    at = {"start": 0, "middle": len(units) // 2, "end": len(units)}.get(place, rng.randrange(len(units) + 1))
    units.insert(at, line)
    text = "".join(units)
    return "[\n" + text.rstrip(",\n") + "\n]" if shape == "json" else text


def faithful_asks(budget: int, prompts: list[str]) -> Callable[[str], str]:
    def ask(prompt: str) -> str:
        prompts.append(prompt)
        assert COUNTER.count(prompt) <= budget  # a summarizer call within the budget too
        return "The agent read outputs. " + " ".join(FACT.findall(prompt) + NOTE.findall(prompt))
    return ask


def shaped_memory(budget: int, prompts: list[str], summary: Summary = Summary()) -> RunMemory:
    memory = RunMemory(builder=ContextBuilder(COUNTER, budget), summarizer_counter=COUNTER,
                       ask_summarizer=faithful_asks(budget, prompts), store=None, scope="run", run_id="r",
                       state=RunState(objective="Read the outputs and keep what matters"))
    memory.state.summary = summary
    return memory


def shaped_step(number: int, shape: str, size: int, place: str, note_words: int, rng: random.Random) -> StepRecord:
    if note_words:
        text = note(number, note_words)
        return StepRecord(number, "keep it", "memorize_thoughts", text, "Noted.", notes=(text,))
    return StepRecord(number, f"read output {number}", "execute_python", f"print(output({number}))",
                      shaped_output(number, shape, size, place, rng))


shaped_runs = st.lists(st.tuples(st.sampled_from(SHAPES), st.integers(min_value=0, max_value=900),
                                 st.sampled_from(PLACES),
                                 st.one_of(st.just(0), st.just(0), st.just(0), st.integers(min_value=3, max_value=15))),
                       min_size=1, max_size=30)


@given(budget=st.integers(min_value=2000, max_value=16000), shapes=shaped_runs,
       resume_at=st.integers(min_value=0, max_value=30), seed=st.integers(min_value=0, max_value=2**16))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_whatever_the_outputs_shape_every_earlier_fact_is_in_view_or_in_the_summary_shown(budget, shapes,
                                                                                          resume_at, seed):
    rng, prompts = random.Random(seed), []
    memory = shaped_memory(budget, prompts)
    steps: list[StepRecord] = []
    for number in range(1, len(shapes) + 2):
        if number == resume_at:  # the process ends; a new one rebuilds the memory from what the trace recorded
            memory.settle()
            memory = shaped_memory(budget, prompts, memory.summary)
        context, _ = run_context(memory, system=SYSTEM, steps=steps, next_step=number)
        check(context.messages, steps, memory, budget, shaped_fact)
        text = "\n".join(message_text(m) for m in context.messages)
        assert "IN BRIEF" not in text and "see the summary" not in text
        if number <= len(shapes):
            steps.append(shaped_step(number, *shapes[number - 1], rng))
    memory.settle()
    # one limit per summarizer call: no call condenses what another has just written
    assert not any("condense" in p.lower() and "outgrew" not in p for p in prompts)


def test_a_step_too_big_for_one_summarizer_call_reaches_it_whole_in_overlapping_parts():
    """A long line with no break and its fact inside, larger than a summarizer call may read: it is read in parts
    across calls, and the fact is whole in one of them, wherever the cuts fall."""
    rng, prompts = random.Random(7), []
    budget = 2000
    memory = shaped_memory(budget, prompts)
    steps = [shaped_step(n, "inline", 2400, "anywhere", 0, rng) for n in range(1, 5)]
    for number in range(1, 6):
        context, _ = run_context(memory, system=SYSTEM, steps=steps[:number - 1], next_step=number)
        check(context.messages, steps[:number - 1], memory, budget, shaped_fact)
    memory.settle()
    parts = [p for p in prompts if re.search(r"\[step \d+, part \d+ of \d+\]", p)]
    assert parts  # the steps were too big for one call
    for record in steps[:3]:
        assert any(shaped_fact(record.step) in p for p in prompts), f"step {record.step}'s fact never read whole"
        assert shaped_fact(record.step) in memory.summary.text


def test_the_loop_waits_for_the_summary_being_prepared_and_says_so():
    """Summaries are prepared in the background while their steps are in view; when room runs out first, the loop
    waits for one and says so, and the steps leave only once it is in."""
    import threading

    release, said, prompts = threading.Event(), [], []
    faithful_ask = faithful_asks(3000, prompts)

    def slow(prompt):
        release.wait(10)
        return faithful_ask(prompt)

    memory = RunMemory(builder=ContextBuilder(COUNTER, 3000), summarizer_counter=COUNTER, ask_summarizer=slow,
                       store=None, scope="run", run_id="r", state=RunState(objective="Read the outputs"))
    memory.notify = said.append
    rng = random.Random(3)
    steps: list[StepRecord] = []
    for number in range(1, 12):
        if number > 2 and memory.preparing is not None and not said:
            threading.Timer(0.2, release.set).start()  # the summary comes after the loop has begun to wait
        context, _ = run_context(memory, system=SYSTEM, steps=steps, next_step=number)
        check(context.messages, steps, memory, 3000, shaped_fact)
        steps.append(shaped_step(number, "table", 400, "middle", 0, rng))
        if said:
            break
    assert said and "summarizing step" in said[0] and "waiting" in said[0]
    assert memory.summary.through_step >= 1
    memory.settle()


def test_no_summarizer_call_starts_once_the_run_has_ended():
    """A summary in the making when the run ends is called off: the call in flight ends, no other one starts."""
    import threading

    started, release, prompts = threading.Event(), threading.Event(), []

    def slow(prompt):
        prompts.append(prompt)
        started.set()
        release.wait(10)
        return "The agent read outputs."

    memory = RunMemory(builder=ContextBuilder(COUNTER, 2500), summarizer_counter=COUNTER, ask_summarizer=slow,
                       store=None, scope="run", run_id="r", state=RunState(objective="Read the outputs"))
    rng = random.Random(5)
    # steps big enough that the one summary prepared takes several calls
    steps = [shaped_step(n, "inline", 1400, "middle", 0, rng) for n in range(1, 3)]
    from memory.run_memory import Preparation

    memory.preparing = Preparation(memory.summary, lambda cancelled: memory.make_summary(
        memory.summary, steps, steps, cancelled))
    assert started.wait(10)
    memory.settle(wait=False)  # the run ends (done) while the first call is in flight
    release.set()
    for thread in [t for t in threading.enumerate() if t.name == "summary"]:
        thread.join(10)
    assert len(prompts) == 1


def told_words(prompt: str) -> int:
    return int(re.search(r"at most (\d+) words", prompt).group(1))


def value_notes_memory(ask) -> tuple[RunMemory, list[StepRecord]]:
    """A run whose notes are lists of values (names and numbers run ~2.5 tokens a word), one every other step."""
    memory = RunMemory(builder=ContextBuilder(COUNTER, 3000), summarizer_counter=COUNTER, ask_summarizer=ask,
                       store=None, scope="run", run_id="r",
                       state=RunState(objective="Compute the values the notes ask for"))
    steps = []
    for n in range(1, 41):
        if n % 2:
            steps.append(make_step(n, 300, 0.5, 0))
        else:
            text = ", ".join(f"V{n * 10 + i} = {(n * 37 + i * 11) % 1000}" for i in range(6)) + f". Next: {n + 1}"
            steps.append(StepRecord(n, "keep the values", "memorize_thoughts", text, "Noted.", notes=(text,)))
    return memory, steps


def test_a_digest_of_values_within_the_words_it_was_told_is_kept_whole():
    """Found by a capable model playing the summarizer: a list of values runs ~2.5 tokens a word, so a digest within
    the words it was told came to twice the tokens its cap allowed, and was cut to " …". The words told now follow
    what is digested, and a digest that keeps to them is shown whole."""
    digests = []

    def ask(prompt):
        if "notes to itself" not in prompt:
            return faithful(prompt)
        values = re.findall(r"V\d+ = \d+", prompt)
        words = told_words(prompt)
        text = "; ".join(values)
        while len(text.split()) > words:  # a model that keeps to the limit: the newest values that fit it
            values = values[1:]
            text = "; ".join(values)
        digests.append(text)
        return text

    memory, steps = value_notes_memory(ask)
    for number in range(1, len(steps) + 2):
        context, _ = run_context(memory, system=SYSTEM, steps=steps[:number - 1], next_step=number)
        assert prompt_tokens(context.messages) <= 3000
    assert digests and memory.summary.notes_digest == digests[-1]  # whole: not cut
    head = context.messages[1]["content"]
    assert digests[-1] in head and "the rest was cut" not in head


def test_a_digest_over_its_limit_in_one_sentence_keeps_its_newest_part_and_says_what_moved_out():
    """A summarizer that ignores the limit with one long sentence, even when asked to condense it: the digest is
    within its cap, keeps its newest part (never nothing, never cut in the middle) and first says what moved out and
    how to get it back (the notes are whole in the archive)."""
    def ask(prompt):
        if "notes to itself" not in prompt and "digest of notes" not in prompt:
            return faithful(prompt)
        return "Values: " + "; ".join(f"V{i} = {i * 7}" for i in range(1, 400)) + "."

    memory, steps = value_notes_memory(ask)
    for number in range(1, len(steps) + 2):
        context, _ = run_context(memory, system=SYSTEM, steps=steps[:number - 1], next_step=number)
        assert prompt_tokens(context.messages) <= 3000
    digest = memory.summary.notes_digest
    assert digest.startswith("Moved out (use recall to get them back): ")
    assert digest.endswith("V399 = 2793.") and "V1 = 7;" not in digest
    assert "the rest was cut" not in digest


@given(budget=st.integers(min_value=2000, max_value=16000), shapes=shaped_runs,
       resume_at=st.integers(min_value=0, max_value=30), seed=st.integers(min_value=0, max_value=2**16))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_fold_that_ends_the_agents_prompt_keeps_every_promise_and_repeats_that_prompt(budget, shapes, resume_at,
                                                                                        seed):
    """The summarizer is the agent's model: a fold is the agent's latest prompt, up to the steps it folds, and an
    instruction. Every fact stays in view or in the summary, every prompt and every fold within the budget, and each
    fold's messages are, but for the instruction, the beginning of a prompt the agent was sent (a prefix cache
    serves them)."""
    rng, folds, sent = random.Random(seed), [], []

    def ask(prompt):
        if isinstance(prompt, str):  # a digest of notes, a condensing: a prompt of its own
            assert COUNTER.count(prompt) <= budget
            return "The agent read outputs. " + " ".join(FACT.findall(prompt) + NOTE.findall(prompt))
        folds.append(prompt)
        assert prompt_tokens(prompt) <= budget  # a fold within the budget, as an agent prompt is
        instruction = prompt[-1]["content"].rsplit("\n\nDo not act now.", 1)[1]
        # a part appended to the summary so far repeats none of it; a summary written anew takes the head in too
        read = prompt[2:] if "to follow the SUMMARY" in instruction else prompt[1:]
        text = "\n".join(message_text(m) for m in read)
        return "The agent read outputs. " + " ".join(FACT.findall(text) + NOTE.findall(text))

    def shared_memory(summary: Summary = Summary()) -> RunMemory:
        return RunMemory(builder=ContextBuilder(COUNTER, budget), summarizer_counter=COUNTER, ask_summarizer=ask,
                         store=None, scope="run", run_id="r", summarizer_shares_prefix=True,
                         state=RunState(objective="Read the outputs and keep what matters", summary=summary))

    memory, steps = shared_memory(), []
    for number in range(1, len(shapes) + 2):
        if number == resume_at:  # the process ends; a new one rebuilds the memory from what the trace recorded
            memory.settle()
            memory = shared_memory(memory.summary)
        context, _ = run_context(memory, system=SYSTEM, steps=steps, next_step=number)
        sent.append(rendered_prompt({"messages": context.messages}))
        check(context.messages, steps, memory, budget, shaped_fact)
        if number <= len(shapes):
            steps.append(shaped_step(number, *shapes[number - 1], rng))
    memory.settle()
    for fold in folds:
        last = dict(fold[-1], content=fold[-1]["content"].rsplit("\n\nDo not act now.", 1)[0])
        before_instruction = rendered_prompt({"messages": fold[:-1] + [last]})[:-len("<|end|>")]
        assert any(prompt.startswith(before_instruction) for prompt in sent)
