"""One run of an objective — the loop:

    until stopped:  check the limits → think → act → review a final answer → observe → critique

Every change to the run is an event, emitted: appended to the trace, applied to the state (`RunState.apply`) and
shown in the terminal. Stopping is an exception (stops.py) mapped to the run's status and exit code in one place.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Callable

from . import critic
from . import events as ev
from .checkpoints import open_checkpoints
from .commands import Outcome
from .config import OPTIONS_BY_NAME, ConfigError
from .execution import cap_text
from .loop_detector import STOP_AFTER, WARN_AFTER
from .model import Completion, ModelError, ModelUnavailable
from .model_view import PromptLog
from .protocols import Decision, MalformedReply, one_command_line
from .redaction import redact_data
from .run_store import RunRecord, now_iso, process_identity
from .services import Services
from .state import RunState
from .stops import EXIT_CODES, Ending, LimitReached, Stop, Stuck, Submitted, TooManyFormatErrors, ending_for
from .text import plural
from .trust import resume_flags
from .websearch import SearchResult
from .workspace import RunWorkspace

if TYPE_CHECKING:
    from memory.run_memory import RunMemory

RESUMED = ("NOTE: this run was interrupted and has been resumed. The Python session was restarted: variables, imports "
           "and functions from earlier steps are gone; files on disk remain.")
MAX_FORMAT_ERRORS = 3  # malformed replies in a row before the run is given up
RUNNING_SAVE_S = 0.5  # result.json of a running run is rewritten at most this often
SWITCH_INTERVAL_S = 0.0002  # how often the interpreter may hand the GIL to another thread while a run goes
CUT_OFF = ("it was cut off: it reached the length limit before it ended, so nothing in it was run. Send a shorter "
           "reply — a brief thought and one command; write long code or a long text in parts over several steps")


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


class Run:
    """Handed by its agent what it works with: the agent's services (model, reply format, terminal, budget, the
    secret gate), its record and state, its workspace (where commands act: the Python session, the sandbox, the MCP
    servers) and its memory (what the next prompt holds)."""

    def __init__(self, services: Services, record: RunRecord, state: RunState, workspace: RunWorkspace,
                 memory: RunMemory, *, owns_workspace: bool = True, resumed: bool = False):
        self.services, self.settings, self.ui = services, services.settings, services.ui
        self.record, self.state, self.resumed = record, state, resumed
        self.memory = memory
        self.model_view = PromptLog(record.dir, services.redact)  # what the model saw, for show --prompt N
        self.covers: dict = {}  # what the parts of the next agent prompt cover
        self._saving = threading.Lock()  # result.json: one writer at a time (the loop, or the timer of a write put off)
        self._saved_at = float("-inf")
        self._save_timer: threading.Timer | None = None
        self._ended = False  # the final result is written: nothing more is
        # a chat's runs share one workspace (its Python session goes on), which the chat closes at its end
        self.workspace, self.owns_workspace = workspace, owns_workspace
        self.workspace.attach(memory=self.memory, summarize=self.summarize, step=lambda: self.state.step,
                              tool_handler=self.call_tool)
        if workspace.mcp is not None:
            workspace.mcp.record = self.record_mcp_call
        if state.last_search and not self.workspace.last_search:  # resumed: a result's number still names its URL
            self.workspace.last_search = [SearchResult(**result) for result in state.last_search]
        self.recorded_search = self.workspace.last_search
        self.nested = Outcome()  # notes and memories of the commands code called during this step
        self.alerts = [RESUMED] if resumed else []  # for the next prompt only: loop warnings, the note on resuming
        self.isolation: str | None = None  # the sandbox executed code runs in (bwrap, namespace, none)
        self.recall_first = True  # whether step 1 recalls (a new run whose store holds nothing for it does not)
        # one event at a time into the trace and the state: a model call may end on another thread (a summary)
        self.emitting = threading.RLock()
        self.ended = False  # after run_end nothing is recorded (a summary left behind by Ctrl-C)
        # what each step changes in the work directory, kept to be shown and undone (checkpoints/)
        self.checkpoints = open_checkpoints(self.settings, record.dir, services.redact.values, self.ui.warn,
                                            state.completed_step)
        self.kept: Decision | None = None  # resumed: the cut-off step's recorded action, taken again as it was
        self.command_started: float | None = None  # when the step's command began (after its approval)
        self.cut_short: dict | None = None  # the step whose command an interrupt cut off, and how long it had run

    def emit(self, event: ev.Event) -> None:
        with self.emitting:
            if self.ended:
                return
            self.record.append(event.to_json())
            self.state.apply(event)
            self.ui.show(event, self.state.cost_usd)

    def emit_quietly(self, event: ev.Event) -> None:
        """The end of a run is recorded if the disk allows; the trace up to the last step stands either way."""
        with self.emitting:
            try:
                self.record.append(event.to_json())
            except OSError as exc:
                self.ui.warn(f"could not record the end of the run: {exc.strerror or exc}")
            self.state.apply(event)
            self.ended = self.ended or isinstance(event, ev.RunEnd)

    # --- the loop ------------------------------------------------------------------------------------------------
    def drive(self) -> RunResult:
        """Steps until the run stops (a stop is an exception), then `finish`."""
        state, record = self.state, self.record
        self.ui.run_started(record.run_id, state.objective, self.settings.model,
                            state.completed_step if self.resumed else None, follows=state.follows,
                            sandbox=f"{self.workspace.execution.kind}, network "
                                    f"{'off' if self.settings.no_network else 'on'}")
        restore_sigterm = _raise_on_sigterm()
        # memory's threads (recall's lookup, the writer) and the loop hand the GIL back and forth around each
        # embedding, search and token count (each lets go of it): at Python's 5 ms switch interval a lookup beside
        # a busy loop took ~4x as long as alone (the loop then waited for it), and a count the loop made could wait
        # up to 5 ms to go on; at 0.2 ms the lookup takes ~1.2x (the loop ~5-8 % slower while both run Python)
        _switching(+1)
        answer, interrupted = None, False
        kept, self.kept = self.kept, None
        try:
            objective = self.begin()
            while True:
                if kept is None:
                    self.check_limits()
                    action = self.think()
                else:  # its model call was made (and paid) before the interrupt: shown again, taken again
                    action, kept = kept, None
                    self.ui.action(state.step, action.thought, action.command, action.arg, state.cost_usd)
                if objective:
                    self.remember(*objective)
                    objective = []
                if action is not None:  # None: a malformed reply, recorded and sent back
                    with self.checkpoints.step(state.step, action.command):
                        outcome = self.act(action)
                    if outcome.answer is not None:  # accepted, it ends the run (Submitted); rejected, it is sent back
                        outcome = replace(outcome, observation=self.final_review(outcome.answer), answer=None)
                    self.observe(action, outcome)
                    self.critique()
                self.save_progress()
        except Submitted as submitted:
            answer, ending = self.services.redact(submitted.answer), Ending("done", "", EXIT_CODES["done"])
            self.remember(self.memory.item("answer", f"Objective: {state.objective}\nFinal answer: "
                                                     f"{submitted.answer}", state.step))
        except (Exception, KeyboardInterrupt) as exc:
            ending = ending_for(exc, record.run_id, first_call_made=self.resumed or state.llm_calls > 0,
                                resume=self.resume_command())
            interrupted = isinstance(exc, KeyboardInterrupt)
            pending = state.pending
            if interrupted and pending is not None:  # said when the run is resumed
                started = self.command_started
                self.cut_short = {"step": pending.step, "command": pending.command,
                                  "ran_s": None if started is None else round(time.monotonic() - started, 1)}
            if ending.internal:
                self.emit_quietly(ev.Error(step=state.step, traceback=traceback.format_exc()))
        finally:
            restore_sigterm()
            _switching(-1)
            # a summary still being made is waited for, so that its call is recorded before the end (not after
            # Ctrl-C: the person wants out; its event is then not recorded)
            self.memory.settle(wait=not interrupted)
            if self.owns_workspace:
                self.workspace.close()
            self.checkpoints.close()
            self.flush_memory()
            for path in self.services.dotenv.changed():
                self.ui.warn(f"{path} changed during this run: settings in it that reach the network, widen what code "
                             "may do or raise a limit will not be used until you confirm them")
        return self.finish(ending, answer)

    def begin(self) -> list:
        """Before the first step: the sandbox said, the run marked running, the vector store warmed when this run
        will recall. Returns the objective's memory item, stored once the first request has been answered (a run
        that a configuration error ends there is discarded, and leaves no memory behind)."""
        state = self.state
        self.report_isolation()
        self.save("running")
        objective = [] if self.resumed else [self.memory.item("objective", state.objective)]
        if not self.resumed:
            self.recall_first = self.store_might_hold()  # asked before this run stores anything
        store = self.memory.store
        if store is not None and store.url:  # a server other machines share: their items are found by meaning only
            # (the archives are this machine's); it loads in a thread while the first prompt is measured
            threading.Thread(target=store.warm, name="memory-warm", daemon=True).start()
        else:  # automatic recall goes by words (the archives): chromadb and the embedder load only for meaning
            self.memory.defer_vectors(store_holds=self.store_might_hold())
        return objective

    def finish(self, ending: Ending, answer: str | None) -> RunResult:
        """The run's end recorded (or, for a configuration error before the first answer, the run discarded)."""
        state, record = self.state, self.record
        if ending.discard:
            record.close()
            shutil.rmtree(record.dir, ignore_errors=True)
            raise ConfigError(ending.message)
        self.emit_quietly(ev.RunEnd(step=state.step, time=now_iso(), status=ending.status, answer=answer,
                                    message=ending.message, cut_short=self.cut_short))
        try:
            result = self.save(state.status, ending.message, ending.exit_code)
        except OSError:
            result = self.result(state.status, ending.message, ending.exit_code)
        record.close()
        self.ui.run_ended(result)
        return RunResult(run_id=record.run_id, status=state.status, answer=state.answer, exit_code=ending.exit_code,
                         message=ending.message, steps=state.step, cost_usd=state.cost_usd, summary=result)

    def check_limits(self) -> None:
        state, settings = self.state, self.settings
        if state.step >= settings.max_steps:
            raise LimitReached(f"step limit reached ({plural(settings.max_steps, 'step')}). Continue with "
                               f"`{self.resume_command(max_steps=settings.max_steps * 2)}`")
        self.check_calls()
        self.check_cost()

    def resume_command(self, **raised) -> str:
        """The exact `miniagi resume` that goes on with this run as it ran (-y and the like included), with the
        limits `raised` (name → new value)."""
        extra = "".join(f" {OPTIONS_BY_NAME[name].flag} {value:g}" for name, value in raised.items())
        return f"miniagi resume {self.record.run_id}{resume_flags(self.settings, leave=tuple(raised))}{extra}"

    def check_calls(self) -> None:
        limit = self.settings.max_calls
        if self.state.llm_calls >= limit:
            raise LimitReached(f"model call limit reached ({limit} calls). Continue with "
                               f"`{self.resume_command(max_calls=limit * 2)}`")

    def affordable(self, next_call: float = 0.0) -> bool:
        """Whether a call that costs at most `next_call` stays within the cost limit."""
        state, limit = self.state, self.settings.max_cost
        return not limit or (state.cost_usd < limit and state.cost_usd + next_call <= limit)

    def check_cost(self, next_call: float = 0.0) -> None:
        """Stop at the limit, and before a call that could pass it (`next_call`: the most it can cost)."""
        state, limit = self.state, self.settings.max_cost
        if self.affordable(next_call):
            return
        spent = f"${state.cost_usd:.4f} of ${limit:g} spent"
        reason = (f"cost limit reached ({spent})" if state.cost_usd >= limit else
                  f"cost limit: the next model call could cost up to ${next_call:.4f} (its prompt and a full reply), "
                  f"past the limit ({spent}; a lower --max-reply-tokens lowers that bound)")
        raised = max(limit * 2, round(state.cost_usd + 2 * next_call, 4))
        raise LimitReached(f"{reason}. Continue with `{self.resume_command(max_cost=raised)}`")

    def think(self) -> Decision | None:
        """The model's next action (emitted), or None when its reply could not be used (the error is emitted)."""
        number = self.state.step + 1
        self.command_started = None
        messages = self.context(number)
        with self.ui.thinking(number):
            completion = self.ask("agent", messages, number)
        protocol = self.services.protocol
        try:
            if completion.finish_reason == "length":
                raise MalformedReply(CUT_OFF, completion.text, protocol.how)
            action = one_command_line(protocol.read(completion))
        except MalformedReply as error:
            self.emit(ev.FormatError(step=number, error=str(error), response=protocol.raw_reply(completion)))
            if self.state.format_errors_in_a_row >= MAX_FORMAT_ERRORS:
                self.save("running")
                raise TooManyFormatErrors(f"the model broke the reply format {MAX_FORMAT_ERRORS} times in a row "
                                          f"(last problem: {error.problem})") from None
            return None
        self.emit(ev.Action(step=number, thought=action.thought, command=action.command, arg=action.arg,
                            args=action.call))
        self.memory.prefetch(action.thought, action.command, action.arg)  # the next recall, while the command runs
        return action

    def store_might_hold(self) -> bool:
        """Whether the vector store may hold anything this run could recall (known without opening it)."""
        store = self.memory.store
        return store is not None and store.might_hold(self.memory.recall_filter)

    def context(self, number: int) -> list[dict]:
        state = self.state
        advice = (critic.advice(state.criticism, self.services.counter, self.services.budget.alerts)
                  if state.criticism else "")
        # a new run's first step recalls only when the store held something for it: else the first request need
        # not wait for chromadb and the embedder to load (the store opens in the background meanwhile)
        context, folded = self.memory.context(system=self.services.system, steps=state.steps, next_step=number,
                                              alerts="\n\n".join(self.alerts), advice=advice,
                                              recall=number > 1 or self.recall_first)
        self.alerts = []
        if folded:
            self.emit(ev.SummaryFolded(step=state.step, text=folded.text, through_step=folded.through_step,
                                       notes_digest=folded.notes_digest or None,
                                       notes_through=folded.notes_through or None))
        self.covers = self._covers(context.steps_shown)  # the summary the prompt holds: a fold is applied by now
        if self.memory.last_recalled:
            self.emit(ev.Recall(step=number, ids=[item.id for item in self.memory.last_recalled],
                                items=[item.to_json() for item in self.memory.last_recalled]))
        self.say_memory_failure()
        self.ui.debug_context(context.messages)
        return context.messages

    def _covers(self, steps_shown: int) -> dict:
        """What the parts of the prompt just built cover (memory/context.py lays it out): the summary's steps, the
        notes the head lists, the steps in view, the items recalled."""
        summary, steps = self.memory.summary, self.state.steps
        view = [s.step for s in steps[len(steps) - steps_shown:]] if steps_shown else []
        return {"summary_through": summary.through_step, "notes_digest_through": summary.notes_through,
                "notes": [s.step for s in steps if s.notes and summary.notes_through < s.step <= summary.through_step],
                "view": view, "recalled": [item.label for item in self.memory.last_recalled],
                "background": bool(self.state.background)}

    def act(self, action: Decision, spinner: bool = True) -> Outcome:
        """Run the action's command (after approval); a failing command is an observation, never the end."""
        command = action.definition
        missing = command.missing(action.args)
        if missing:
            return Outcome(f"{command.name} needs {' and '.join(missing)}; nothing was done. "
                           + self.services.protocol.usage(command))
        if command.needs_approval:
            self.warn_unprotected()
        if command.needs_approval and not self.settings.yes:
            if not self.ui.interactive:
                return Outcome(f"Not run: {command.name} needs the user's approval, and no user is present. The user "
                               "must start miniagi with -y (--yes) to let commands run unattended.")
            approval = self.ui.approve(command.name, action.arg)
            if approval.every_later:  # `a`: this run goes on as with -y (a resume it suggests says -y too)
                self.settings = replace(self.settings, yes=True)
                self.ui.asks_no_more(self.services.protocol.commands.code_commands())
            if not approval.run:
                return Outcome(approval.observation)
        if spinner:  # a command of the loop's own (not one code called): how long it ran is said if it is cut off
            self.command_started = time.monotonic()
        try:
            if command.name == "talk_to_user" or not spinner:  # the person's prompt, or a spinner is already on
                return command(self.workspace, action.args)
            with self.ui.working(f"step {self.state.step}: {command.name} running"):
                return command(self.workspace, action.args)
        except (Stop, KeyboardInterrupt, ModelUnavailable, ModelError, ConfigError):
            raise
        except Exception as exc:
            return Outcome(f"{command.name} failed: {type(exc).__name__}: {exc}")

    def call_tool(self, name: str, arguments: str) -> dict:
        """A command called as a function by code in execute_python (its arguments by name, as a JSON object): run
        as an action of the step would be (approval, limits, redaction, cost); its notes, memories and hint join
        the step's."""
        command = self.services.protocol.commands.get(name)
        if command is None or not command.python:
            return {"error": f"{name} cannot be called from Python"}
        args = command.arguments(json.loads(arguments or "{}"))
        if command.missing(args):
            return {"error": f"{name} needs {' and '.join(command.missing(args))}: {command.signature()}"}
        try:
            outcome = self.act(Decision(thought="", definition=command, args=args), spinner=False)
        except Stop as stop:  # a limit: the code hears of it; the loop stops at its next check
            return {"error": str(stop)}
        calls = len(self.nested.memories) + len(self.nested.notes)
        self.nested.notes.extend(outcome.notes)
        self.nested.memories.extend(replace(m, key=f"py{calls}-{m.key}") for m in outcome.memories)
        self.nested.hint = _hints(self.nested.hint, outcome.hint)
        text = self.services.redact(cap_text(outcome.observation, self.services.budget.item_chars))
        return {"result": text, "data": redact_data(self.services.redact, outcome.data)}

    def record_mcp_call(self, command, arguments: dict, result: str, ok: bool, own: bool) -> None:
        """An MCP tool's result, as the server gave it, in the trace: what `replay` answers the call with."""
        self.emit(ev.McpCall(step=self.state.step, command=command.name, arguments=arguments, result=result, ok=ok,
                             own=own))

    def observe(self, action: Decision, outcome: Outcome) -> None:
        """The outcome becomes the step's observation (emitted); its notes and memories are stored. Output that
        imitates the critic's label is fenced."""
        number = self.state.step
        nested, self.nested = self.nested, Outcome()
        outcome = Outcome(outcome.observation, outcome.notes + nested.notes, outcome.memories + nested.memories,
                          outcome.answer, hint=_hints(outcome.hint, nested.hint))
        observation = cap_text(outcome.observation, self.services.budget.item_chars)
        observation = critic.guard(f"{observation}\n\n{outcome.hint}" if outcome.hint else observation)
        observation = self.services.redact(observation)
        note = self.services.redact(action.note)
        search = None
        if self.workspace.last_search is not self.recorded_search:  # the step searched: recorded for a resume
            self.recorded_search = self.workspace.last_search
            search = redact_data(self.services.redact, [asdict(result) for result in self.recorded_search])
        self.emit(ev.Observation(step=number, text=f"{observation}\n\n{note}" if note else observation,
                                 notes=list(outcome.notes), note=note or None, search=search,
                                 files=self.checkpoints.files(number)))
        notes = [self.memory.item("note", note, number, suffix=str(i) if i else "")
                 for i, note in enumerate(outcome.notes)]
        self.remember(*self.memory.step_items(self.state.steps[-1], observation), *notes,
                      *[self.memory.item(m.kind, m.text, number, suffix=m.key) for m in outcome.memories])

    def critique(self) -> None:
        """Loops are watched every step; the critic reviews every N steps, and at once when a loop starts."""
        state = self.state
        if state.repeats >= STOP_AFTER:
            raise Stuck(f"stuck in a loop: {state.loops.kind}, {state.repeats} times in the last steps")
        warning = ""
        if state.repeats >= WARN_AFTER:
            warning = state.loops.warning(state.repeats)
            self.alerts.append(warning)
            self.emit(ev.LoopWarning(step=state.step, repeats=state.repeats, text=warning, kind=state.loops.kind))
        if self.settings.critic and (warning or state.step % self.settings.critic_every == 0):
            messages = critic.review_messages(state.objective, state.summary.text, state.steps, warning,
                                              self.services.critic_counter, self.services.budget.context,
                                              previous=state.criticism)
            with self.ui.thinking(state.step):
                text = self.ask("critic", messages, state.step).text.strip()
            self.emit(ev.CriticReview(step=state.step, text=text, loop=bool(warning)))

    def final_review(self, answer: str) -> str:
        """With the critic on, a final answer is checked before the run ends (a step of the loop, after `act`).
        Raises Submitted when it is accepted; returns the observation that sends a rejected one back."""
        state = self.state
        if not self.settings.critic or state.rejections >= critic.MAX_REJECTIONS:
            raise Submitted(answer)
        messages = critic.final_messages(state.objective, state.summary.text, state.steps, answer,
                                         self.services.critic_counter, self.services.budget.context,
                                         previous=state.criticism)
        with self.ui.thinking(state.step):
            reply = self.ask("critic", messages, state.step).text
        accepted, reason = critic.verdict(reply)
        self.emit(ev.CriticVerdict(step=state.step, accepted=accepted, text=reply.strip()))
        if accepted:
            raise Submitted(answer)
        return (f"Your final answer was reviewed and REJECTED: {reason}\nAddress this, then finish with done and "
                f"the corrected, complete answer.")

    # --- the model, memory and the run's files ---------------------------------------------------------------------
    def ask(self, role: str, messages: list[dict], step: int) -> Completion:
        """Every model call of the run goes through here (also the many inside one process_data or summary, and
        those of code): the call limit is checked first, and a call that could pass the cost limit is not made;
        no secret passes into the request; the reply is shown as it streams in. Another thread may ask too (one
        call per role at a time): each call's event is emitted whole."""
        model = self.settings.model_for(role)
        messages = self.services.redact.messages(messages)
        # every reply is capped: it bounds the call's cost, its time (the request deadline) and what is read
        request: dict = {"temperature": self.settings.temperature, "max_tokens": self.settings.max_reply_tokens}
        if role == "agent":  # the reply format adds its own stop sequences, tools or response format
            request.update(self.services.protocol.request())
            self.model_view.add(step, messages, self.covers)
        self.check_calls()
        prices = getattr(self.services.model, "prices", None)  # a replay has none: it costs nothing
        if prices:  # a bound known by bytes is enough when it is within the limit; else the tokens are counted
            ceiling = prices.ceiling(model, messages, request["max_tokens"], request.get("tools"), exact=False)
            if not self.affordable(ceiling):
                ceiling = prices.ceiling(model, messages, request["max_tokens"], request.get("tools"))
            self.check_cost(ceiling)
        else:
            self.check_cost()
        with self.ui.receiving(role) as on_piece:
            if role == "agent":
                self.memory.asking()  # memory's background work goes while the loop waits
                on_piece = self._looking_ahead(on_piece)
            completion = self.services.model.complete(messages, model=model, role=role, on_piece=on_piece, **request)
        saved = self.services.prices.saved(model, completion.cached_tokens)
        rate = completion.tokens_per_s
        self.emit(ev.ModelCall(step=step, role=role, model=model, response=completion.text,
                               prompt_tokens=completion.prompt_tokens, completion_tokens=completion.completion_tokens,
                               cached_tokens=completion.cached_tokens, cost_usd=completion.cost_usd,
                               saved_usd=round(saved, 8), latency_s=round(completion.latency_s, 4),
                               finish_reason=completion.finish_reason,
                               first_token_s=_rounded(completion.first_token_s),
                               generation_s=_rounded(completion.generation_s),
                               tokens_per_s=None if rate is None else round(rate, 1),
                               tool_calls=[call.to_json() for call in completion.tool_calls] or None,
                               messages=messages if self.settings.debug else None))
        return completion

    def _looking_ahead(self, shown: Callable[[str], None]) -> Callable[[str], None]:
        """`shown`, and, as the agent's reply streams in, the next recall's lookup started as soon as the reply tells
        what recall will ask about (its thought, once a command is named), while the rest of it comes."""
        reply, started = self.services.protocol.reading(), False

        def on_piece(piece: str) -> None:
            nonlocal started
            shown(piece)
            if started:
                return
            reply.feed(piece)
            so_far = reply.partial()
            if so_far.command is not None:
                started = self.memory.prefetch_early(so_far.thought, so_far.command, so_far.arg)

        return on_piece

    def summarize(self, prompt: str | list[dict]) -> str:
        """A summarizer call: one prompt, or messages (a fold at the end of the agent's own prompt)."""
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        return self.ask("summarizer", messages, self.state.step).text

    def remember(self, *items) -> None:
        """Kept in the run's archive and the vector store; a store (or archive) that fails is turned off, said, and
        the run goes on without it."""
        self.memory.remember(*items)
        self.say_memory_failure()

    def say_memory_failure(self) -> None:
        """A store or archive the memory turned off (it goes on without it): said once, and recorded."""
        failure = self.memory.take_failure()
        if failure:
            self.ui.warn(failure)
            self.emit(ev.Error(step=self.state.step, text=failure))

    def flush_memory(self) -> None:
        """The run's last memories reach the store (or its journal) before it ends (they are written in the
        background)."""
        try:
            self.memory.finish(wait=self.services.wait_for_memory)
        except Exception as exc:
            self.ui.warn(f"some memories of this run could not be stored: {type(exc).__name__}: {exc}")

    def report_isolation(self) -> None:
        """Record how executed code is contained; say it in full (the header names the kind) only when it is
        weaker than a whole bwrap (another kind; as root, code that keeps the host's uid 0; the host's abstract
        sockets in reach), the work directory is read-only, or with --debug."""
        execution = self.workspace.execution
        self.isolation = execution.kind
        warning = execution.warning()
        if not execution.whole() or self.settings.debug or not os.access(self.settings.workdir_path, os.W_OK):
            self.ui.progress(f"sandbox: {execution.describe()}")
        self.emit(ev.Isolation(step=self.state.step, sandbox=execution.kind, isolated=execution.kind != "none",
                               reason=warning))

    def warn_unprotected(self) -> None:
        """Before the first code runs (once per workspace: a chat shares one), what the sandbox does not protect."""
        execution = self.workspace.execution
        warning = "" if execution.warned else execution.warning()
        if warning:
            execution.warned = True
            self.ui.warn(f"warning: {warning}")

    def save(self, status: str, message: str = "", exit_code: int | None = None) -> dict:
        """result.json written now; a status other than running is the final one (no write put off follows it)."""
        with self._saving:
            if self._save_timer is not None:
                self._save_timer.cancel()
                self._save_timer = None
            self._ended = self._ended or status != "running"
            return self._write(status, message, exit_code)

    def _write(self, status: str, message: str = "", exit_code: int | None = None) -> dict:
        result = self.result(status, message, exit_code)
        self._saved_at = time.monotonic()
        self.record.write_result(result)
        return result

    def save_progress(self) -> None:
        """result.json after a step: at most every RUNNING_SAVE_S (a fast loop's steps are milliseconds apart; the
        trace has every event at once); a write put off is made by a timer when that time is up, so the file lags
        the run by less than that."""
        with self._saving:
            wait = self._saved_at + RUNNING_SAVE_S - time.monotonic()
            if wait <= 0:
                self._write("running")
            elif self._save_timer is None:
                self._save_timer = threading.Timer(wait, self._save_put_off)
                self._save_timer.daemon = True
                self._save_timer.start()

    def _save_put_off(self) -> None:
        with self._saving:
            if self._save_timer is None or self._ended:
                return
            self._save_timer = None
            try:
                self._write("running")
            except OSError:  # the loop's next write meets it too, and reports it
                pass

    def result(self, status: str, message: str, exit_code: int | None) -> dict:
        state = self.state
        replay = {"replay_of": state.replay_of, "replayed_responses": state.llm_calls} if state.replay_of else {}
        return {"run_id": self.record.run_id, "objective": state.objective, "status": status,
                "answer": state.answer, "steps": state.step, "llm_calls": 0 if replay else state.llm_calls, **replay,
                "prompt_tokens": state.prompt_tokens, "completion_tokens": state.completion_tokens,
                "cached_prompt_tokens": state.cached_prompt_tokens, "cost_saved_usd": round(state.saved_usd, 6),
                "cost_usd": round(state.cost_usd, 6), "started_at": state.started_at,
                "ended_at": None if status == "running" else now_iso(), "model": self.settings.model,
                "exit_code": exit_code, "message": message, "sandbox": self.isolation,
                "workdir": str(self.settings.workdir_path), "follows": state.follows, **process_identity()}


_runs_going = [0, 0.0]  # runs driven in this process now, and the switch interval before the first
_switch_lock = threading.Lock()


def _switching(change: int) -> None:
    """The first run to start sets the short switch interval, the last to end puts the one before back (runs may be
    driven in threads of one process, the web UI's)."""
    with _switch_lock:
        if change > 0 and _runs_going[0] == 0:
            _runs_going[1] = sys.getswitchinterval()
            sys.setswitchinterval(min(_runs_going[1], SWITCH_INTERVAL_S))
        _runs_going[0] += change
        if change < 0 and _runs_going[0] == 0:
            sys.setswitchinterval(_runs_going[1])


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


def _hints(*hints: str) -> str:
    """The hints of a step's calls, each said once."""
    return "\n".join(dict.fromkeys(line for hint in hints for line in hint.splitlines() if line))


def _raise_on_sigterm():
    """SIGTERM ends a run the way Ctrl-C does: state saved, exit 130. Returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, previous)
