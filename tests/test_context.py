"""The context builder keeps every agent prompt within --max-context-tokens."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory.context import MESSAGE_OVERHEAD, REPLY_PRIMING, ContextBuilder, ContextOverflow, StepRecord
from memory.tokens import counter_for
from miniagi.prompts import system_prompt

COUNTER = counter_for("gpt-4o-mini")
SYSTEM = system_prompt("/tmp/work")


def prompt_tokens(messages):
    return sum(COUNTER.count(m["content"]) + MESSAGE_OVERHEAD for m in messages) + REPLY_PRIMING


def make_steps(sizes):
    return [StepRecord(i + 1, f"thought {i}", "execute_python", f"print({i})", "word " * size)
            for i, size in enumerate(sizes)]


@given(budget=st.integers(min_value=1500, max_value=8000),
       sizes=st.lists(st.integers(min_value=0, max_value=3000), max_size=40),
       notes=st.lists(st.text(min_size=1, max_size=200), max_size=30))
@settings(max_examples=60, deadline=None)
def test_the_whole_prompt_always_fits_the_budget(budget, sizes, notes):
    builder = ContextBuilder(COUNTER, budget)
    context = builder.build(system=SYSTEM, objective="do things", steps=make_steps(sizes), next_step=len(sizes) + 1,
                            notes=notes)
    assert prompt_tokens(context.messages) <= budget
    assert context.tokens == prompt_tokens(context.messages)


def test_recent_steps_are_verbatim_newest_kept_in_order():
    steps = make_steps([200] * 30)
    context = ContextBuilder(COUNTER, 3000).build(system=SYSTEM, objective="x", steps=steps, next_step=31)
    shown = [m["content"] for m in context.messages if m["content"].startswith("Observation (step")]
    numbers = [int(text.split("step ")[1].split(")")[0]) for text in shown]
    assert numbers == list(range(31 - len(numbers), 31)) and 0 < len(numbers) < 30
    assert context.messages[-1]["content"] == "Step 31: reply with your next action."


def test_an_oversized_newest_step_is_cut_to_fit_rather_than_dropped():
    steps = make_steps([50, 20000])
    context = ContextBuilder(COUNTER, 2500).build(system=SYSTEM, objective="x", steps=steps, next_step=3)
    assert context.steps_shown == 1 and "tokens cut" in context.messages[-2]["content"]
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
