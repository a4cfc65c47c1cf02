"""The terminal: progress on stderr (rich), approval prompts and talk_to_user replies from the person at it.

stdout is kept for the final answer alone, so `miniagi "…" > answer.txt` works.
"""

from __future__ import annotations

import contextlib
import json
import re
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

# What text from the model or from executed code must not bring to a terminal raw: control characters (escape
# sequences move the cursor, erase lines, set the title or the clipboard), a carriage return that is not a line
# ending (it writes over the line), bidirectional controls (they reorder what is shown), line and paragraph
# separators, and the invisible tag characters. Newlines and tabs stay.
UNSAFE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"
                    "\ufeff\U000e0000-\U000e007f]|\r(?!\n)")


def visible(text: str) -> str:
    """Text safe to print: each unsafe character shown as its escape (ESC as \\x1b, U+202E as \\u202e)."""
    return UNSAFE.sub(_escape, str(text))


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return "\\r" if code == 13 else f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 \
        else f"\\U{code:08x}"


def visible_json(data) -> str:
    """JSON safe to print: what `visible` escapes, escaped the JSON way (\\u202e), so a parser reads the same text."""
    def escape(match: re.Match) -> str:
        units = match.group().encode("utf-16-be")
        return "".join(f"\\u{int.from_bytes(units[i:i + 2], 'big'):04x}" for i in range(0, len(units), 2))

    return UNSAFE.sub(escape, json.dumps(data, ensure_ascii=False, default=str))


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


