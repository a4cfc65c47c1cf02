"""The agent: settings and dependencies (model, terminal, run store, vector memory, budget), and a `Run` for each
objective (run.py holds the loop). Headless use:

    from miniagi import Agent, Settings
    result = Agent(Settings.from_environment(yes=True, unattended=True)).run("What is 17 * 23?")
    print(result.status, result.answer)
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from typing import Mapping

from memory.budget import Budget
from memory.context import ContextBuilder, ContextOverflow, StepRecord, cut_around, truncate_middle
from memory.store import VectorMemory
from memory.tokens import counter_for

from . import events as ev
from .commands import COMMANDS
from .config import ConfigError, Settings, read_dotenv
from .model import Model, PriceTable
from .prompts import system_prompt
from .protocols import formats
from .run import Run, RunResult
from .runs import RunStore, now_iso
from .redaction import Redactor
from .services import Services
from .state import RunState
from .trust import DotenvGuard
from .ui import Terminal
from .workspace import RunWorkspace
from .websearch import DdgsBackend, SearchBackend

__all__ = ["Agent", "RunResult", "open_vector_memory", "recorded_settings"]

RESUMED = ("NOTE: this run was interrupted and has been resumed. The Python session was restarted: variables, imports "
           "and functions from earlier steps are gone; files on disk remain.")


class Agent:
    """Runs objectives: holds what every run of it shares, and makes a `Run` per objective."""

    def __init__(self, settings: Settings, *, model: Model | None = None, ui: Terminal | None = None,
                 environ: Mapping[str, str] | None = None, search_backend: SearchBackend | None = None,
                 quiet: bool = False, offline: bool = False, wait_for_memory: bool = True, mcp=None):
        """`quiet`: print nothing on stderr (the Python API's choice; the CLI always shows progress). `offline`: the
        agent's own commands reach no network (a replay): web search and URLs are refused. `wait_for_memory=False`:
        a run that ends before the vector store has loaded journals its memories instead of waiting for it (the
        CLI, whose process ends right after; a program that goes on keeps the default, and its runs end stored).
        `mcp`: the MCP tools to use instead of the configured servers' (a replay's recorded ones)."""
        self.settings, self.offline = settings, offline
        self.search_backend = search_backend or DdgsBackend()
        self.environ = dict(os.environ if environ is None else environ)
        # the gate every text crosses before a model request, the run's files, the vector store or the terminal
        self.redact = Redactor(self.environ, read_dotenv())
        self.prices = getattr(model, "prices", None) or PriceTable(settings.prices)
        if model is None:
            from .config import Endpoint
            from .endpoint import OpenAIModel

            model = OpenAIModel(Endpoint.from_environment(self.environ), self.prices,
                                request_timeout_s=settings.request_timeout,
                                request_deadline_s=settings.request_deadline, on_retry=lambda text: self.ui.warn(text))
        self.model = model
        interactive = not settings.unattended and sys.stdin is not None and sys.stdin.isatty()
        self.ui = ui or Terminal(interactive=interactive, debug=settings.debug, quiet=quiet)
        self.ui.redact = self.redact
        if interactive and not settings.yes:  # the approval panel shows these whole: the step line need not
            self.ui.approved = {name for name, c in COMMANDS.items() if c.needs_approval}
        # a .env that code of an earlier run could have written is not obeyed without the user's say
        self.dotenv = DotenvGuard(settings, self.environ)
        self.dotenv.check(self.ui)
        self.store = RunStore(settings.home_path, self.redact)
        self.budget = Budget.from_settings(settings)
        self.counter = counter_for(settings.model)
        self.critic_counter = counter_for(settings.model_for("critic"))
        self.summarizer_counter = counter_for(settings.model_for("summarizer"))
        # the MCP servers start now: their tools are commands, in the prompt and the schemas built below
        from .mcp_tools import McpTools

        self.mcp = mcp if mcp is not None else McpTools() if offline else McpTools.configured(settings, self.ui)
        self.redact.include(*(spec.secrets() for spec in getattr(self.mcp, "specs", ())))  # a server's tokens
        self.mcp.start()
        if interactive and not settings.yes:
            self.ui.approved |= {c.name for c in self.mcp.commands if c.needs_approval}
        try:
            self._prepare(settings, model, wait_for_memory)
        except BaseException:
            self.mcp.close()
            raise

    def _prepare(self, settings: Settings, model, wait_for_memory: bool) -> None:
        self.protocol = formats()[settings.protocol]
        # the tools protocol sends its schemas with every request: they are part of the prompt the budget bounds
        tools = self.protocol.request().get("tools")
        self.contexts = ContextBuilder(self.counter, self.budget, render_step=self.protocol.render,
                                       reserved=self.counter.count(json.dumps(tools)) if tools else 0)
        self.vectors = open_vector_memory(settings, self.environ, model, self.redact)
        self.wait_for_memory = wait_for_memory
        self.system = system_prompt(str(settings.workdir_path), settings.protocol)
        # what each run works with: a run never sees the agent
        self.services = Services(settings=settings, ui=self.ui, model=model, prices=self.prices,
                                 protocol=self.protocol, budget=self.budget, contexts=self.contexts,
                                 counter=self.counter, critic_counter=self.critic_counter,
                                 summarizer_counter=self.summarizer_counter, system=self.system,
                                 vectors=self.vectors, wait_for_memory=wait_for_memory, redact=self.redact,
                                 environ=self.environ, search_backend=self.search_backend, offline=self.offline,
                                 dotenv=self.dotenv, mcp=self.mcp)

    def close(self) -> None:
        """Stop what outlives a run: the MCP servers (a run's end stops them too; this is for a start that failed)."""
        self.mcp.close()

    # --- starting and resuming -------------------------------------------------------------------------------
    def run(self, objective: str, origin: dict | None = None, follows: str | None = None) -> RunResult:
        """Work on an objective until done or stopped. `origin` is recorded with the run (e.g. what it replays);
        `follows` is a run this one continues: its objective, answer, summary and notes are in the context."""
        return self.start(objective, origin, follows).drive()

    def start(self, objective: str, origin: dict | None = None, follows: str | None = None,
              workspace: RunWorkspace | None = None, keep_workspace: bool = False) -> Run:
        """A new run of an objective, recorded and ready to drive (`run.drive()` works on it until it ends).
        Given the `workspace` of the run it follows (a chat), its Python session carries over. `keep_workspace`:
        the caller closes the workspace the run makes (`run.workspace`), to hand it on."""
        objective = objective.strip()
        if not objective:
            raise ConfigError("the objective is empty: say what the agent should do")
        if "\x00" in objective:
            raise ConfigError("the objective contains a NUL byte: give it as plain text")
        previous = self.store.open(follows).run_id if follows else None
        background = self.background(previous, python_kept=workspace is not None) if previous else None
        self._check_budget(objective, background or "")
        self._check_workdir()
        self._check_endpoint()
        record = self.store.create()
        try:
            run = Run(self.services, record, RunState(objective=objective, make_record=self.step_record),
                      workspace=workspace, keep_workspace=keep_workspace)
        except ConfigError:  # the sandbox asked for cannot be had here: nothing was started
            record.close()
            shutil.rmtree(record.dir, ignore_errors=True)
            raise
        run.emit(ev.RunStart(time=now_iso(), run_id=record.run_id, objective=objective,
                             settings={**self.settings.to_dict(), "workdir": str(self.settings.workdir_path)},
                             follows=previous, background=background,
                             extra={**(origin or {}),
                                    **({"mcp_tools": self.mcp.definitions} if self.mcp.definitions else {})}))
        return run

    def background(self, run_id: str, python_kept: bool = False) -> str:
        """What a follow-up is told of the run it continues, within the summary's share of the budget."""
        state = RunState.from_events(self.store.open(run_id).events())
        parts = [state.background] if state.background else []
        parts.append(f"Previous objective (run {run_id}): {state.objective}")
        parts.append(f"Its answer: {state.answer}" if state.answer is not None else
                     f"It ended without an answer ({state.status}).")
        if state.summary.text:
            parts.append(f"What was done: {state.summary.text}")
        recent = [s for s in state.steps if s.step > state.summary.through_step and s.command]
        if recent:
            parts.append("Its steps:\n" + "\n".join(
                f"- {s.command} {' '.join(s.arg.split())[:160]} → {' '.join(s.observation.split())[:160]}"
                for s in recent))
        if state.notes:
            parts.append("Its notes:\n" + "\n".join(f"- {note}" for note in state.notes))
        if python_kept:
            parts.append("The Python session carries over: variables, imports and functions defined then are still "
                         "defined.")
        else:
            there = self.store.open(run_id).workdir()
            here = str(self.settings.workdir_path)
            parts.append("Python variables, imports and functions from it are gone (a new Python session); " + (
                "files it wrote remain in the working directory." if there == here else
                "files it wrote remain where it worked." if there is None else
                f"it worked in another directory, {there}: its files are there, not in this run's working "
                f"directory {here}."))
        return truncate_middle("\n".join(parts), self.counter, self.budget.summary)

    def resume(self, run_id: str) -> RunResult:
        record = self.store.open(run_id)
        state = RunState.from_events(record.events(), self.step_record)
        if state.status == "done":
            raise ConfigError(f"run {record.run_id} is already done; its answer is in {record.result_path}")
        self._check_budget(state.objective, state.background)
        self._check_workdir()
        self._check_endpoint()
        run = Run(self.services, record, state, resumed=True)
        run.emit(ev.Resume(step=state.completed_step, time=now_iso(), settings=self.settings.to_dict()))
        run.alerts.append(RESUMED)
        return run.drive()

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

    def _check_budget(self, objective: str, background: str = "") -> None:
        try:
            self.contexts.check_fits(self.system, objective, background)
        except ContextOverflow as exc:
            raise ConfigError(str(exc)) from None

    def step_record(self, number: int, thought: str, command: str, arg: str, observation: str,
                    raw_reply: str = "", notes: tuple = (), args: dict | None = None) -> StepRecord:
        """A step as the context shows it: every part within the per-item budget (the arguments' texts sharing
        it); an output over it is cut to what matters to the step's thought and argument, not by position."""
        limit = self.budget.item
        if args is not None:
            texts = [v for v in args.values() if isinstance(v, str)]
            share = max(20, limit // max(1, len(texts)))
            args = {k: truncate_middle(v, self.counter, share) if isinstance(v, str) else v for k, v in args.items()}
        return StepRecord(number, truncate_middle(thought, self.counter, limit), command,
                          truncate_middle(arg, self.counter, limit),
                          cut_around(observation, f"{thought} {arg}", self.counter, limit),
                          raw_reply=truncate_middle(raw_reply, self.counter, limit), notes=notes, args=args)



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
            from .endpoint import EndpointClient

            endpoint = Endpoint.from_environment(environ)
            endpoint.check()
            client = EndpointClient(endpoint)
        embedder = EndpointEmbedder(client, settings.embedding_model)
    return VectorMemory(settings.home_path / "memory", embedder, url=settings.memory_url, redact=redact)


def recorded_settings(store: RunStore, run_id: str) -> Settings:
    """The settings a run was started with (for resume), from its run_start event."""
    for event in store.open(run_id).events():
        if event.get("type") == "run_start":
            return Settings.from_dict(event.get("settings") or {})
    raise ConfigError(f"run {run_id} has no recorded start; it cannot be resumed")
