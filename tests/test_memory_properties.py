"""The memory's promises over generated runs (issue 19): random output sizes, facts anywhere in an output, notes at
random steps, budgets from 2,500 to 16,000 and resumes at random points. The summarizer is faithful (it repeats every
fact and note it is shown, and nothing else), so whatever a prompt lacks, the memory lost."""

from __future__ import annotations

import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory.context import MESSAGE_OVERHEAD, REPLY_PRIMING, ContextBuilder, StepRecord, Summary, message_text
from memory.run_memory import RunMemory
from memory.tokens import counter_for
from miniagi.prompts import system_prompt

COUNTER = counter_for("gpt-4o-mini")
SYSTEM = system_prompt("/tmp/work")
FILLER = "Routine entry: the line ran as scheduled and nothing of note was logged. "
FACT = re.compile(r"FACT \d+ is [a-z]+-\d+\.")
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
                       store=None, scope="run", run_id="r", objective="Read the log parts and keep what matters")
    memory.state.summary = summary
    return memory


def make_step(number: int, size: int, position: float, note_words: int) -> StepRecord:
    if note_words:
        text = note(number, note_words)
        return StepRecord(number, "keep it", "memorize_thoughts", text, "Noted.", notes=(text,))
    entries = [FILLER] * (size // 14)
    entries.insert(int(position * len(entries)), fact(number) + " ")
    return StepRecord(number, f"read part {number}", "execute_python", f"print(part({number}))", "".join(entries))


def check(messages: list[dict], steps: list[StepRecord], memory: RunMemory, budget: int) -> None:
    assert prompt_tokens(messages) <= budget
    text = "\n".join(message_text(m) for m in messages)
    steps_text = "\n".join(message_text(m) for m in messages[2:])  # the system prompt's example is no step
    shown = [int(n) for n in re.findall(r"Observation \(step (\d+)\)", steps_text)]
    through = memory.summary.through_step
    # no window: every earlier step is in view, verbatim, or covered by the summary, or in brief until it is
    assert shown == [s.step for s in steps if s.step > memory.summary.out_of_view]
    for record in steps:
        for kept in record.notes:  # every note, whole, in every later prompt
            assert kept in text, f"note of step {record.step} missing"
        if record.command == "execute_python":  # every fact in its step in view, in brief, or in the summary
            assert fact(record.step) in text, f"fact of step {record.step} missing"
    if through:
        assert f"SUMMARY OF STEP{'S 1-' if through > 1 else ' '}{through} " in messages[1]["content"]
    if memory.summary.out_of_view > through:
        assert f"STEPS {through + 1}-{memory.summary.out_of_view} IN BRIEF" in messages[1]["content"]


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
            before, _ = memory.context(system=SYSTEM, steps=steps, next_step=number)
            after, _ = resumed.context(system=SYSTEM, steps=steps, next_step=number)
            if not before.reshaped and not after.reshaped:
                assert after.messages == before.messages  # resume rebuilds the same view
            memory = resumed
        context, _ = memory.context(system=SYSTEM, steps=steps, next_step=number)
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
                       store=None, scope="run", run_id="r", objective="Keep notes")
    steps = [make_step(n, 300, 0.5, 40 if n % 2 else 0) for n in range(1, 31)]  # a long note every other step
    for number in range(1, 32):
        context, _ = memory.context(system=SYSTEM, steps=steps[:number - 1], next_step=number)
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
        [s.step for s in later if s.step <= summary.out_of_view], reverse=True)  # newest first
    assert any("notes to itself" in p for p in prompts)


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
