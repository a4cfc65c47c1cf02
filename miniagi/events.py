"""What happens in a run, as typed events: the one shape the live loop, the trace, resume, replay and `show` share.

A run emits events (`Run.emit`): each is appended to trace.jsonl, applied to the run's state (`RunState.apply`, the
only way that state changes, live and on resume) and shown in the terminal. An event's JSON is the line in the
trace: `{"type": …, "step": …, fields…}`. Keys an event does not know (written by a newer miniagi, or a run's
origin such as `replay_of`) are kept in `extra` and written back as they were.

Adding a field: add it to its dataclass here (with a default, so older traces still read) and, if it changes the
state, one line in `RunState.apply`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar


@dataclass
class Event:
    type: ClassVar[str] = ""
    tag: ClassVar[dict] = {}  # what tells apart types that share a name (the critic's "kind")
    step: int = 0
    extra: dict = field(default_factory=dict, repr=False)  # keys this version does not know, kept as they were

    def to_json(self) -> dict:
        data: dict[str, Any] = {"type": self.type, **self.tag}
        for spec in fields(self):
            value = getattr(self, spec.name)
            if spec.name == "extra" or (value is None and spec.metadata.get("omit_none")):
                continue
            data[spec.name] = value
        data.update({k: v for k, v in self.extra.items() if k not in data})
        return data

    @classmethod
    def from_json(cls, data: dict) -> "Event":
        names = {spec.name for spec in fields(cls)} - {"extra"}
        known = {key: value for key, value in data.items() if key in names}
        extra = {key: value for key, value in data.items()
                 if key not in names and key != "type" and key not in cls.tag}
        return cls(**known, extra=extra)


def optional(default=None):
    """A field left out of the JSON while it is None."""
    return field(default=default, metadata={"omit_none": True})


@dataclass
class RunStart(Event):
    type: ClassVar[str] = "run_start"
    time: str = ""
    run_id: str = ""
    objective: str = ""
    settings: dict = field(default_factory=dict)
    follows: str | None = optional()  # the run this one continues (miniagi -c / --cid / chat)
    background: str | None = optional()  # what the agent is told of that run: objective, answer, summary, notes


@dataclass
class ModelCall(Event):
    type: ClassVar[str] = "llm_call"
    role: str = "agent"
    model: str = ""
    response: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float = 0.0
    saved_usd: float = 0.0
    latency_s: float = 0.0
    finish_reason: str | None = None
    first_token_s: float | None = optional()  # streamed: seconds to the reply's first piece (the prompt's reading)
    generation_s: float | None = optional()  # streamed: seconds from the first piece to the end
    tokens_per_s: float | None = optional()  # streamed: completion tokens / generation_s
    tool_calls: list | None = optional()  # native tool calls of the reply (--protocol tools): {id, name, arguments}
    messages: list | None = optional()  # the request, with --debug


@dataclass
class Action(Event):
    type: ClassVar[str] = "action"
    thought: str = ""
    command: str = ""
    arg: str = ""  # the arguments as one text (the tags form)
    args: dict | None = optional()  # the arguments as one JSON object, as the model sent them (None: older traces)


@dataclass
class Observation(Event):
    type: ClassVar[str] = "observation"
    text: str = ""  # the observation as the model sees it
    notes: list | None = optional()  # what the step memorized (None in traces older than this field)
    note: str | None = optional()  # the part of text that says how the reply was read (at its end), not output
    search: list | None = optional()  # web search results the step left ({title, url, snippet}): "ingest_data 2"
    #                                   still names the second after a resume
    files: dict | None = optional()  # what the step changed in the work directory: path (a folder's ending in /) →
    #                                  added, modified or deleted (checkpoints on; None: off, or an older trace)

    @property
    def output(self) -> str:
        """What the command itself produced: the text without the note."""
        if self.note and self.text.endswith(f"\n\n{self.note}"):
            return self.text[:-len(self.note) - 2]
        return self.text


@dataclass
class FormatError(Event):
    type: ClassVar[str] = "format_error"
    error: str = ""
    response: str = ""


@dataclass
class SummaryFolded(Event):
    """Steps left the view: the summary covering them took their place (and their notes moved to the head). An
    older trace's briefed_through (steps once shown in brief) is kept in `extra`, unused."""

    type: ClassVar[str] = "summary"
    text: str = ""
    through_step: int = 0
    notes_digest: str | None = optional()  # the digest of the oldest notes, once they outgrew their room
    notes_through: int | None = optional()  # the notes of the steps up to this one are in the digest


