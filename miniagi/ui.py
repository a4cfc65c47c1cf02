"""The terminal: progress on stderr (rich), approval prompts and talk_to_user replies from the person at it.

stdout is kept for the final answer alone, so `miniagi "…" > answer.txt` works.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Callable

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.syntax import Syntax
from rich.text import Text

from . import events as ev

ARG_PREVIEW_LINES = 3
OBSERVATION_PREVIEW_LINES = 6


@dataclass(frozen=True)
class Approval:
    run: bool
    observation: str = ""  # what the model is told when the command does not run


def make_console(stderr: bool = False) -> Console:
    """A console for our output; into a file or a pipe, lines are never wrapped, so a command in them can be
    copied and a grep finds whole lines."""
    console = Console(stderr=stderr, highlight=False)
    console.soft_wrap = not console.is_terminal
    return console


def plural(count: int, noun: str, many: str | None = None) -> str:
    return f"{count} {noun}" if count == 1 else f"{count:,} {many or noun + 's'}"


def _preview(text: str, lines: int, width: int = 160) -> str:
    kept = [line[:width] + ("…" if len(line) > width else "") for line in text.splitlines()[:lines]]
    more = len(text.splitlines()) - lines
    return "\n".join(kept) + (f"\n… ({more} more lines)" if more > 0 else "")


class Terminal:
    def __init__(self, *, interactive: bool, debug: bool = False, quiet: bool = False,
                 redact: Callable[[str], str] = lambda text: text):
        self.console = make_console(stderr=True)
        self.interactive = interactive
        self.debug = debug
        self.quiet = quiet
        self.redact = redact  # every text shown passes the agent's secret gate
        self.calls_label = "model call"  # a replay says "replayed response": it makes no model call

    def say(self, markup: str) -> None:
        if not self.quiet:
            self.console.print(markup)

    def run_started(self, run_id: str, objective: str, model: str, resumed_at: int | None = None) -> None:
        verb = "started" if resumed_at is None else f"resuming at step {resumed_at + 1}"
        self.say(f"[bold]run {run_id}[/] {verb} · model {escape(model)}")
        self.say(Text(f"objective: {self.redact(objective)}", style="cyan"))

    def thinking(self, step: int):
        return self.working(f"step {step}: thinking")

    @contextlib.contextmanager
    def working(self, what: str):
        """A spinner with the time elapsed, while the model thinks or a command runs (in a terminal)."""
        if self.quiet or not self.console.is_terminal:
            yield
            return
        started = time.monotonic()
        stop = threading.Event()
        with self.console.status(f"{what}…", spinner="dots") as status:
            def tick() -> None:
                while not stop.wait(1.0):
                    status.update(f"{what}… {time.monotonic() - started:.0f} s")

            ticker = threading.Thread(target=tick, name="elapsed", daemon=True)
            ticker.start()
            try:
                yield
            finally:
                stop.set()
                ticker.join()

    def action(self, step: int, thought: str, command: str, arg: str, cost_usd: float) -> None:
        if self.quiet:
            return
        header = Text.assemble((f"step {step} ", "bold"), (command, "bold magenta"),
                               (f"  ${cost_usd:.4f} so far", "dim"))
        self.console.print(header)
        if thought:
            self.console.print(Text(f"  {_preview(self.redact(thought), 3)}", style="italic"))
        if arg and command != "done":
            self.console.print(Text(_indent(_preview(self.redact(arg), ARG_PREVIEW_LINES)), style="yellow"))

    def show(self, event: ev.Event, cost_usd: float = 0.0) -> None:
        """What the terminal shows of a run's event, as it is emitted (bookkeeping events show nothing)."""
        if isinstance(event, ev.Action):
            self.action(event.step, event.thought, event.command, event.arg, cost_usd)
        elif isinstance(event, ev.Observation):
            self.observation(event.text)
        elif isinstance(event, ev.FormatError):
            problem = event.error.splitlines()[0].removeprefix("Your reply could not be used: ").rstrip(".")
            self.warn(f"step {event.step}: the reply could not be used: {problem}")
        elif isinstance(event, ev.CriticReview):
            self.critic(event.text)
        elif isinstance(event, ev.CriticVerdict):
            from .critic import verdict

            self.critic(("ACCEPT: " if event.accepted else "REJECT: ") + verdict(event.text)[1])
        elif isinstance(event, ev.LoopWarning):
            self.warn(f"loop: {event.kind}, {event.repeats} times")
        elif isinstance(event, ev.ModelCall):
            self.debug_raw(event.role, event.response)

    def observation(self, text: str) -> None:
        if not self.quiet:
            self.console.print(Text(_indent(_preview(self.redact(text), OBSERVATION_PREVIEW_LINES)), style="dim"))

    def critic(self, text: str) -> None:
        self.say(Text(f"  critic: {_preview(self.redact(text), 4)}", style="bold cyan"))

    def warn(self, text: str) -> None:
        self.say(Text(self.redact(text), style="bold red"))

    def progress(self, text: str) -> None:
        """A passing sign of life during long work (reading, storing)."""
        if not self.quiet:
            self.console.print(Text(f"  … {self.redact(text)}", style="dim"))

    def debug_context(self, messages: list[dict]) -> None:
        if self.debug:
            body = "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in messages)
            self.console.print(Panel(Text(self.redact(body)), title="context", border_style="blue"))

    def debug_raw(self, role: str, text: str) -> None:
        if self.debug:
            self.console.print(Panel(Text(self.redact(text)), title=f"raw {role} response", border_style="green"))

    def approve(self, command: str, arg: str) -> Approval:
        """Ask the person before running code. Enter or y runs it, n refuses, anything else is feedback."""
        lexer = "python" if command == "execute_python" else "bash"
        self.console.print(Panel(Syntax(self.redact(arg), lexer, word_wrap=True), title=f"{command}: run this?",
                                 border_style="yellow"))
        answer = self._input("[bold]Run it?[/] \\[Y]es / \\[n]o / or type feedback for the agent: ").strip()
        if answer.lower() in ("", "y", "yes"):
            return Approval(True)
        if answer.lower() in ("n", "no"):
            return Approval(False, "The user refused to run this command. Choose another way forward.")
        return Approval(False, f"The user did not run this command and said: {answer}")

    def ask_user(self, message: str) -> str:
        self.console.print(Panel(Text(self.redact(message)), title="the agent asks", border_style="cyan"))
        return self._input("[bold]your reply:[/] ")

    def _input(self, prompt: str) -> str:
        """A line from the person; Ctrl-D (end of input) is taken as Ctrl-C: they want to stop."""
        try:
            return self.console.input(prompt)
        except EOFError:
            self.console.print()
            raise KeyboardInterrupt from None

    def run_ended(self, result: dict) -> None:
        if self.quiet:
            return
        status = result.get("status")
        style = "green" if status == "done" else "red"
        self.console.print(Text.assemble(
            (f"run {result.get('run_id')} ", "bold"), (str(status), f"bold {style}"),
            (f" · {plural(result.get('steps') or 0, 'step')} · "
             f"{plural(result.get('llm_calls') or 0, self.calls_label)} · ${result.get('cost_usd', 0):.4f}"
             + (f" · {100 * result['cached_prompt_tokens'] / result['prompt_tokens']:.0f}% cached"
                if result.get("cached_prompt_tokens") and result.get("prompt_tokens") else ""), "dim")))
        if result.get("message") and status != "done":
            self.console.print(Text(self.redact(result["message"]), style=style))


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())
