"""A run's state: what the loop needs to go on. It changes only by `apply(event)` — live, as the run emits each
event, and on resume, as the trace is read back — so the two can never drift apart."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

from memory.context import NOTE_COMMAND, StepRecord, Summary

from . import events as ev
from .config import ConfigError
from .loop_detector import LoopDetector

# (number, thought, command, arg, observation, raw_reply, notes, args) → the step as the context shows it
MakeRecord = Callable[..., StepRecord]


def plain_record(number: int, thought: str, command: str, arg: str, observation: str, raw_reply: str = "",
                 notes: tuple = (), args: dict | None = None) -> StepRecord:
    return StepRecord(number, thought, command, arg, observation, raw_reply=raw_reply, notes=tuple(notes), args=args)


@dataclass
class RunState:
    objective: str = ""
    started_at: str = ""
    run_id: str = ""
    background: str = ""  # a follow-up's account of the run it continues
    replay_of: str | None = None  # the run this one replays (its model calls are answered from the recording)
    follows: str | None = None  # the run it continues
    step: int = 0  # the newest step taken (or in progress: its action is known, its observation not yet)
    steps: list[StepRecord] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    cost_usd: float = 0.0
    saved_usd: float = 0.0  # what the endpoint's prompt cache took off the bill
    format_errors_in_a_row: int = 0
    loops: LoopDetector = field(default_factory=LoopDetector)
    repeats: int = 0  # length of the loop the newest step is part of (1: it brought something new)
    status: str = "running"
    answer: str | None = None
    summary: Summary = field(default_factory=Summary)
    criticism: str = ""  # the critic's latest review, shown until the next one replaces it
    rejections: int = 0  # final answers the critic rejected
    pending: ev.Action | None = None  # the action whose observation has not come yet
    cut_short: dict | None = None  # how the last stop cut off the pending action's command: {step, command, ran_s}
    last_search: list = field(default_factory=list)  # the newest web search's results ({title, url, snippet})
    make_record: MakeRecord = field(default=plain_record, repr=False, compare=False)

    @property
    def completed_step(self) -> int:
        """The newest step whose observation (or format error) is in."""
        return self.steps[-1].step if self.steps else 0

    def apply(self, event: ev.Event) -> None:
        handler = getattr(self, f"_on_{type(event).__name__}", None)
        if handler is not None:
            handler(event)

    @classmethod
    def from_events(cls, events: Iterable, make_record: MakeRecord = plain_record) -> "RunState":
        """The state as the trace leaves it (trace dicts or typed events)."""
        state: RunState | None = None
        for event in events:
            event = ev.from_json(event) if isinstance(event, dict) else event
            if isinstance(event, ev.RunStart):
                state = cls(make_record=make_record)
            if state is not None:
                state.apply(event)
        if state is None:
            raise ConfigError("this run's trace has no run_start event: it cannot be resumed")
        return state

    # --- one handler per event type that changes the state ------------------------------------------------------
    def _on_RunStart(self, event: ev.RunStart) -> None:
        self.objective, self.started_at, self.run_id = event.objective, event.time, event.run_id
        self.background = event.background or ""
        self.replay_of = event.extra.get("replay_of")
        self.follows = event.follows

    def _on_ModelCall(self, event: ev.ModelCall) -> None:
        self.llm_calls += 1
        self.prompt_tokens += event.prompt_tokens
        self.completion_tokens += event.completion_tokens
        self.cached_prompt_tokens += event.cached_tokens
        self.cost_usd += event.cost_usd
        self.saved_usd += event.saved_usd

    def _on_Action(self, event: ev.Action) -> None:
        self.step, self.pending = event.step, event

    def _on_Observation(self, event: ev.Observation) -> None:
        action = self.pending
        if action is None or action.step != event.step:
            return
        notes = event.notes if event.notes is not None else (
            [action.arg] if action.command == NOTE_COMMAND else [])  # traces older than Observation.notes
        record = self.make_record(action.step, action.thought, action.command, action.arg, event.text,
                                  notes=tuple(notes), args=action.args)
        self.steps.append(record)
        self.notes.extend(notes)
        if event.search is not None:
            self.last_search = event.search
        self.format_errors_in_a_row = 0
        self.repeats = self.loops.observe(action.command, action.arg, event.output)  # the command's own output
        self.pending = None

    def _on_FormatError(self, event: ev.FormatError) -> None:
        self.step, self.pending = event.step, None
        self.steps.append(self.make_record(event.step, "", "", "", event.error, raw_reply=event.response))
        self.format_errors_in_a_row += 1

    def _on_SummaryFolded(self, event: ev.SummaryFolded) -> None:
        self.summary = Summary(text=event.text, through_step=event.through_step,
                               notes_digest=event.notes_digest or "", notes_through=event.notes_through or 0)

    def _on_CriticReview(self, event: ev.CriticReview) -> None:
        self.criticism = event.text

    def _on_CriticVerdict(self, event: ev.CriticVerdict) -> None:
        if not event.accepted:
            self.rejections += 1

    def _on_Resume(self, event: ev.Resume) -> None:
        """A step cut off mid-way (its action known, its observation not) is taken again: its recorded action run
        again (`kept_step`), or its reply asked for anew."""
        self.status, self.cut_short = "running", None
        if event.kept_step is None or self.pending is None or self.pending.step != event.kept_step:
            self.pending, self.step = None, self.completed_step

    def _on_RunEnd(self, event: ev.RunEnd) -> None:
        self.status, self.answer, self.cut_short = event.status, event.answer, event.cut_short