@dataclass
class Recall(Event):
    type: ClassVar[str] = "recall"
    ids: list = field(default_factory=list)
    items: list = field(default_factory=list)  # each as the prompt showed it: {id, label, text}


@dataclass
class CriticReview(Event):
    type: ClassVar[str] = "critic"
    tag: ClassVar[dict] = {"kind": "review"}
    text: str = ""
    loop: bool = False


@dataclass
class CriticVerdict(Event):
    type: ClassVar[str] = "critic"
    tag: ClassVar[dict] = {"kind": "final"}
    accepted: bool = True
    text: str = ""


@dataclass
class LoopWarning(Event):
    type: ClassVar[str] = "loop_warning"
    repeats: int = 0
    text: str = ""
    kind: str = ""  # what the loop is made of


@dataclass
class Isolation(Event):
    """How executed code is contained (see miniagi/execution/sandbox.py); `reason`: what is not protected."""

    type: ClassVar[str] = "isolation"
    isolated: bool = False
    reason: str = ""
    sandbox: str = ""


@dataclass
class Error(Event):
    """Something went wrong that the run survived or ended with (vector memory off, a bug's traceback)."""

    type: ClassVar[str] = "error"
    text: str | None = optional()
    traceback: str | None = optional()


@dataclass
class Resume(Event):
    type: ClassVar[str] = "resume"
    time: str = ""
    settings: dict = field(default_factory=dict)
    kept_step: int | None = optional()  # a step cut off mid-way whose recorded reply is taken again (not asked anew)


@dataclass
class McpCall(Event):
    """An MCP tool's result as the server gave it (miniagi/mcp_tools.py): what `replay` answers the call with."""

    type: ClassVar[str] = "mcp_call"
    command: str = ""
    arguments: dict = field(default_factory=dict)
    result: str = ""
    ok: bool = True
    own: bool = False  # the result's words are miniagi's (a timeout, a server gone), not the server's


@dataclass
class RunEnd(Event):
    type: ClassVar[str] = "run_end"
    time: str = ""
    status: str = "error"
    answer: str | None = None
    message: str = ""
    cut_short: dict | None = optional()  # the step whose command was cut off: {step, command, ran_s}


@dataclass
class Unknown(Event):
    """An event of a type this version does not know: kept, shown nowhere, changes nothing."""

    name: str = ""

    def to_json(self) -> dict:
        return {"type": self.name, "step": self.step, **self.extra}


EVENT_TYPES: tuple[type[Event], ...] = (RunStart, ModelCall, Action, Observation, FormatError, SummaryFolded, Recall,
                                        CriticReview, CriticVerdict, LoopWarning, Isolation, Error, Resume, RunEnd,
                                        McpCall)
_BY_TYPE = {cls.type: cls for cls in EVENT_TYPES if cls.type != "critic"}


def from_json(data: dict) -> Event:
    """The typed event of one trace line."""
    kind = data.get("type")
    if kind == "critic":
        return (CriticVerdict if data.get("kind") == "final" else CriticReview).from_json(data)
    cls = _BY_TYPE.get(kind)
    if cls is None:
        rest = {key: value for key, value in data.items() if key not in ("type", "step")}
        return Unknown(step=data.get("step", 0), name=str(kind), extra=rest)
    return cls.from_json(data)


def read(lines) -> list[Event]:
    """Typed events from trace dicts (as `RunRecord.events()` yields them)."""
    return [from_json(data) for data in lines if isinstance(data, dict)]
