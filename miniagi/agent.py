"""The agent: settings and dependencies (model, terminal, run store, vector memory, budget), and a `Run` for each
objective (run.py holds the loop). Headless use:

    from miniagi import Agent, Settings
    result = Agent(Settings.from_environment(yes=True, unattended=True)).run("What is 17 * 23?")
    print(result.status, result.answer)
"""

from __future__ import annotations

import json
import os
import sys
from typing import Callable, Mapping

from memory.archive import Archive, archive_path
from memory.budget import Budget
from memory.context import ContextBuilder, ContextOverflow, StepRecord, cut_around, truncate_middle
from memory.run_memory import RunMemory
from memory.store import VectorMemory
from memory.tokens import counter_for

from . import events as ev
from .commands import CommandTable
from .config import ConfigError, Settings, read_settings_files
from .model import Model, PriceTable
from .prompts import system_prompt
from .protocols import formats
from .redaction import Redactor
from .run import Run, RunResult
from .run_store import RunRecord, RunStore, now_iso
from .safefs import identity
from .services import Makings, Services
from .state import RunState
from .terminal import Terminal
from .trust import DotenvGuard
from .websearch import DdgsBackend, SearchBackend
from .workspace import RunWorkspace

__all__ = ["Agent", "RunResult", "open_vector_memory", "recorded_settings"]

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
        self.settings = settings
        environ = dict(os.environ if environ is None else environ)
        # the gate every text crosses before a model request, the run's files, the vector store or the terminal
        redact = Redactor(environ, read_settings_files())
        prices = getattr(model, "prices", None) or PriceTable(settings.prices)
        interactive = not settings.unattended and sys.stdin is not None and sys.stdin.isatty()
        ui = ui or Terminal(interactive=interactive, debug=settings.debug, quiet=quiet)
        if model is None:
            from .config import Endpoint
            from .endpoint import OpenAIModel

            model = OpenAIModel(Endpoint.from_environment(environ), prices, request_timeout_s=settings.request_timeout,
                                request_deadline_s=settings.request_deadline, on_retry=ui.warn)
        # a .env that code of an earlier run could have written is not obeyed without the user's say
        dotenv = DotenvGuard(settings, environ)
        ui.serve(redact)
        dotenv.check(ui)
        self.store = RunStore(settings.home_path, redact)
        # the MCP servers start now: their tools are commands, in the prompt and the schemas built below
        from .mcp_tools import McpTools

        mcp = mcp if mcp is not None else McpTools() if offline else McpTools.configured(settings, ui)
        redact.include(*(spec.secrets() for spec in getattr(mcp, "specs", ())))  # a server's tokens
        mcp.start()
        try:
            commands = CommandTable(mcp.commands)  # made once: every run of this agent offers the same
            protocol = formats()[settings.protocol].offering(commands)
            # a panel shows these whole (the approval's, the question's): the step line need not
            ui.serve(redact, protocol, ({"talk_to_user"} | ({c.name for c in commands.values() if c.needs_approval}
                                                            if not settings.yes else set())) if interactive else set())
            budget, counter = Budget.from_settings(settings), counter_for(settings.model)
            # the tools protocol sends its schemas with every request: they are part of the prompt the budget bounds
            tools = protocol.request().get("tools")
            contexts = ContextBuilder(counter, budget, render_step=protocol.render,
                                      reserved=counter.count(json.dumps(tools)) if tools else 0)
            # what each run works with: a run never sees the agent
            self.services = Services(
                settings=settings, ui=ui, model=model, prices=prices, protocol=protocol, budget=budget,
                counter=counter, critic_counter=counter_for(settings.model_for("critic")),
                system=system_prompt(str(settings.workdir_path), protocol), redact=redact, dotenv=dotenv,
                wait_for_memory=wait_for_memory)
            # what only the agent reads: each run's workspace and memory are made from these
            self.makings = Makings(
                contexts=contexts, summarizer_counter=counter_for(settings.model_for("summarizer")),
                vectors=open_vector_memory(settings, environ, model, redact), environ=environ,
                search_backend=search_backend or DdgsBackend(), offline=offline, mcp=mcp)
        except BaseException:
            mcp.close()
            raise

    def close(self) -> None:
        """Stop what outlives a run: the MCP servers (a run's end stops them too; this is for a start that failed)."""
        self.makings.mcp.close()

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
        made = workspace is None
        workspace = workspace or self.workspace()  # a sandbox that cannot be had here is said before any record
        try:
            record = self.store.create()
        except BaseException:
            if made:
                workspace.close()
            raise
        run = self._run(record, RunState(objective=objective, make_record=self.step_record), workspace,
                        owns_workspace=made and not keep_workspace)
        mcp = self.makings.mcp
        run.emit(ev.RunStart(time=now_iso(), run_id=record.run_id, objective=objective,
                             settings={**self.settings.to_dict(), "workdir": str(self.settings.workdir_path)},
                             follows=previous, background=background,
                             extra={**(origin or {}), "workdir_id": identity(self.settings.workdir_path),
                                    **({"mcp_tools": mcp.definitions} if mcp.definitions else {})}))
        return run

    def workspace(self) -> RunWorkspace:
        """A new workspace for a run: its Python session, sandbox and limits; the MCP servers (started again if a run
        before stopped them: the Python API's second run) stop with it."""
        services, makings = self.services, self.makings
        workspace = RunWorkspace(self.settings, ui=services.ui, environ=makings.environ, budget=services.budget,
                                 search_backend=makings.search_backend, counter=makings.summarizer_counter,
                                 python_tools=services.protocol.commands.python_tools(), offline=makings.offline)
        makings.mcp.start()
        workspace.mcp = makings.mcp
        return workspace

    def memory(self, record: RunRecord, state: RunState, summarize: Callable[[str], str]) -> RunMemory:
        """A run's memory: its view, summaries and recall over the agent's vector memory, and its archive in the
        run's folder. Its state is the run's (which holds the objective, the background and the summary);
        `summarize` asks the summarizer model as a call of the run."""
        services, makings = self.services, self.makings
        workdir = str(self.settings.workdir_path)
        return RunMemory(builder=makings.contexts, summarizer_counter=makings.summarizer_counter,
                         ask_summarizer=summarize, store=makings.vectors, scope=self.settings.memory_scope,
                         run_id=record.run_id, state=state, workdir=workdir,
                         code_commands=services.protocol.commands.code_commands(),
                         archive=Archive(archive_path(record.dir), record.run_id, workdir, services.redact),
                         runs_root=record.dir.parent, notify=services.ui.progress,
                         summarizer_shares_prefix=self.settings.model_for("summarizer") == self.settings.model)

    def _run(self, record: RunRecord, state: RunState, workspace: RunWorkspace, **how) -> Run:
        """A `Run` handed what it works with: the agent's services, its record and state, the workspace and a memory
        made here. A summary is a model call of the run (its limits, its cost, its record): the memory asks through
        the run it is made for."""
        run: Run
        memory = self.memory(record, state, summarize=lambda prompt: run.summarize(prompt))
        run = Run(self.services, record, state, workspace, memory, **how)
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
        return truncate_middle("\n".join(parts), self.services.counter, self.services.budget.summary)

    def resume(self, run_id: str) -> RunResult:
        record = self.store.open(run_id)
        state = RunState.from_events(record.events(), self.step_record)
        if state.status == "done":
            raise ConfigError(f"run {record.run_id} is already done; its answer is in {record.result_path}")
        self._check_budget(state.objective, state.background)
        self._check_workdir()
        self._check_endpoint()
        run = self._run(record, state, self.workspace(), resumed=True)
        run.kept = self._cut_off_step(state)
        run.emit(ev.Resume(step=state.completed_step, time=now_iso(), settings=self.settings.to_dict(),
                           kept_step=state.pending.step if run.kept else None))
        return run.drive()

    def _cut_off_step(self, state: RunState):
        """A step whose command an interrupt cut off while it ran (its action recorded, its observation not): said,
        and its recorded action returned to be taken again as it was — no second model call for it — unless the
        person asks for the reply anew (then None, as for a step stopped at its approval)."""
        from .protocols import Decision

        action, commands, ui = state.pending, self.services.protocol.commands, self.services.ui
        if action is None or action.command not in commands:
            return None
        cut = state.cut_short if state.cut_short and state.cut_short.get("step") == action.step else None
        killed = state.status == "running"  # no end recorded: its process ended mid-step
        if not killed and (cut is None or cut.get("ran_s") is None):  # a limit, or stopped at its approval: the
            return None  # person may want another way; asked anew
        command = commands[action.command]
        what = "code" if action.command in ("execute_python", "execute_shell") else action.command
        how = "was cut off (its process ended)" if cut is None else f"was interrupted after {cut['ran_s']:.1f} s"
        if ui.interactive and ui.confirm(f"step {action.step}'s {what} {how}. Ask the model for step {action.step} "
                                         f"anew (a new model call) instead of running its recorded {what} again?"):
            return None
        ui.warn(f"step {action.step}'s {what} {how}; it will run again")
        args = command.arguments(action.args) if action.args is not None else command.parse(action.arg)
        return Decision(thought=action.thought, definition=command, args=args, given=action.args)

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
            self.services.ui.warn(f"created the work directory {path}")

    def _check_endpoint(self) -> None:
        check = getattr(self.services.model, "check_reachable", None)
        if check is not None:
            check()

    def _check_budget(self, objective: str, background: str = "") -> None:
        try:
            self.makings.contexts.check_fits(self.services.system, objective, background)
        except ContextOverflow as exc:
            raise ConfigError(str(exc)) from None

    def step_record(self, number: int, thought: str, command: str, arg: str, observation: str,
                    raw_reply: str = "", notes: tuple = (), args: dict | None = None) -> StepRecord:
        """A step as the context shows it: the thought and argument within the per-item budget (the arguments' texts
        sharing it), the output within the room a prompt has for one (Budget.output); an output over it is cut to
        what matters to the step's thought and argument, not by position."""
        counter, budget = self.services.counter, self.services.budget
        limit = budget.item
        if args is not None:
            texts = [v for v in args.values() if isinstance(v, str)]
            share = max(20, limit // max(1, len(texts)))
            args = {k: truncate_middle(v, counter, share) if isinstance(v, str) else v for k, v in args.items()}
        return StepRecord(number, truncate_middle(thought, counter, limit), command,
                          truncate_middle(arg, counter, limit),
                          cut_around(observation, f"{thought} {arg}", counter, budget.output),
                          raw_reply=truncate_middle(raw_reply, counter, limit), notes=notes, args=args)



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
