"""Typed events: each type round-trips through the trace, and the state rebuilt from a trace (resume) equals the
live state at the same point — by property over generated event sequences, and for a real run of the loop."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from miniagi import Agent, ScriptedModel, Settings
from miniagi import events as ev
from miniagi.run_store import RunRecord
from miniagi.state import RunState

from .fake_llm import summarizing

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
SCALARS = {"str": TEXT, "int": st.integers(0, 10**6), "bool": st.booleans(),
           "float": st.floats(allow_nan=False, allow_infinity=False, min_value=0, max_value=1e6),
           "list": st.lists(TEXT, max_size=3), "dict": st.dictionaries(TEXT, TEXT, max_size=3)}


def field_strategy(spec: dataclasses.Field):
    kind, _, optional = str(spec.type).partition(" | ")
    strategy = SCALARS[kind]
    return st.none() | strategy if optional else strategy


def event_strategy(cls: type[ev.Event]):
    names = {spec.name for spec in dataclasses.fields(cls)}
    keys = st.text("abcdefgh", min_size=1, max_size=6).map(lambda key: f"x_{key}")
    extra = st.dictionaries(keys, TEXT | st.integers(), max_size=2)
    return st.builds(cls, extra=extra, **{spec.name: field_strategy(spec) for spec in dataclasses.fields(cls)
                                          if spec.name != "extra" and spec.name in names})


ANY_EVENT = st.one_of([event_strategy(cls) for cls in ev.EVENT_TYPES])


def through_trace(tmp_path, events: list[ev.Event]) -> list[ev.Event]:
    record = RunRecord(tmp_path / "run")
    try:
        record.trace_path.unlink()
    except FileNotFoundError:
        pass
    for event in events:
        record.append(event.to_json())
    record.close()
    return ev.read(record.events())


def test_every_event_type_is_tested():
    assert len(ev.EVENT_TYPES) >= 13 and {cls.type for cls in ev.EVENT_TYPES} >= {
        "run_start", "llm_call", "action", "observation", "format_error", "summary", "recall", "critic",
        "loop_warning", "error", "resume", "run_end"}


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(events=st.lists(ANY_EVENT, min_size=1, max_size=6))
def test_every_event_round_trips_through_the_trace(tmp_path, events):
    read_back = through_trace(tmp_path, events)
    assert read_back == events
    assert [type(e) for e in read_back] == [type(e) for e in events]


def test_an_old_trace_still_reads_and_an_unknown_event_is_kept(tmp_path):
    """Round 1 wrote notes only as memorize_thoughts actions, and a newer miniagi may write events we do not know."""
    lines = [{"type": "run_start", "step": 0, "time": "t", "run_id": "r", "objective": "o", "settings": {},
              "replay_of": "earlier"},
             {"type": "llm_call", "step": 1, "role": "agent", "model": "m", "response": "x", "prompt_tokens": 5,
              "completion_tokens": 2, "cost_usd": 0.5, "latency_s": 0.1},
             {"type": "action", "step": 1, "thought": "keep it", "command": "memorize_thoughts", "arg": "the key is 7"},
             {"type": "observation", "step": 1, "text": "Noted"},
             {"type": "telepathy", "step": 1, "payload": [1, 2]}]
    events = ev.read(lines)
    assert events[0].extra == {"replay_of": "earlier"} and isinstance(events[-1], ev.Unknown)
    assert [e.to_json() for e in events][0]["replay_of"] == "earlier"
    assert events[-1].to_json() == lines[-1]
    state = RunState.from_events(lines)
    assert state.notes == ["the key is 7"] and state.steps[0].notes == ("the key is 7",)
    assert (state.step, state.llm_calls, state.cost_usd, state.cached_prompt_tokens) == (1, 1, 0.5, 0)


# --- generated runs: resume equals live at every point ------------------------------------------------------------
COMMANDS = st.sampled_from(["execute_python", "execute_shell", "memorize_thoughts", "web_search", "done"])
SMALL = st.sampled_from(["ok", "NameError: name 'x' is not defined", "exit code 1\nNo such file", "42", "done"])


@st.composite
def run_events(draw) -> list[ev.Event]:
    """A plausible run: steps (action + observation, or a format error), with model calls, folds, reviews,
    verdicts, loop warnings, recalls, errors, a step cut off and resumed, and an end."""
    events: list[ev.Event] = [ev.RunStart(time="t0", run_id="r", objective=draw(TEXT), settings={"model": "m"})]
    step = 0
    for _ in range(draw(st.integers(0, 14))):
        step += 1
        events.append(ev.ModelCall(step=step, response=draw(TEXT), prompt_tokens=draw(st.integers(0, 9000)),
                                   completion_tokens=draw(st.integers(0, 500)),
                                   cached_tokens=draw(st.integers(0, 9000)),
                                   cost_usd=draw(st.sampled_from([0.0, 0.001, 0.25])),
                                   saved_usd=draw(st.sampled_from([0.0, 0.0005]))))
        if draw(st.integers(0, 5)) == 0:
            events.append(ev.FormatError(step=step, error=draw(TEXT), response=draw(TEXT)))
            continue
        command = draw(COMMANDS)
        events.append(ev.Action(step=step, thought=draw(TEXT), command=command, arg=draw(SMALL)))
        if draw(st.integers(0, 8)) == 0:  # cut off mid-step (killed), then resumed: the step is taken again
            events.append(ev.Resume(step=step - 1, time="t1"))
            step -= 1
            continue
        if command == "execute_python" and draw(st.booleans()):
            events.append(ev.ModelCall(step=step, role="summarizer", cost_usd=0.01))
        notes = draw(st.none() | st.lists(TEXT, max_size=2)) if command == "memorize_thoughts" else draw(
            st.sampled_from([None, []]))
        events.append(ev.Observation(step=step, text=draw(SMALL), notes=notes))
        extra = draw(st.sampled_from(["", "summary", "review", "verdict", "loop", "recall", "error"]))
        if extra == "summary":
            events.append(ev.SummaryFolded(step=step, text=draw(TEXT), through_step=max(0, step - 2)))
        elif extra == "review":
            events.append(ev.CriticReview(step=step, text=draw(TEXT), loop=draw(st.booleans())))
        elif extra == "verdict":
            events.append(ev.CriticVerdict(step=step, accepted=draw(st.booleans()), text=draw(TEXT)))
        elif extra == "loop":
            events.append(ev.LoopWarning(step=step, repeats=3, text="going round", kind="the same error"))
        elif extra == "recall":
            events.append(ev.Recall(step=step + 1, ids=["r:step:1"]))
        elif extra == "error":
            events.append(ev.Error(step=step, text="vector memory: gone"))
    if draw(st.booleans()):
        events.append(ev.RunEnd(step=step, time="t2", status=draw(st.sampled_from(["done", "limit", "interrupted"])),
                                answer=draw(st.none() | TEXT)))
    return events


@settings(max_examples=120, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(events=run_events())
def test_state_rebuilt_from_the_trace_equals_the_live_state_at_every_step(tmp_path, events):
    record = RunRecord(tmp_path / "run")
    if record.trace_path.exists():
        record.trace_path.unlink()
    live = RunState()
    for count, event in enumerate(events, start=1):
        record.append(event.to_json())
        live.apply(event)
        lines = list(record.events())
        assert len(lines) == count
        assert RunState.from_events(lines) == live
    record.close()
    completed = [e for e in events if isinstance(e, (ev.Observation, ev.FormatError))]
    assert len(live.steps) <= len(completed)
    assert live.llm_calls == sum(isinstance(e, ev.ModelCall) for e in events)


# --- a real run of the loop --------------------------------------------------------------------------------------
def act(command: str, arg: str, thought: str = "next") -> str:
    return f"<r>{thought}</r><c>{command}</c>\n{arg}"


def test_resume_state_equals_the_live_state_of_a_real_run(tmp_path):
    """The loop changes its state only through events: after a run with notes, format errors, a loop, folds,
    reviews and a rejected answer, the state read back from its trace is the run's own state."""
    agent_replies = iter([act("memorize_thoughts", "the target is 3 lines"),
                          act("execute_python", "print('x' * 900)"),
                          "I am not sure what to do",
                          act("execute_shell", "cat missing.txt"),
                          act("execute_shell", "cat missing.txt"),
                          act("execute_shell", "cat missing.txt"),
                          *[act("execute_python", f"print('line {i} ' * 120)") for i in range(16)],
                          act("memorize_thoughts", "second note"),
                          act("done", "three lines"),
                          act("done", "three lines, checked")])
    verdicts = iter(["REJECT: not checked", "ACCEPT: fine"])

    def reply(messages):
        system = messages[0]["content"] if messages[0]["role"] == "system" else ""
        if system.startswith("You are the critic"):
            return next(verdicts) if "PROPOSED FINAL ANSWER" in messages[1]["content"] else "CRITICISM: none"
        if summarizing({"messages": messages}):
            return "A summary of the folded steps."
        return next(agent_replies)

    settings_ = Settings(home=str(tmp_path / "home"), workdir=str(tmp_path / "work"), yes=True, unattended=True,
                         memory_scope="off", critic=True, critic_every=2, max_context_tokens=2600,
                         max_memory_item_tokens=400)
    agent = Agent(settings_, model=ScriptedModel([reply] * 80))
    run = agent.start("Write three lines")
    result = run.drive()
    assert result.status == "done" and result.answer == "three lines, checked"
    live = run.state
    rebuilt = RunState.from_events(run.record.events(), agent.step_record)
    assert rebuilt == live
    assert live.notes == ["the target is 3 lines", "second note"] and live.rejections == 1
    assert live.criticism and live.summary.text and live.loops.kind
    assert any(not s.command for s in live.steps)  # the format error is a step
