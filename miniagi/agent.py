"""The loop: build the context → ask the model for one action → run it → record the observation → repeat.

Stopping is explicit: `done` raises Submitted, limits and give-ups raise a Stop with the run's status and exit code.
Every event goes to the run's trace as it happens; `resume` rebuilds the state from that trace.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import traceback
from dataclasses import dataclass, field
from typing import Mapping

from memory.context import ContextBuilder, ContextOverflow, StepRecord, truncate_middle
from memory.run_memory import RunMemory, Summary
from memory.store import VectorMemory
from memory.tokens import counter_for

from . import critic
from .commands import COMMANDS, Submitted
from .config import ConfigError, Settings, read_dotenv
from .containment import Containment, Limits
from .execution import ExecResult, PythonSession, cap_text, run_shell
from .loops import STOP_AFTER, WARN_AFTER, LoopDetector
from .model import Completion, Model, ModelError, ModelUnavailable, PriceTable
from .parser import Action, FormatError, parse_reply
from .prompts import system_prompt
from .runs import RunRecord, RunStore, now_iso, process_identity
from .sandbox import Sandbox
from .secrets import Redactor, child_environment
from .ui import Terminal
from .websearch import DdgsBackend, SearchBackend

MAX_FORMAT_ERRORS = 3  # malformed replies in a row before the run is given up
# where a reply in the tag format should end: a second action, or an observation the model goes on to invent
STOP_SEQUENCES = ["\nObservation", "\nobservation:", "Observation (step", "\n<r>"]
CUT_OFF = ("it was cut off: it reached the length limit before it ended, so nothing in it was run. Send a shorter "
           "reply — a brief thought and one command; write long code or a long text in parts over several steps")
CHARS_PER_TOKEN = 4  # for cheap character caps that stay above a token cap

EXIT_CODES = {"done": 0, "error": 1, "limit": 3, "format_error": 4, "stuck": 5, "interrupted": 130}


class Stop(Exception):
    """The run ends without an answer; carries the status and what to tell the user."""

    status = "error"

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        self.exit_code = EXIT_CODES[self.status] if exit_code is None else exit_code


class LimitReached(Stop):
    status = "limit"


class TooManyFormatErrors(Stop):
    status = "format_error"


class Stuck(Stop):
    status = "stuck"


@dataclass
class RunResult:
    run_id: str
    status: str
    answer: str | None
    exit_code: int
    message: str = ""
    steps: int = 0
    cost_usd: float = 0.0
    summary: dict = field(default_factory=dict)  # what result.json holds


@dataclass
class RunState:
    """Everything the loop needs to go on; rebuilt from the trace by `from_events`."""

    objective: str
    started_at: str = field(default_factory=now_iso)
    step: int = 0  # agent turns taken
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
    status: str = "running"
    answer: str | None = None
    summary: Summary = field(default_factory=Summary)
    criticism: str = ""  # the critic's latest review, shown until the next one replaces it
    rejections: int = 0  # final answers the critic rejected

    def count_call(self, completion: Completion, saved_usd: float = 0.0) -> None:
        self.llm_calls += 1
        self.prompt_tokens += completion.prompt_tokens
        self.completion_tokens += completion.completion_tokens
        self.cached_prompt_tokens += completion.cached_tokens
        self.cost_usd += completion.cost_usd
        self.saved_usd += saved_usd

    @classmethod
    def from_events(cls, events, make_record) -> "RunState":
        """Replay a trace: completed steps come back, a step cut off mid-way is taken again; every model call
        recorded (the cut-off step's too) stays counted."""
        state: RunState | None = None
        pending: dict | None = None
        for event in events:
            kind = event.get("type")
            if kind == "run_start":
                state = cls(objective=event["objective"], started_at=event.get("time") or now_iso())
            elif state is None:
                continue
            elif kind == "llm_call":
                state.llm_calls += 1
                state.prompt_tokens += event.get("prompt_tokens", 0)
                state.completion_tokens += event.get("completion_tokens", 0)
                state.cached_prompt_tokens += event.get("cached_tokens", 0)
                state.cost_usd += event.get("cost_usd", 0.0)
                state.saved_usd += event.get("saved_usd", 0.0)
            elif kind == "action":
                pending = event
            elif kind == "observation" and pending and pending.get("step") == event.get("step"):
                state.add_action(make_record(pending["step"], pending["thought"], pending["command"],
                                             pending["arg"], event["text"]))
                pending = None
            elif kind == "format_error":
                state.add_format_error(make_record(event["step"], "", "", "", event["error"],
                                                   raw_reply=event.get("response", "")))
            elif kind == "summary":
                state.summary = Summary(text=event["text"], through_step=event["through_step"])
            elif kind == "critic" and event.get("kind") == "review":
                state.criticism = event.get("text", "")
            elif kind == "critic" and event.get("kind") == "final" and not event.get("accepted", True):
                state.rejections += 1
            elif kind == "run_end":
                state.status, state.answer = event.get("status", "error"), event.get("answer")
        if state is None:
            raise ConfigError("this run's trace has no run_start event: it cannot be resumed")
        return state

    def add_action(self, record: StepRecord) -> int:
        """Add a completed step; returns how many times in a row the agent has done the same thing."""
        self.step = record.step
        self.steps.append(record)
        self.format_errors_in_a_row = 0
        if record.command == "memorize_thoughts":
            self.notes.append(record.arg)
        return self.loops.observe(record.command, record.arg, record.observation)

    def add_format_error(self, record: StepRecord) -> None:
        self.step = record.step
        self.steps.append(record)
        self.format_errors_in_a_row += 1


class Workspace:
    """What commands act on: the work directory, the Python session, the shell, the person, the web, memory and
    the summarizer model."""

    def __init__(self, agent: "Agent"):
        settings = agent.settings
        self.settings = settings
        self.ui = agent.ui
        self.workdir = settings.workdir_path
        # the working directory is the code's home: caches and dotfiles it writes stay with the work
        self.env = dict(child_environment(agent.environ, settings.pass_env), HOME=str(self.workdir))
        self.containment = Containment(Limits(memory_mb=settings.exec_memory, cpu_s=settings.exec_timeout or 3600))
        self.sandbox = Sandbox(self.containment.cgroup_procs, path=agent.environ.get("PATH"))
        self.read_timeout = settings.read_timeout
        self.redact = agent.redact
        self.progress = agent.ui.progress
        self.max_chars = agent.max_chars
        self.memory = agent.memory
        self.search_backend = agent.search_backend
        self.summarize = agent._summarize
        self.remember = agent._remember
        self.counter = counter_for(settings.model_for("summarizer"))
        self.chunk_budget = max(1000, settings.max_context_tokens - 800)  # what one summarizer call may read
        self.answer_tokens = min(800, settings.max_memory_item_tokens)
        self.step = lambda: agent.state.step
        self.last_search: list = []
        self._python: PythonSession | None = None

    @property
    def python(self) -> PythonSession:
        if self._python is None:
            self._python = PythonSession(self.workdir, self.env, self.settings.exec_timeout, self.max_chars,
                                         self.containment, self.sandbox)
        return self._python

    def shell(self, command_line: str) -> ExecResult:
        return run_shell(command_line, self.workdir, self.env, self.settings.exec_timeout, self.max_chars,
                         self.containment, self.sandbox)

    def ask_user(self, message: str) -> str:
        if not self.ui.interactive:
            return ("No user is present: this run is unattended. Decide for yourself with what you have and go on; "
                    "do not ask again.")
        reply = self.ui.ask_user(message).strip()
        return f"The user replied: {reply}" if reply else "The user gave no reply."

    def remember_search(self, query: str, results: list) -> None:
        """Search results go to memory, so a later step can find a URL seen earlier."""
        step = self.step()
        self.remember(*[self.memory.item("search", f"Web search result for {query!r}: {r.title}\n{r.url}\n"
                                                          f"{r.snippet}", step, suffix=str(i))
                               for i, r in enumerate(results)])

    def close(self) -> None:
        if self._python is not None:
            self._python.close()
        self.sandbox.close()
        self.containment.close()


class Agent:
    """Runs objectives. Headless use:

        from miniagi import Agent, Settings
        result = Agent(Settings(model="gpt-4o-mini", yes=True, unattended=True)).run("What is 17 * 23?")
        print(result.status, result.answer)
    """

    def __init__(self, settings: Settings, *, model: Model | None = None, ui: Terminal | None = None,
                 environ: Mapping[str, str] | None = None, search_backend: SearchBackend | None = None):
        self.settings = settings
        self.search_backend = search_backend or DdgsBackend()
        self.environ = dict(os.environ if environ is None else environ)
        # the gate every text crosses before a model request, the run's files, the vector store or the terminal
        self.redact = Redactor(self.environ, read_dotenv())
        self.prices = getattr(model, "prices", None) or PriceTable(settings.prices)
        if model is None:
            from .config import Endpoint
            from .model import OpenAIModel

            model = OpenAIModel(Endpoint.from_environment(self.environ), self.prices,
                                request_timeout_s=settings.request_timeout, on_retry=lambda text: self.ui.warn(text))
        self.model = model
        interactive = not settings.unattended and sys.stdin is not None and sys.stdin.isatty()
        self.ui = ui or Terminal(interactive=interactive, debug=settings.debug)
        self.ui.redact = self.redact
        self.store = RunStore(settings.home_path, self.redact)
        self.counter = counter_for(settings.model)
        self.critic_counter = counter_for(settings.model_for("critic"))
        self.contexts = ContextBuilder(self.counter, settings.max_context_tokens)
        self.vectors = open_vector_memory(settings, self.environ, model, self.redact)
        self.system = system_prompt(str(settings.workdir_path))
        self.max_chars = settings.max_memory_item_tokens * CHARS_PER_TOKEN * 2
        self.alerts: list[str] = []
        self.isolation: str | None = None  # how executed code is kept from the agent's process (set per run)

    # --- starting and resuming -------------------------------------------------------------------------------
    def run(self, objective: str, origin: dict | None = None) -> RunResult:
        """Work on an objective until done or stopped. `origin` is recorded with the run (e.g. what it replays)."""
        objective = objective.strip()
        if not objective:
            raise ConfigError("the objective is empty: say what the agent should do")
        if "\x00" in objective:
            raise ConfigError("the objective contains a NUL byte: give it as plain text")
        self._check_budget(objective)
        self._check_workdir()
        self._check_endpoint()
        record = self.store.create()
        state = RunState(objective=objective)
        record.append({"type": "run_start", "step": 0, "time": state.started_at, "run_id": record.run_id,
                       "objective": objective, "settings": self.settings.to_dict(), **(origin or {})})
        return self._drive(record, state)

    def resume(self, run_id: str) -> RunResult:
        record = self.store.open(run_id)
        state = RunState.from_events(record.events(), self._step_record)
        if state.status == "done":
            raise ConfigError(f"run {record.run_id} is already done; its answer is in {record.result_path}")
        self._check_budget(state.objective)
        self._check_workdir()
        self._check_endpoint()
        record.append({"type": "resume", "step": state.step, "time": now_iso(), "settings": self.settings.to_dict()})
        self.alerts.append("NOTE: this run was interrupted and has been resumed. The Python session was restarted: "
                           "variables, imports and functions from earlier steps are gone; files on disk remain.")
        state.status = "running"
        return self._drive(record, state, resumed=True)

    def _report_isolation(self, sandbox: Sandbox) -> None:
        """Executed code runs in a namespace of its own where the platform allows; where not, say so, once."""
        self.isolation = "namespace" if sandbox.isolated else f"none: {sandbox.reason}"
        if not sandbox.isolated:
            self.ui.warn(f"executed code is NOT isolated from the agent's process: {sandbox.reason}. It can see the "
                         "agent's process in /proc and signal it.")
        self.record.append({"type": "isolation", "step": self.state.step, "isolated": sandbox.isolated,
                            "reason": sandbox.reason})

    def _check_workdir(self) -> None:
        """Code needs a directory to run in: a file there is a usage error; a missing one is made, and said."""
        path = self.settings.workdir_path
        if path.exists() and not path.is_dir():
            raise ConfigError(f"--workdir {path} is a file, not a directory")
        if not path.exists():
            try:
                path.mkdir(parents=True)
            except OSError as exc:
                raise ConfigError(f"--workdir {path} does not exist and cannot be made: {exc.strerror}") from None
            self.ui.warn(f"created the work directory {path}")

    def _check_endpoint(self) -> None:
        check = getattr(self.model, "check_reachable", None)
        if check is not None:
            check()

    def _check_budget(self, objective: str) -> None:
        try:
            self.contexts.check_fits(self.system, objective)
        except ContextOverflow as exc:
            raise ConfigError(str(exc)) from None

    # --- the loop ----------------------------------------------------------------------------------------------
    def _drive(self, record: RunRecord, state: RunState, resumed: bool = False) -> RunResult:
        self.record, self.state = record, state
        self.memory = RunMemory(builder=self.contexts, summarizer_counter=counter_for(self.settings.model_for(
            "summarizer")), ask_summarizer=self._summarize, store=self.vectors, scope=self.settings.memory_scope,
            run_id=record.run_id, objective=state.objective, workdir=str(self.settings.workdir_path))
        self.memory.summary = state.summary
        self.ui.run_started(record.run_id, state.objective, self.settings.model, state.step if resumed else 0)
        workspace = Workspace(self)
        message, exit_code = "", 0
        discard = False  # refused before the first model call: no run is left behind
        restore_sigterm = _raise_on_sigterm()
        try:
            self._report_isolation(workspace.sandbox)
            self._save("running")
            if not resumed:
                self._remember(self.memory.item("objective", state.objective))
            while True:
                self._check_limits()
                self._step(workspace)
        except Submitted as submitted:
            state.status, state.answer = "done", self.redact(submitted.answer)
            self._remember(self.memory.item("answer", f"Objective: {state.objective}\nFinal answer: "
                                                      f"{submitted.answer}", state.step))
        except Stop as stop:
            state.status, message, exit_code = stop.status, str(stop), stop.exit_code
        except (ModelUnavailable, ModelError) as exc:  # the endpoint down, hung, or refusing the request
            state.status, exit_code = "error", 2
            message = f"{exc}. The run is saved: `miniagi resume {record.run_id}` continues it."
        except ConfigError as exc:  # the endpoint refused us (bad key, unknown model)
            state.status, message, exit_code = "error", str(exc), 2
            discard = not resumed and state.llm_calls == 0
        except KeyboardInterrupt:
            state.status, exit_code = "interrupted", 130
            message = f"interrupted; `miniagi resume {record.run_id}` continues the run"
        except OSError as exc:  # most likely the disk: full, or a file size limit
            state.status, exit_code = "error", 1
            message = (f"cannot write the run's files ({exc.strerror or exc}). Nothing completed is lost: free "
                       f"some space, then `miniagi resume {record.run_id}` continues from the last completed step.")
        except Exception as exc:  # a bug of ours: keep the state, say what happened, stay resumable
            state.status, exit_code = "error", 1
            message = (f"internal error: {type(exc).__name__}: {exc}. The run is saved: "
                       f"`miniagi resume {record.run_id}` continues it.")
            self._record_quietly({"type": "error", "step": state.step, "traceback": traceback.format_exc()})
        finally:
            restore_sigterm()
            workspace.close()
            self._flush_memory()
        exit_code = EXIT_CODES["done"] if state.status == "done" else exit_code
        if discard:
            record.close()
            shutil.rmtree(record.dir, ignore_errors=True)
            raise ConfigError(message)
        self._record_quietly({"type": "run_end", "step": state.step, "time": now_iso(), "status": state.status,
                              "answer": state.answer, "message": message})
        try:
            result = self._save(state.status, message, exit_code)
        except OSError:
            result = self._result(state.status, message, exit_code)
        record.close()
        self.ui.run_ended(result)
        return RunResult(run_id=record.run_id, status=state.status, answer=state.answer, exit_code=exit_code,
                         message=message, steps=state.step, cost_usd=state.cost_usd, summary=result)

    def _check_limits(self) -> None:
        state, settings = self.state, self.settings
        if state.step >= settings.max_steps:
            raise LimitReached(f"step limit reached ({settings.max_steps} steps). Continue with "
                               f"`miniagi resume {self.record.run_id} --max-steps {settings.max_steps * 2}`")
        self._check_cost()

    def _check_cost(self) -> None:
        state, settings = self.state, self.settings
        if settings.max_cost and state.cost_usd >= settings.max_cost:
            raise LimitReached(f"cost limit reached (${state.cost_usd:.4f} of ${settings.max_cost:g}). Continue with "
                               f"`miniagi resume {self.record.run_id} --max-cost {settings.max_cost * 2:g}`")

    def _step(self, workspace: Workspace) -> None:
        state = self.state
        number = state.step + 1
        alerts = ([f"A REVIEWER'S CRITICISM OF YOUR PROGRESS:\n{state.criticism}"] if state.criticism else [])
        context, folded = self.memory.context(system=self.system, steps=state.steps, next_step=number,
                                              notes=state.notes, alerts="\n\n".join(self.alerts + alerts))
        self.alerts = []
        if folded:
            state.summary = folded
            self.record.append({"type": "summary", "step": state.step, "text": folded.text,
                                "through_step": folded.through_step})
        if self.memory.last_recalled:
            self.record.append({"type": "recall", "step": number, "ids": self.memory.last_recalled})
        if self.memory.failure:
            self.ui.warn(f"vector memory disabled for this run: {self.memory.failure}")
            self.record.append({"type": "error", "step": state.step, "text": f"vector memory: {self.memory.failure}"})
            self.memory.failure = ""
        self.ui.debug_context(context.messages)
        with self.ui.thinking(number):
            completion = self._ask("agent", context.messages, number)
        state.step = number  # a turn is taken once the model has answered
        try:
            if completion.finish_reason == "length":
                raise FormatError(CUT_OFF, completion.text)
            action = self._read(completion.text)
        except FormatError as error:
            self._format_error(number, completion.text, error)
            return
        self.record.append({"type": "action", "step": number, "thought": action.thought, "command": action.command,
                            "arg": action.arg})
        self.ui.action(number, action.thought, action.command, action.arg, state.cost_usd)
        try:
            observation = self._execute(workspace, action)  # `done` raises Submitted here
        except Submitted as submitted:
            observation = self._final_review(submitted)  # returns only when the answer is sent back
        if action.note:
            observation = f"{observation}\n\n{action.note}"
        observation = self.redact(cap_text(observation, self.max_chars))
        self.record.append({"type": "observation", "step": number, "text": observation})
        self.ui.observation(observation)
        step = self._step_record(number, action.thought, action.command, action.arg, observation)
        loop = state.add_action(step)
        self._remember(self.memory.step_item(step), *(
            [self.memory.item("note", action.arg, number)] if action.command == "memorize_thoughts" else []))
        warning = self._watch_for_loops(loop)
        if self.settings.critic and (warning or number % self.settings.critic_every == 0):
            self._review(warning)
        self._save("running")

    def _read(self, reply: str) -> Action:
        action = parse_reply(reply)
        if action.command not in COMMANDS:
            raise FormatError(f"{action.command!r} is not a command; the commands are: {', '.join(COMMANDS)}", reply)
        return action

    def _format_error(self, number: int, reply: str, error: FormatError) -> None:
        self.record.append({"type": "format_error", "step": number, "error": str(error), "response": reply})
        self.ui.warn(f"step {number}: the reply could not be used: {error.problem}")
        self.state.add_format_error(self._step_record(number, "", "", "", str(error), raw_reply=reply))
        self._save("running")
        if self.state.format_errors_in_a_row >= MAX_FORMAT_ERRORS:
            raise TooManyFormatErrors(f"the model broke the reply format {MAX_FORMAT_ERRORS} times in a row "
                                      f"(last problem: {error.problem})")

    def _watch_for_loops(self, length: int) -> str:
        """The warning for a loop in progress ("" when there is none); a loop that persists ends the run."""
        if length >= STOP_AFTER:
            raise Stuck(f"stuck in a loop: {self.state.loops.kind}, {length} times in the last steps")
        if length < WARN_AFTER:
            return ""
        warning = self.state.loops.warning(length)
        self.alerts.append(warning)
        self.record.append({"type": "loop_warning", "step": self.state.step, "repeats": length, "text": warning})
        self.ui.warn(f"loop: {self.state.loops.kind}, {length} times")
        return warning

    def _review(self, loop_warning: str) -> None:
        """The critic's review of recent progress; it replaces the previous one in the agent's context."""
        state = self.state
        messages = critic.review_messages(state.objective, state.summary.text, state.steps, loop_warning,
                                          self.critic_counter, self.settings.max_context_tokens)
        with self.ui.thinking(state.step):
            state.criticism = self._ask("critic", messages, state.step).text.strip()
        self.record.append({"type": "critic", "step": state.step, "kind": "review", "text": state.criticism,
                            "loop": bool(loop_warning)})
        self.ui.critic(state.criticism)

    def _final_review(self, submitted: Submitted) -> str:
        """With the critic on, a final answer is checked before the run ends. Returns the observation for a
        rejected answer; re-raises Submitted for an accepted one."""
        state = self.state
        if not self.settings.critic or state.rejections >= critic.MAX_REJECTIONS:
            raise submitted
        messages = critic.final_messages(state.objective, state.summary.text, state.steps, submitted.answer,
                                         self.critic_counter, self.settings.max_context_tokens)
        with self.ui.thinking(state.step):
            reply = self._ask("critic", messages, state.step).text
        accepted, reason = critic.verdict(reply)
        self.record.append({"type": "critic", "step": state.step, "kind": "final", "accepted": accepted,
                            "text": reply.strip()})
        self.ui.critic(("ACCEPT: " if accepted else "REJECT: ") + reason)
        if accepted:
            raise submitted
        state.rejections += 1
        return (f"Your final answer was reviewed and REJECTED: {reason}\nAddress this, then finish with done and "
                f"the corrected, complete answer.")

    def _execute(self, workspace: Workspace, action: Action) -> str:
        command = COMMANDS[action.command]
        if not action.arg.strip():
            return f"{command.name} needs an argument ({command.arg}); nothing was done."
        if command.needs_approval and not self.settings.yes:
            if not self.ui.interactive:
                return (f"Not run: {command.name} needs the user's approval, and no user is present. The user must "
                        "start miniagi with -y (--yes) to let commands run unattended.")
            approval = self.ui.approve(command.name, action.arg)
            if not approval.run:
                return approval.observation
        try:
            if command.name == "talk_to_user":  # waits for the person: no spinner over their prompt
                return command.run(workspace, action.arg)
            with self.ui.working(f"step {self.state.step}: {command.name} running"):
                return command.run(workspace, action.arg)
        except (Submitted, Stop, KeyboardInterrupt, ModelUnavailable, ModelError, ConfigError):
            raise
        except Exception as exc:  # a failing command is an observation, never the end of the run
            return f"{command.name} failed: {type(exc).__name__}: {exc}"

    def _step_record(self, number: int, thought: str, command: str, arg: str, observation: str,
                     raw_reply: str = "") -> StepRecord:
        """A step as the context shows it: every part within the per-item budget."""
        limit = self.settings.max_memory_item_tokens
        return StepRecord(number, truncate_middle(thought, self.counter, limit), command,
                          truncate_middle(arg, self.counter, limit), truncate_middle(observation, self.counter, limit),
                          raw_reply=truncate_middle(raw_reply, self.counter, limit))

    def _summarize(self, prompt: str) -> str:
        return self._ask("summarizer", [{"role": "user", "content": prompt}], self.state.step).text

    def _remember(self, *items) -> None:
        """Vector memory helps but is not essential: if it fails, the run goes on without it."""
        if self.memory.store is None:
            return
        try:
            self.memory.remember(*items)
        except Exception as exc:  # chromadb or the embedder failing must not end the run
            self.ui.warn(f"vector memory disabled for this run: {type(exc).__name__}: {exc}")
            self.record.append({"type": "error", "step": self.state.step, "text": f"vector memory: {exc}"})
            self.memory.store = None

    def _flush_memory(self) -> None:
        """The run's last memories reach the store before it ends (they are written in the background)."""
        try:
            self.memory.flush()
        except Exception as exc:
            self.ui.warn(f"some memories of this run could not be stored: {type(exc).__name__}: {exc}")

    def _ask(self, role: str, messages: list[dict], step: int) -> Completion:
        """Every model call of the run goes through here: the cost limit is checked first (also for the many
        calls inside one process_data or summary), and no secret passes into the request."""
        self._check_cost()
        model = self.settings.model_for(role)
        messages = self.redact.messages(messages)
        # the agent's reply is capped and stopped where a rambling model would go on to invent the observation
        limits = {"max_tokens": self.settings.max_reply_tokens, "stop": STOP_SEQUENCES} if role == "agent" else {}
        completion = self.model.complete(messages, model=model, role=role, **limits)
        saved = self.prices.saved(model, completion.cached_tokens)
        self.state.count_call(completion, saved)
        event = {"type": "llm_call", "step": step, "role": role, "model": model, "response": completion.text,
                 "prompt_tokens": completion.prompt_tokens, "completion_tokens": completion.completion_tokens,
                 "cached_tokens": completion.cached_tokens, "cost_usd": completion.cost_usd,
                 "saved_usd": round(saved, 8), "latency_s": round(completion.latency_s, 4),
                 "finish_reason": completion.finish_reason}
        if self.settings.debug:
            event["messages"] = messages
        self.record.append(event)
        self.ui.debug_raw(role, completion.text)
        return completion

    def _record_quietly(self, event: dict) -> None:
        """The end of a run is recorded if the disk allows; the trace up to the last step stands either way."""
        try:
            self.record.append(event)
        except OSError as exc:
            self.ui.warn(f"could not record the end of the run: {exc.strerror or exc}")

    def _save(self, status: str, message: str = "", exit_code: int | None = None) -> dict:
        result = self._result(status, message, exit_code)
        self.record.write_result(result)
        return result

    def _result(self, status: str, message: str, exit_code: int | None) -> dict:
        state = self.state
        result = {"run_id": self.record.run_id, "objective": state.objective, "status": status,
                  "answer": state.answer, "steps": state.step, "llm_calls": state.llm_calls,
                  "prompt_tokens": state.prompt_tokens, "completion_tokens": state.completion_tokens,
                  "cached_prompt_tokens": state.cached_prompt_tokens, "cost_saved_usd": round(state.saved_usd, 6),
                  "cost_usd": round(state.cost_usd, 6), "started_at": state.started_at,
                  "ended_at": None if status == "running" else now_iso(), "model": self.settings.model,
                  "exit_code": exit_code, "message": message, "code_isolation": self.isolation,
                  **process_identity()}
        return result


def open_vector_memory(settings: Settings, environ: Mapping[str, str], model,
                       redact=lambda text: text) -> VectorMemory | None:
    """The persistent memory under $MINIAGI_HOME/memory (opened lazily, on first use), or None when off."""
    if settings.memory_scope == "off":
        return None
    if settings.embedding_model == "local":
        from memory.embeddings import MiniLMEmbedder

        embedder = MiniLMEmbedder()
    else:
        from memory.embeddings import EndpointEmbedder

        client = getattr(model, "client", None)
        if client is None:
            from .config import Endpoint
            from .model import OpenAIModel

            client = OpenAIModel(Endpoint.from_environment(environ)).client
        embedder = EndpointEmbedder(client, settings.embedding_model)
    return VectorMemory(settings.home_path / "memory", embedder, url=settings.memory_url, redact=redact)


def _raise_on_sigterm():
    """SIGTERM ends a run the way Ctrl-C does: state saved, exit 130. Returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, previous)


def recorded_settings(store: RunStore, run_id: str) -> Settings:
    """The settings a run was started with (for resume), from its run_start event."""
    for event in store.open(run_id).events():
        if event.get("type") == "run_start":
            return Settings.from_dict(event.get("settings") or {})
    raise ConfigError(f"run {run_id} has no recorded start; it cannot be resumed")
