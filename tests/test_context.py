"""The context builder keeps every agent prompt within --max-context-tokens."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory.context import MESSAGE_OVERHEAD, REPLY_PRIMING, ContextBuilder, ContextOverflow, StepRecord
from memory.run_memory import RunMemory
from memory.tokens import counter_for
from miniagi.prompts import system_prompt
from miniagi.state import RunState

from .conftest import run_context

COUNTER = counter_for("gpt-4o-mini")
SYSTEM = system_prompt("/tmp/work")


def prompt_tokens(messages):
    return sum(COUNTER.count(m["content"]) + MESSAGE_OVERHEAD for m in messages) + REPLY_PRIMING


def make_steps(sizes):
    return [StepRecord(i + 1, f"thought {i}", "execute_python", f"print({i})", "word " * size)
            for i, size in enumerate(sizes)]


def memory_for(budget: int) -> RunMemory:
    return RunMemory(builder=ContextBuilder(COUNTER, budget), summarizer_counter=COUNTER,
                     ask_summarizer=lambda prompt: "summary of what was done " * 40, store=None, scope="run",
                     run_id="r", state=RunState(objective="do things"))


def drive(memory: RunMemory, sizes: list[int], alerts: list[str] | None = None):
    """Build the prompt of every step of a run whose steps print `sizes` words; yield (prompt, folded)."""
    steps: list[StepRecord] = []
    for number in range(1, len(sizes) + 2):
        context, folded = run_context(memory, system=SYSTEM, steps=steps, next_step=number,
                                      alerts=(alerts or [""] * (len(sizes) + 1))[number - 1])
        yield context, folded
        if number <= len(sizes):
            steps.append(make_steps(sizes)[number - 1])


@given(budget=st.integers(min_value=1500, max_value=8000),
       sizes=st.lists(st.integers(min_value=0, max_value=3000), max_size=40),
       alerts=st.lists(st.text(max_size=3000), min_size=41, max_size=41))
@settings(max_examples=40, deadline=None)
def test_every_prompt_fits_the_budget_and_extends_the_one_before_it_until_steps_leave_the_view(budget, sizes,
                                                                                               alerts):
    previous = None
    for context, _folded in drive(memory_for(budget), sizes, alerts):
        assert prompt_tokens(context.messages) <= budget
        assert context.tokens == prompt_tokens(context.messages)
        roles = [m["role"] for m in context.messages]
        assert roles[0] == "system" and roles[-1] == "user"
        assert all(a != b for a, b in zip(roles[1:], roles[2:]))  # user and assistant alternate
        if previous is not None and not context.reshaped and len(previous) > 2:
            # the cached prefix: all of the last prompt but its tail (recall, alerts, the request)
            assert context.messages[:len(previous) - 1] == previous[:-1]
            assert previous[-1]["content"].startswith(context.messages[len(previous) - 1]["content"])
        previous = context.messages


def test_steps_the_summary_does_not_cover_are_verbatim_and_steps_leave_in_batches():
    memory = memory_for(3000)
    runs = list(drive(memory, [200] * 30))
    context = runs[-1][0]
    shown = [m["content"] for m in context.messages if m["content"].startswith("Observation (step")]
    numbers = [int(text.split("step ")[1].split(")")[0]) for text in shown]
    # no window: the steps out of view are exactly those the summary covers
    summary = memory.summary
    assert numbers == list(range(summary.through_step + 1, 31)) and 0 < len(numbers) < 30
    assert context.messages[-1]["content"].endswith("Step 31: reply with your next action.")
    head = context.messages[1]["content"]
    assert f"SUMMARY OF STEPS 1-{summary.through_step} " in head and "IN BRIEF" not in head
    folds = sum(1 for _, folded in runs if folded)
    assert 1 <= folds <= 30 / 4  # several steps leave at once: a summarizer call per four steps or fewer


def test_an_oversized_newest_step_is_cut_to_fit_rather_than_dropped():
    runs = list(drive(memory_for(2500), [50, 20000]))
    context = runs[-1][0]
    assert context.steps_shown >= 1 and "tokens cut" in context.messages[-1]["content"]
    assert prompt_tokens(context.messages) <= 2500


def test_fixed_parts_that_cannot_fit_are_refused_up_front():
    with pytest.raises(ContextOverflow, match="at least"):
        ContextBuilder(COUNTER, 300).check_fits(SYSTEM, "objective")
    ContextBuilder(COUNTER, 2000).check_fits(SYSTEM, "objective")


def test_token_counting_works_offline_for_openai_and_other_models():
    assert COUNTER.count("hello world") == 2
    assert counter_for("gpt-4").encoding.name == "cl100k_base"
    assert counter_for("gpt-4o").encoding.name == "o200k_base"
    foreign = counter_for("llama3.1:8b")
    assert foreign.count("hello world, how are you?") > counter_for("gpt-4").count("hello world, how are you?")


def test_a_runs_state_owns_the_summary_the_memory_reads_it_there():
    """Given the run's state, the memory keeps no copy: the summary a context makes is returned, the state takes it
    only through its event (as the run records it), and a state read back from a trace is what the memory shows."""
    from miniagi import events as ev

    state = RunState(objective="count the seals")
    memory = RunMemory(builder=ContextBuilder(COUNTER, 2000), summarizer_counter=COUNTER,
                       ask_summarizer=lambda prompt: "SUMMARY-ONE of what was done", store=None, scope="run",
                       run_id="r", state=state)
    steps = make_steps([300] * 12)
    context, folded = memory.context(system=SYSTEM, steps=steps, next_step=13)
    assert folded is not None and folded.text == "SUMMARY-ONE of what was done" and folded.through_step >= 1
    assert state.summary.through_step == 0  # not taken until it is recorded
    state.apply(ev.SummaryFolded(step=12, text=folded.text, through_step=folded.through_step,
                                 notes_digest=folded.notes_digest or None, notes_through=folded.notes_through or None))
    assert memory.summary == folded
    state.objective, state.background = "count the seals twice", "an earlier run counted 7"
    context, _ = memory.context(system=SYSTEM, steps=steps, next_step=13)
    head = context.messages[1]["content"]
    assert "count the seals twice" in head and "an earlier run counted 7" in head
    assert "SUMMARY-ONE" in head


def test_the_run_module_does_not_import_the_agent():
    """A run is built from its services: importing run.py loads no agent.py (no agent <-> run import circle)."""
    import subprocess
    import sys

    code = "import sys, miniagi.run; print('miniagi.agent' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_step_shown_cut_keeps_every_line_its_step_asked_about_wherever_they_lie():
    """Found by a capable model in the loop: a step printed its result (`V18 = 34`) and then a note whose middle line
    said what to do next; shown cut to fit, it kept the note's line and its neighbours, and lost the result at its
    top. The cut keeps the lines that matter wherever they are, with "…" where lines were left out."""
    filler = [f"{100000 + 7919 * i} cedar-{i} 0.{i:05d} hazel sable maple basil status=ok seq={i}" for i in range(40)]
    output = "\n".join(["V18 = 34", *filler[:20], "Note 19 of 30. Compute V19 = |V11 - 10|.", *filler[20:]])
    record = StepRecord(19, "Note 18 says V18 = (V1 times 2) mod 1000, so V18 = 34; then read note 19",
                        "execute_python", "print('V18 =', V18); print(open('notes/note19.txt').read())", output)
    builder = ContextBuilder(COUNTER, 3000)
    reply, observation = builder.render(record, room=300)
    shown = observation["content"]
    assert "V18 = 34" in shown and "Note 19 of 30. Compute V19 = |V11 - 10|." in shown
    assert "…" in shown and "print a part of it" in shown
    assert builder.message_tokens([reply, observation]) <= 300


def test_records_keep_every_field_when_repeats_are_collapsed():
    """Found by a capable model in the loop: repeats were collapsed wherever they came, so in a day's orders as JSON
    every record after the first lost its `"status": "shipped",` line (shown once, far above, with a count), and a
    cancelled manifold read as shipped. Only repeats in a row are collapsed now."""
    import json

    from memory.excerpt import collapse_repeats

    orders = [{"order_id": f"D20-{i:03d}", "product": "manifold" if i == 9 else "pump",
               "status": "cancelled" if i == 9 else "shipped", "qty": i} for i in range(10)]
    text = json.dumps(orders, indent=1)
    assert collapse_repeats(text) == text  # no field moved or dropped
    log = "start\n" + "routine check, nothing to report\n" * 50 + "the gate key is ZETA-9157\n"
    assert collapse_repeats(log) == "start\nroutine check, nothing to report [×50]\nthe gate key is ZETA-9157\n"


def test_a_json_output_shown_cut_keeps_the_records_its_step_asked_about_whole_and_says_it_was_cut_once():
    """Found by a capable model in the loop: a day's orders as JSON, cut to fit, kept scattered lines (a `qty` here,
    a `trace` there) and said twice that it was cut. The cut now keeps the lines that match the step's words
    ("manifolds" finds "manifold") with their neighbours, so the record it asked about keeps its fields."""
    import json

    from memory.context import cut_around

    orders = [{"order_id": f"D20-{i:03d}", "region": ["east", "west", "north"][i % 3],
               "product": "manifold" if i == 17 else "pump", "status": "cancelled" if i % 4 == 0 else "shipped",
               "qty": i + 1, "meta": {"trace": f"{i * 2654435761 % 2**64:016x}"}} for i in range(30)]
    output = json.dumps({"day": 20, "orders": orders}, indent=1) + "\nday 20 printed"
    first = cut_around(output, "the shipped manifolds of day 20", COUNTER, 900)  # the first cut, to the item cap
    record = StepRecord(26, "day 20: look for the shipped manifolds", "execute_python",
                        "print(open('api/day20.json').read())", first)
    builder = ContextBuilder(COUNTER, 4000)
    reply, observation = builder.render(record, room=350)
    shown = observation["content"]
    block = shown[shown.index('"order_id": "D20-017"'):]
    assert block.index('"product": "manifold"') < block.index('"status": "shipped"') < block.index('"qty": 18')
    assert shown.count("this output was cut") == 1 and "lines not shown)" in shown  # what was left out, where
    assert builder.message_tokens([reply, observation]) <= 350
