"""`miniagi replay`: drive the real loop with a run's recorded model responses — no model calls — executing the
commands again, and report the first step whose observation differs from the recording."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from memory.jsonl import json_lines

from . import events as ev
from .commands import COMMANDS
from .config import ConfigError, Settings
from .model import Completion, ScriptExhausted, ToolCall, local_completion
from .run_store import RunRecord, RunStore
from .trust import narrowed, recorded_workdir


class ReplayModel:
    """Answers each role's calls with that role's recorded responses, in order; never touches the network."""

    def __init__(self, responses: dict[str, list[Response]]):
        self.queues = {role: deque(texts) for role, texts in responses.items()}
        self.calls = 0

    def complete(self, messages: list[dict], *, model: str, role: str = "agent", max_tokens: int | None = None,
                 stop: list[str] | None = None, **request) -> Completion:
        queue = self.queues.get(role)
        if not queue:
            if role == "agent":
                raise ScriptExhausted("the recording has no more agent responses: the replay went further than "
                                      "the recorded run")
            response = Response(f"(replay: no recorded {role} response)")  # only the agent's replies steer the run
        else:
            response = queue.popleft()
        self.calls += 1
        return local_completion(messages, model, response.text, tool_calls=response.tool_calls)


@dataclass(frozen=True)
class Response:
    """A recorded reply: its text and, with --protocol tools, its tool calls."""

    text: str
    tool_calls: tuple[ToolCall, ...] = ()

    @classmethod
    def of(cls, event: ev.ModelCall) -> "Response":
        return cls(event.response, tuple(ToolCall.from_json(call) for call in event.tool_calls or ()))


@dataclass
class Recording:
    run_id: str
    objective: str
    settings: dict
    responses: dict[str, list[Response]]
    observations: dict[int, str]  # step → what the step produced (an observation or a format error)
    commands: dict[int, str]
    status: str | None
    mcp_tools: list = field(default_factory=list)  # the MCP tools the run had, and their calls' results, in order
    mcp_calls: list = field(default_factory=list)
    workdir_id: list | None = None  # what its work directory was at its start (trust.recorded_workdir)

    @classmethod
    def from_events(cls, events: list[dict], name: str) -> "Recording":
        typed = ev.read(events)
        start = next((e for e in typed if isinstance(e, ev.RunStart)), None)
        if start is None:
            raise ConfigError(f"{name} holds no run_start event: it is not a miniagi trace")
        agent_calls: dict[int, Response] = {}  # a step cut off and taken again keeps its last reply
        others: dict[str, list[Response]] = {}
        observations, commands, status, mcp_calls = {}, {}, None, []
        for event in typed:
            if isinstance(event, ev.McpCall):
                mcp_calls.append(event.to_json())
            if isinstance(event, ev.ModelCall) and event.role == "agent":
                agent_calls[event.step] = Response.of(event)
            elif isinstance(event, ev.ModelCall):
                others.setdefault(event.role, []).append(Response.of(event))
            elif isinstance(event, ev.Observation):
                observations[event.step] = event.text
            elif isinstance(event, ev.FormatError):
                observations[event.step] = event.error
            elif isinstance(event, ev.Action):
                commands[event.step] = event.command
            elif isinstance(event, ev.RunEnd):
                status = event.status
        return cls(run_id=start.run_id or name, objective=start.objective, settings=start.settings or {},
                   responses={"agent": [agent_calls[step] for step in sorted(agent_calls)], **others},
                   observations=observations, commands=commands, status=status,
                   mcp_tools=list(start.extra.get("mcp_tools") or []), mcp_calls=mcp_calls,
                   workdir_id=start.extra.get("workdir_id"))


def load_recording(source: str, store: RunStore) -> Recording:
    path = Path(source).expanduser()
    if path.is_file():
        return Recording.from_events(list(json_lines(path.read_text(encoding="utf-8").split("\n"))), str(path))
    record: RunRecord = store.open(source)
    return Recording.from_events(list(record.events()), record.run_id)


@dataclass
class ReplayReport:
    original: str
    replay_run: str
    status: str
    recorded_status: str | None
    steps: int
    model_calls: int = 0  # calls that reached a model endpoint: always 0
    replayed_responses: int = 0
    first_difference: dict | None = None
    differences: list[int] = field(default_factory=list)

    @property
    def reproduced(self) -> bool:
        return not self.differences and self.status == self.recorded_status

    def to_dict(self) -> dict:
        return {"original": self.original, "replay_run": self.replay_run, "reproduced": self.reproduced,
                "status": self.status, "recorded_status": self.recorded_status, "steps": self.steps,
                "model_calls": self.model_calls, "replayed_responses": self.replayed_responses,
                "differing_steps": self.differences, "first_difference": self.first_difference}


def compare(recording: Recording, replayed: Recording) -> tuple[list[int], dict | None]:
    steps = sorted(set(recording.observations) | set(replayed.observations))
    differing = [s for s in steps if recording.observations.get(s) != replayed.observations.get(s)]
    if not differing:
        return [], None
    step = differing[0]
    return differing, {"step": step, "command": recording.commands.get(step) or replayed.commands.get(step, ""),
                       "recorded": recording.observations.get(step), "replayed": replayed.observations.get(step)}


def replay(source: str, settings: Settings, overrides: dict, ui=None) -> ReplayReport:
    """Replay a run (by id or trace file) under `settings`' home; `overrides` change the recorded settings."""
    from .agent import Agent

    store = RunStore(settings.home_path)
    recording = load_recording(source, store)
    # a trace never grants approval: -y must be given now, or the person at the terminal is asked, as by `run`
    yes = bool(overrides.get("yes"))
    interactive = ui is not None and ui.interactive
    # nothing wider than the user's settings comes from the trace (a crafted file, or one code rewrote)
    replay_settings, differences = narrowed(Settings.from_dict(recording.settings), settings)
    # the agent contacts nothing: memory stays local (no memory server, no endpoint embeddings) or is off
    local_memory = replay_settings.memory_url is None and replay_settings.embedding_model == "local"
    replay_settings = replay_settings.with_overrides(
        {**{k: v for k, v in overrides.items() if v is not None}, "home": str(settings.home_path), "yes": yes,
         "unattended": not interactive, **({} if local_memory else {"memory_scope": "off"})})
    if ui is not None:
        said = [text for name, text in differences.items() if name not in ("yes", "home")]
        if said:
            ui.warn("not taken from the recording: " + "; ".join(said))
        ui.say("a replay contacts nothing: no model (the recorded replies answer), no web search or URL, "
               + ("local memory only" if local_memory else "no memory"))
    runs_code = sorted({c for c in recording.commands.values() if c in COMMANDS and COMMANDS[c].needs_approval})
    if runs_code and not yes and not interactive:
        raise ConfigError(f"this replay runs the recorded {' and '.join(runs_code)} commands again: give -y to "
                          "allow it (there is no terminal to ask in)")
    if not overrides.get("workdir") and not replay_settings.workdir_path.is_dir():
        # a trace from another machine: its workdir is not here, so the commands run in the current directory
        replay_settings = replay_settings.with_overrides({"workdir": str(Path.cwd())})
        if ui is not None and runs_code:
            ui.warn(f"the recorded work directory {recording.settings.get('workdir')} is not here: commands run in "
                    f"{replay_settings.workdir_path} (use --workdir DIR to choose)")
    else:
        if not overrides.get("workdir") and replay_settings.workdir.startswith("/"):  # the recorded folder: the one
            recorded_workdir(str(replay_settings.workdir), recording.workdir_id, "; give --workdir to choose one")
        if ui is not None and runs_code:
            ui.warn(f"commands run in {replay_settings.workdir_path}")
    model = ReplayModel(recording.responses)
    # no MCP server is started: each tool call gets the result the recording holds for it
    from .mcp_tools import RecordedMcp

    agent = Agent(replay_settings, model=model, ui=ui, offline=True,
                  mcp=RecordedMcp(recording.mcp_tools, recording.mcp_calls))
    try:
        result = agent.run(recording.objective, origin={"replay_of": recording.run_id})
    finally:
        agent.close()
    replayed = Recording.from_events(list(store.open(result.run_id).events()), result.run_id)
    differing, first = compare(recording, replayed)
    return ReplayReport(original=recording.run_id, replay_run=result.run_id, status=result.status,
                        recorded_status=recording.status, steps=result.steps, replayed_responses=model.calls,
                        first_difference=first, differences=differing)
