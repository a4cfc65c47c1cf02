"""The terminal: progress on stderr (rich), approval prompts and talk_to_user replies from the person at it.

stdout is kept for the final answer alone, so `miniagi "…" > answer.txt` works.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.syntax import Syntax
from rich.text import Text

ARG_PREVIEW_LINES = 3
OBSERVATION_PREVIEW_LINES = 6


@dataclass(frozen=True)
class Approval:
    run: bool
    observation: str = ""  # what the model is told when the command does not run


def _preview(text: str, lines: int, width: int = 160) -> str:
    kept = [line[:width] + ("…" if len(line) > width else "") for line in text.splitlines()[:lines]]
    more = len(text.splitlines()) - lines
    return "\n".join(kept) + (f"\n… ({more} more lines)" if more > 0 else "")


class Terminal:
    def __init__(self, *, interactive: bool, debug: bool = False, quiet: bool = False,
                 redact: Callable[[str], str] = lambda text: text):
        self.console = Console(stderr=True, highlight=False, soft_wrap=False)
        if not self.console.is_terminal:  # a log or a pipe: lines stay whole, so commands in them can be copied
            self.console.soft_wrap = True
        self.interactive = interactive
        self.debug = debug
        self.quiet = quiet
        self.redact = redact  # every text shown passes the agent's secret gate

    def say(self, markup: str) -> None:
        if not self.quiet:
            self.console.print(markup)

    def run_started(self, run_id: str, objective: str, model: str, resumed_at: int = 0) -> None:
        verb = f"resuming at step {resumed_at + 1}" if resumed_at else "started"
        # the run id always reaches stderr, even when quiet: it is how a run is found again
        self.console.print(f"[bold]run {run_id}[/] {verb} · model {escape(model)}")
        self.say(Text(f"objective: {self.redact(objective)}", style="cyan"))

    def thinking(self, step: int):
        if self.quiet or not self.console.is_terminal:
            return contextlib.nullcontext()
        return self.console.status(f"step {step}: thinking…", spinner="dots")

    def action(self, step: int, thought: str, command: str, arg: str, cost_usd: float) -> None:
        if self.quiet:
            return
        header = Text.assemble((f"step {step} ", "bold"), (command, "bold magenta"), (f"  ${cost_usd:.4f}", "dim"))
        self.console.print(header)
        if thought:
            self.console.print(Text(f"  {_preview(self.redact(thought), 3)}", style="italic"))
        if arg and command != "done":
            self.console.print(Text(_indent(_preview(self.redact(arg), ARG_PREVIEW_LINES)), style="yellow"))

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
        answer = self.console.input("[bold]Run it?[/] [Y]es / [n]o / or type feedback for the agent: ").strip()
        if answer.lower() in ("", "y", "yes"):
            return Approval(True)
        if answer.lower() in ("n", "no"):
            return Approval(False, "The user refused to run this command. Choose another way forward.")
        return Approval(False, f"The user did not run this command and said: {answer}")

    def ask_user(self, message: str) -> str:
        self.console.print(Panel(Text(self.redact(message)), title="the agent asks", border_style="cyan"))
        return self.console.input("[bold]your reply:[/] ")

    def run_ended(self, result: dict) -> None:
        status = result.get("status")
        style = "green" if status == "done" else "red"
        self.console.print(Text.assemble(
            (f"run {result.get('run_id')} ", "bold"), (str(status), f"bold {style}"),
            (f" · {result.get('steps')} steps · {result.get('llm_calls')} model calls · "
             f"${result.get('cost_usd', 0):.4f}", "dim")))
        if result.get("message") and status != "done":
            self.console.print(Text(self.redact(result["message"]), style=style))


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())