def calls(result: dict) -> str:
    """The model calls of a run; a replay makes none, it answers from the recording."""
    text = plural(result.get("llm_calls") or 0, "model call")
    if result.get("replay_of"):
        text += f" ({plural(result.get('replayed_responses') or 0, 'replayed response')})"
    return text


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
        self.flow: Flow | None = None  # the reply streaming in under the spinner
        self.shown_system = ""  # --debug prints the system prompt once
        self.approved: set[str] = set()  # commands shown whole in the approval panel: the step line skips them
        self.streamed_live = threading.local()  # --debug: this thread's last reply was printed as it came

    def shown(self, text: str) -> str:
        """What a text of the model's or of executed code becomes on the terminal: redacted, made visible."""
        return visible(self.redact(text))

    def say(self, markup: str) -> None:
        if not self.quiet:
            self.console.print(markup)

    def run_started(self, run_id: str, objective: str, model: str, resumed_at: int | None = None,
                    follows: str | None = None) -> None:
        verb = "started" if resumed_at is None else f"resuming at step {resumed_at + 1}"
        continues = f" · continues run {follows}" if follows else ""
        self.say(f"[bold]run {run_id}[/] {verb}{continues} · model {escape(visible(model))}")
        self.say(Text(f"objective: {self.shown(objective)}", style="cyan"))

    def thinking(self, step: int):
        return self.working(f"step {step}: thinking")

    @contextlib.contextmanager
    def working(self, what: str):
        """A spinner while the model thinks or a command runs (in a terminal): the time elapsed, or, as a reply
        streams in, its tokens so far and their rate ("step 3: thinking… 212 tokens, 18/s")."""
        if self.quiet or not self.console.is_terminal:
            yield
            return
        flow = self.flow = Flow(threading.get_ident(), time.monotonic())
        stop = threading.Event()
        with self.console.status(f"{what}…", spinner="dots") as status:
            def tick() -> None:
                while not stop.wait(0.5):
                    status.update(f"{what}… {flow}")

            ticker = threading.Thread(target=tick, name="elapsed", daemon=True)
            ticker.start()
            try:
                yield
            finally:
                stop.set()
                ticker.join()
                self.flow = None

    @contextlib.contextmanager
    def receiving(self, role: str):
        """While a reply streams in, yields the function told each piece of it: the spinner of this thread counts
        them, and with --debug they are printed raw as they come, a line at a time (on the main thread; a reply
        that arrives on another is printed whole when it ends)."""
        flow = self.flow if self.flow is not None and self.flow.thread == threading.get_ident() else None
        live = self.debug and threading.current_thread() is threading.main_thread()
        pending: list[str] = []
        printed = False

        def show(text: str) -> None:
            nonlocal printed
            if not printed:
                self.console.print(Text(f"──── raw {role} reply, as it streams ────", style="green"))
                printed = True
            self.console.print(Text(self.shown(text)))

        def on_piece(piece: str) -> None:
            if flow is not None:
                flow.pieces += 1
                flow.first = flow.first or time.monotonic()
            if live:
                pending.append(piece)
                if "\n" in piece:
                    lines, _, rest = "".join(pending).rpartition("\n")
                    show(lines)
                    pending[:] = [rest]

        try:
            yield on_piece
        finally:
            if "".join(pending):
                show("".join(pending))
            self.streamed_live.shown = printed

    def action(self, step: int, thought: str, command: str, arg: str, cost_usd: float) -> None:
        if self.quiet:
            return
        header = Text.assemble((f"step {step} ", "bold"), (command, "bold magenta"),
                               (f"  ${cost_usd:.4f} so far", "dim"))
        self.console.print(header)
        if thought:
            self.console.print(Text(f"  {_preview(self.shown(thought), 3)}", style="italic"))
        if arg and command != "done" and command not in self.approved:
            self.console.print(Text(_indent(_preview(self.shown(arg), ARG_PREVIEW_LINES)), style="yellow"))

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
            self.debug_raw(event)

    def observation(self, text: str) -> None:
        if not self.quiet:
            self.console.print(Text(_indent(_preview(self.shown(text), OBSERVATION_PREVIEW_LINES)), style="dim"))

    def critic(self, text: str) -> None:
        self.say(Text(f"  critic: {_preview(self.shown(text), 4)}", style="bold cyan"))

    def warn(self, text: str) -> None:
        self.say(Text(self.shown(text), style="bold red"))

    def progress(self, text: str) -> None:
        """A passing sign of life during long work (reading, storing)."""
        if not self.quiet:
            self.console.print(Text(f"  … {self.shown(text)}", style="dim"))

    def debug_context(self, messages: list[dict]) -> None:
        """--debug: the whole context of an agent call; the system prompt only the first time (and when it
        changes)."""
        if not self.debug:
            return
        parts = []
        for message in messages:
            content = message.get("content") or ""
            if message["role"] == "system":
                content, self.shown_system = ("(the system prompt printed above)" if content == self.shown_system
                                              else content), content
            calls = message.get("tool_calls")
            parts.append(f"[{message['role']}]\n{content}" + (f"\n{calls}" if calls else ""))
        self._debug_block("context", "\n\n".join(parts), "blue")

    def debug_raw(self, event: ev.ModelCall) -> None:
        """--debug: a model's raw reply, unless it was printed as it streamed; then how fast it came."""
        if not self.debug:
            return
        if not getattr(self.streamed_live, "shown", False):
            self._debug_block(f"raw {event.role} response", event.response, "green")
        self.streamed_live.shown = False
        if event.tokens_per_s is not None:
            self.console.print(Text(f"──── {event.completion_tokens} tokens · first after {event.first_token_s:.1f} s"
                                    f" · {event.tokens_per_s:g}/s ────", style="green"))

    def _debug_block(self, title: str, body: str, style: str) -> None:
        """In a terminal, a panel; into a file or a pipe, whole lines under a rule (a panel is cut at 80
        columns there)."""
        if self.console.is_terminal:
            self.console.print(Panel(Text(self.shown(body)), title=title, border_style=style))
        else:
            self.console.print(Text(f"──── {title} ────", style=style))
            self.console.print(Text(self.shown(body)))

    def approve(self, command: str, arg: str) -> Approval:
        """Ask the person before running code. Enter or y runs it, n refuses, anything else is feedback."""
        lexer = "python" if command == "execute_python" else "bash"
        # every character of the code, long lines wrapped (never cropped), even when stderr is not a terminal
        self.console.print(Panel(Syntax(self.shown(arg), lexer, word_wrap=True), title=command,
                                 border_style="yellow"), soft_wrap=False)
        answer = self._input("[bold]Run it?[/] \\[Y]es / \\[n]o / or type feedback for the agent: ").strip()
        if answer.lower() in ("", "y", "yes"):
            return Approval(True)
        if answer.lower() in ("n", "no"):
            return Approval(False, "The user refused to run this command. Choose another way forward.")
        return Approval(False, f"The user did not run this command and said: {answer}")

    def confirm(self, question: str) -> bool:
        """A yes/no question whose safe answer is no: only y or yes says yes."""
        self.console.print(Text(self.shown(question), style="bold yellow"))
        return self._input("[bold]\\[y]es / \\[N]o:[/] ").strip().lower() in ("y", "yes")

    def ask_user(self, message: str) -> str:
        self.console.print(Panel(Text(self.shown(message)), title="the agent asks", border_style="cyan"))
        return self._input("[bold]your reply:[/] ")

    def _input(self, prompt: str) -> str:
        """A line from the person; Ctrl-D (end of input) is taken as Ctrl-C: they want to stop."""
        try:
            return self.console.input(prompt)
        except EOFError:
            self.console.print()
            raise KeyboardInterrupt from None
        except KeyboardInterrupt:  # the terminal echoed ^C: what follows starts on a line of its own
            self.console.print()
            raise

    def run_ended(self, result: dict) -> None:
        if self.quiet:
            return
        status = result.get("status")
        style = "green" if status == "done" else "red"
        self.console.print(Text.assemble(
            (f"run {result.get('run_id')} ", "bold"), (str(status), f"bold {style}"),
            (f" · {plural(result.get('steps') or 0, 'step')} · "
             f"{calls(result)} · ${result.get('cost_usd', 0):.4f}"
             + (f" · {100 * result['cached_prompt_tokens'] / result['prompt_tokens']:.0f}% cached"
                if result.get("cached_prompt_tokens") and result.get("prompt_tokens") else ""), "dim")))
        if result.get("message") and status != "done":
            self.console.print(Text(self.shown(result["message"]), style=style))


@dataclass
class Flow:
    """A reply streaming in under a spinner: counted by the pieces it arrives in (about a token each)."""

    thread: int
    started: float
    pieces: int = 0
    first: float = 0.0  # when the first piece came

    def __str__(self) -> str:
        now = time.monotonic()
        if not self.pieces:
            return f"{now - self.started:.0f} s"
        rate = self.pieces / (now - self.first) if now - self.first >= 1 else None
        return f"{plural(self.pieces, 'token')}" + (f", {rate:.0f}/s" if rate is not None else "")


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())
