"""The terminal: progress on stderr (rich), approval prompts and talk_to_user replies from the person at it.

stdout is kept for the final answer alone, so `miniagi "…" > answer.txt` works.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import threading
import time
from dataclasses import astuple, dataclass, field
from typing import Callable, Iterable

from rich.cells import cell_len
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.spinner import Spinner
from rich.text import Text

from . import events as ev
from .text import files_changed_line, plural

# Bounds are in screen lines: a line is wrapped at the terminal's width under its indent, every word of it shown
ARG_PREVIEW_LINES = 4
OBSERVATION_PREVIEW_LINES = 8
LIVE_THOUGHT_LINES = 40  # of a reply streaming in, shown as they come; the lines past them are counted
LIVE_ARG_LINES = 12
LIVE_OUTPUT_LINES = 20  # of what code prints, shown as it prints; past them, its last lines when it ends
LIVE_OUTPUT_TAIL = 6
LINE_ROWS = 4  # the screen lines one line of output may take; the rest of it is cut (the model gets it whole)
COMING_ROWS = 4  # of the line still coming in, the last screen lines are shown on the spinner's
LINE_WIDTH = 160  # into a file or a pipe lines are not wrapped: a line of output is cut at LINE_ROWS times this
FENCE = re.compile(r"<<<UNTRUSTED DATA: [^\n]*?>>>\n?|\n?<<<END UNTRUSTED DATA>>>")  # the model's framing of data

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


YES = {"", "y", "yes", "ok", "okay", "sure", "yep", "yeah", "go", "run", "run it", "go ahead"}
NO = {"n", "no", "nope", "don't", "do not", "skip"}
ALL = {"a", "all", "always", "yes to all", "all of them"}


@dataclass(frozen=True)
class Approval:
    run: bool
    observation: str = ""  # what the model is told when the command does not run
    every_later: bool = False  # and every later command of the run, without asking (as -y from here on)


class DrawingConsole(Console):
    """A console whose every print is drawn whole between two redraws of a live display (the spinner): a live
    display given `drawing` as its lock redraws only between prints. Without it the spinner's thread could draw
    the line still coming just before a print that then erased one line too few (a fragment of the thought left
    above the step's header)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.drawing = threading.RLock()

    def print(self, *args, **kwargs) -> None:
        with self.drawing:
            super().print(*args, **kwargs)


def _same_terminal() -> bool:
    """Whether stdout and stderr are one terminal (so what goes to stdout is on the screen the steps are on)."""
    try:
        return os.isatty(1) and os.isatty(2) and os.fstat(1).st_rdev == os.fstat(2).st_rdev
    except OSError:
        return False


def make_console(stderr: bool = False) -> Console:
    """A console for our output; into a file or a pipe, lines are never wrapped, so a command in them can be
    copied and a grep finds whole lines."""
    # no :name: emoji codes (our lines use none): rich's table of 3,600 stays unloaded, ~0.4 MB and a few ms of start
    console = DrawingConsole(stderr=stderr, highlight=False, emoji=False)
    console.soft_wrap = not console.is_terminal
    return console


def calls(result: dict) -> str:
    """The model calls of a run; a replay makes none, it answers from the recording."""
    text = plural(result.get("llm_calls") or 0, "model call")
    if result.get("replay_of"):
        text += f" ({plural(result.get('replayed_responses') or 0, 'replayed response')})"
    return text


def unfenced(text: str) -> str:
    """An observation as a person reads it: the data without the framing it carries for the model."""
    return FENCE.sub("", text)


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
        # commands whose argument a panel shows whole (the approval's, the question's): the step line skips it
        self.approved: set[str] = set()
        self.streamed_live = threading.local()  # --debug: this thread's last reply was printed as it came
        self.live_reply = threading.local()  # the LiveReply that showed this thread's last reply as it came
        self.live_output: list[str] = []  # the lines the last command printed, as shown while it ran
        self.echo_objective = True  # not in a chat: the person just typed it
        self.reply_format = None  # the run's ReplyFormat, which reads an agent's reply as it streams in
        # the final answer goes to stdout as the run's last line: on the same screen, the step block leaves it out
        self.answer_below = _same_terminal()

    def serve(self, redact: Callable[[str], str], reply_format=None, shown_whole: set[str] = frozenset()) -> None:
        """What the agent it shows tells it, as soon as it knows it: its secret gate, the format that reads its
        replies as they stream in, the commands whose approval panel shows their argument whole."""
        self.redact, self.reply_format, self.approved = redact, reply_format, set(shown_whole)

    def asks_no_more(self, commands: Iterable[str]) -> None:
        """These commands run without asking from now on (the person answered `a`): no panel shows their argument,
        so the step line does again."""
        self.approved -= set(commands)

    @property
    def live(self) -> bool:
        """Whether work is shown as it happens: in a terminal, unless quiet."""
        return self.console.is_terminal and not self.quiet

    def shown(self, text: str) -> str:
        """What a text of the model's or of executed code becomes on the terminal: redacted, made visible."""
        return visible(self.redact(text))

    def say(self, markup: str) -> None:
        if not self.quiet:
            self.console.print(markup)

    def rows(self, line: str, indent: str, most: int | None = None) -> list[str]:
        """One line as the screen shows it: wrapped at the terminal's width, every row under its indent, at most
        `most` rows (the last then ends with …). Into a file or a pipe it stays one row (cut at `most` * LINE_WIDTH
        characters)."""
        if not self.console.is_terminal:
            cut = None if most is None or len(line) <= most * LINE_WIDTH else most * LINE_WIDTH
            return [indent + (line if cut is None else line[:cut] + "…")]
        width = max(10, self.console.width - cell_len(indent))
        wrapped = [row.plain.rstrip() for row in Text(line).wrap(self.console, width)] or [""]
        if most is not None and len(wrapped) > most:
            wrapped = wrapped[:most]
            wrapped[-1] = wrapped[-1][:width - 1] + "…"
        return [indent + row for row in wrapped]

    def block(self, text: str, indent: str, style: str, most: int, line_rows: int | None = None) -> None:
        """A text's lines, wrapped under their indent, at most `most` screen lines (each line at most `line_rows`);
        the lines left out are counted."""
        lines, printed, shown = text.split("\n"), [], 0
        for line in lines:
            room = most - len(printed)
            if room <= 0:
                break
            printed += self.rows(line, indent, room if line_rows is None else min(room, line_rows))
            shown += 1
        if len(lines) > shown:
            printed.append(f"{indent}… ({plural(len(lines) - shown, 'more line')})")
        self.console.print(Text("\n".join(printed), style=style))

    def run_started(self, run_id: str, objective: str, model: str, resumed_at: int | None = None,
                    follows: str | None = None, sandbox: str | None = None) -> None:
        verb = "started" if resumed_at is None else f"resuming at step {resumed_at + 1}"
        continues = f" · continues run {follows}" if follows else ""
        contained = f" · sandbox: {sandbox}" if sandbox else ""
        line = f"run {run_id} {verb}{continues} · model {visible(model)}"
        if self.console.is_terminal and cell_len(line + contained) > self.console.width:  # its parts whole
            contained = f"\n  sandbox: {sandbox}" if sandbox else ""
        self.say(f"[bold]run {run_id}[/] {verb}{continues} · model {escape(visible(model))}{contained}")
        if self.echo_objective:
            self.say(Text(f"objective: {self.shown(objective)}", style="cyan"))

    def thinking(self, step: int):
        return self.working(f"step {step}: thinking", step=step)

    @contextlib.contextmanager
    def working(self, what: str, step: int | None = None):
        """A spinner while the model thinks or a command runs (in a terminal): the time elapsed, or, as a reply
        streams in, its tokens so far and their rate ("step 3: thinking… 212 tokens, 18/s"). Above it, what streams
        in: the reply (`receiving`), the lines code prints (`code_line`), each whole line printed for good, the line
        still coming shown on the spinner's."""
        if self.quiet or not self.console.is_terminal:
            yield
            return
        flow = self.flow = Flow(threading.get_ident(), time.monotonic(), step=step)
        status = _Status(f"{what}…", flow)
        live = Live(status, console=self.console, refresh_per_second=12.5, transient=True)
        live._lock = getattr(self.console, "drawing", live._lock)  # a redraw never between a print's parts
        try:
            with live:
                yield
        finally:
            self.flow = None
            flow.close(self)

    @contextlib.contextmanager
    def receiving(self, role: str):
        """While a reply streams in, yields the function told each piece of it: the spinner of this thread counts
        them, and an agent's reply is shown as it comes (thought, then command and argument); with --debug the
        pieces are printed raw instead, a line at a time (on the main thread; a reply that arrives on another is
        printed whole when it ends)."""
        flow = self.flow if self.flow is not None and self.flow.thread == threading.get_ident() else None
        live = self.debug and threading.current_thread() is threading.main_thread()
        reads = flow is not None and role == "agent" and not live and self.reply_format is not None
        reply = LiveReply(self, flow.step, self.reply_format.reading()) if reads else None
        if flow is not None:
            flow.reply = reply
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
            if reply is not None:
                reply.feed(piece)
            if live:
                pending.append(piece)
                if "\n" in piece:
                    lines, _, rest = "".join(pending).rpartition("\n")
                    show(lines)
                    pending[:] = [rest]

        self.live_reply.shown = None
        interrupted = True
        try:
            yield on_piece
            interrupted = False
        finally:
            if "".join(pending):
                show("".join(pending))
            self.streamed_live.shown = printed
            if reply is not None:
                reply.finish(interrupted)
                flow.reply = None
                self.live_reply.shown = reply if reply.started else None

    def code_line(self, line: str) -> None:
        """A line executed code printed, shown as it comes (in a terminal, under a command's spinner), the first
        LIVE_OUTPUT_LINES of each command; the rest are counted on the spinner's line."""
        flow = self.flow
        if flow is None or flow.reply is not None:
            return
        with flow.lock:
            shown = self.shown(line)
            if len(flow.output_shown) >= LIVE_OUTPUT_LINES:  # the last few are shown when the command ends
                flow.output_more += 1
                flow.output_tail.append(shown)
                return
            flow.output_shown.append(shown)
            self.console.print(Text("\n".join(self.rows(shown, "    ", LINE_ROWS)), style="dim"))

    def action(self, step: int, thought: str, command: str, arg: str, cost_usd: float) -> None:
        if self.quiet:
            return
        live = getattr(self.live_reply, "shown", None)
        self.live_reply.shown = None
        if live is not None and live.command == command:  # shown as it streamed in
            return
        header = Text.assemble((f"step {step} ", "bold"), (command, "bold magenta"),
                               (f"  ${cost_usd:.4f} so far", "dim"))
        self.console.print(header)
        if thought:
            self.block(self.shown(thought), "  ", "italic", LIVE_THOUGHT_LINES)
        if arg and command != "done" and command not in self.approved:
            self.block(self.shown(arg), "    ", "yellow", ARG_PREVIEW_LINES)

    def show(self, event: ev.Event, cost_usd: float = 0.0) -> None:
        """What the terminal shows of a run's event, as it is emitted (bookkeeping events show nothing)."""
        if isinstance(event, ev.Action):
            self.action(event.step, event.thought, event.command, event.arg, cost_usd)
        elif isinstance(event, ev.Observation):
            self.observation(event.text)
            if event.files:
                self.files_changed(event.files)
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
        elif isinstance(event, ev.SummaryFolded):  # steps left the view: say what covers them now
            digest = f"; notes of steps 1-{event.notes_through} in a digest" if event.notes_through else ""
            self.progress(f"memory: the summary now covers steps 1-{event.through_step}{digest}")

    def observation(self, text: str) -> None:
        """The step's observation, in brief; the lines of output already shown as the code printed them are not
        shown again."""
        if self.quiet:
            return
        shown, lines = unfenced(self.shown(text)).strip("\n"), self.live_output
        self.live_output = []
        if lines:
            shown = _after(shown.split("\n"), lines).strip("\n")
            if not shown:
                return
        self.block(shown, "    ", "dim", OBSERVATION_PREVIEW_LINES, LINE_ROWS)

    def files_changed(self, files: dict[str, str]) -> None:
        """What the step changed in the work directory, on one line (`miniagi diff RUN --step N` shows it)."""
        if not self.quiet:
            self.console.print(Text(f"  {self.shown(files_changed_line(files))}", style="cyan"))

    def critic(self, text: str) -> None:
        if not self.quiet:
            self.block("critic: " + self.shown(text), "  ", "bold cyan", 6)

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
        """Ask the person before running code. Enter, y, yes, ok, sure run it; n or no refuses; anything else is
        feedback for the agent."""
        from rich.syntax import Syntax  # with pygments: ~2 MB and ~15 ms that a run never asking first goes without

        lexer = "python" if command == "execute_python" else "bash"
        # every character of the code, long lines wrapped (never cropped), even when stderr is not a terminal, and
        # not redacted: the panel is shown to the person whose secrets they are and kept nowhere, and a text the
        # secret gate hid (a value of a .env code wrote can match any text) would run unseen
        self.console.print(Panel(Syntax(visible(arg), lexer, word_wrap=True), title=command,
                                 border_style="yellow"), soft_wrap=False)
        answer = self._input("[bold]Run it?[/] \\[Y]es / \\[n]o / \\[a]ll (this and every later command of this "
                             "run) / or type feedback for the agent [dim](Enter, y, yes, ok, sure: run it)[/]: ")
        answer = answer.strip()
        word = answer.lower().rstrip(".!")
        if word in YES:
            return Approval(True)
        if word in ALL:
            self.console.print(Text("  every later command of this run runs without asking (as with -y)", "bold"))
            return Approval(True, every_later=True)
        if word in NO:
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
    """What goes on under a spinner: a reply streaming in, counted by the pieces it arrives in (about a token each),
    or a command running, with the lines it printed."""

    thread: int
    started: float
    step: int | None = None
    pieces: int = 0
    first: float = 0.0  # when the first piece came
    reply: "LiveReply | None" = None
    output_shown: list[str] = field(default_factory=list)  # lines code printed, as shown
    output_more: int = 0  # lines past those shown as they came
    output_tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=LIVE_OUTPUT_TAIL))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __str__(self) -> str:
        now = time.monotonic()
        if self.output_more:
            return f"{now - self.started:.0f} s · {plural(self.output_more, 'more line')} of output"
        if not self.pieces:
            return f"{now - self.started:.0f} s"
        rate = self.pieces / (now - self.first) if now - self.first >= 1 else None
        return f"{plural(self.pieces, 'token')}" + (f", {rate:.0f}/s" if rate is not None else "")

    def close(self, terminal: "Terminal") -> None:
        """The spinner is gone: what was shown stays, and the observation will not repeat it."""
        with self.lock:
            hidden = self.output_more - len(self.output_tail)
            if hidden:
                terminal.console.print(Text(f"    … ({plural(hidden, 'more line')})", style="dim"))
            for line in self.output_tail:
                terminal.console.print(Text("\n".join(terminal.rows(line, "    ", LINE_ROWS)), style="dim"))
            terminal.live_output = self.output_shown + list(self.output_tail)


class _Status:
    """The spinner's lines: the line of the reply still coming, if any, then the spinner with what it waits for."""

    def __init__(self, what: str, flow: Flow):
        self.what, self.flow = what, flow
        self.spinner = Spinner("dots")

    def __rich_console__(self, console, options):
        reply = self.flow.reply
        coming = reply.coming() if reply is not None else None
        self.spinner.update(text=f"{self.what} {self.flow}")
        yield Group(coming, self.spinner) if coming is not None else self.spinner


@dataclass
class _Part:
    """How far a part of a streaming reply (its thought, its argument) has been shown."""

    done: int = 0  # its lines handled: shown, or counted
    rows: int = 0  # the screen lines they took
    more: int = 0  # lines past the bound: not shown, counted
    counted: bool = False  # the count said


class LiveReply:
    """An agent's reply shown as it streams in, as its format reads it (`reply`, a protocols.ReplySoFar): its
    thought, then its command and its argument, each whole line printed for good as it completes (wrapped under its
    indent, bounded in screen lines), the line still coming on the spinner's."""

    def __init__(self, terminal: Terminal, step: int | None, reply):
        self.terminal, self.step = terminal, step
        self.reply = reply
        self.started = False
        self.command: str | None = None  # shown
        self.thought, self.arg = _Part(), _Part()
        self.current: tuple[str, str] | None = None  # the line still coming (as screen lines), and its style
        self.lock = threading.RLock()  # one update at a time (the spinner's drawing does not take it)

    def feed(self, piece: str) -> None:
        self.reply.feed(piece)
        self.update()

    def finish(self, interrupted: bool = False) -> None:
        """The reply ended (or was interrupted): its last lines are printed, so what was seen stays."""
        self.update(final=True, interrupted=interrupted)

    def coming(self) -> Text | None:
        """The line still coming, for the spinner's lines. Read without the lock: the spinner's thread draws while
        holding the display's lock, which `update` (holding this one) waits for to print."""
        current = self.current  # one tuple, replaced whole
        if current is None or not current[0].strip():
            return None
        return Text(current[0], style=current[1])

    def _coming(self, line: str, indent: str) -> str:
        """The last screen lines of the line still coming."""
        return "\n".join(self.terminal.rows(line, indent)[-COMING_ROWS:])

    def update(self, final: bool = False, interrupted: bool = False) -> None:
        with self.lock:
            thought, command, arg = astuple(self.reply.partial())
            if not self.started and not (thought.strip() or command):
                return
            thought_lines = self.terminal.shown(thought).split("\n")
            arg_lines = self.terminal.shown(arg).split("\n") if arg else []
            ended = final or command is not None
            # the approval panel will show the code whole: meanwhile its last lines are on the spinner's only
            held = command in self.terminal.approved and not interrupted
            if command == "done" and self.terminal.answer_below and not interrupted:  # printed below, once
                arg_lines = []
            # the line still coming is set before any line is printed: printing draws the spinner's lines again
            if not ended:
                self.current = (self._coming(thought_lines[-1], "  "), "italic")
            elif final or not arg_lines:
                self.current = None
            elif held:
                rows = [row for line in arg_lines for row in self.terminal.rows(line, "    ")]
                self.current = ("\n".join(rows[-LIVE_ARG_LINES:]), "yellow")
            else:
                self.current = (self._coming(arg_lines[-1], "    "), "yellow")
            if not self.started:
                self.started = True
                self._print(f"step {self.step}" if self.step is not None else "", "bold")
            self._lines(thought_lines if ended else thought_lines[:-1], self.thought, "  ", "italic",
                        LIVE_THOUGHT_LINES)
            if command is None or self.command is None:  # the thought is over: its lines past the bound counted
                if ended:
                    self._count(self.thought, "  ")
                if command is None:
                    return
            if self.command is None:
                self.command = command
                self._print(f"  {self.terminal.shown(command)}", "bold magenta")
            if held:
                return
            self._lines(arg_lines if final else arg_lines[:-1], self.arg, "    ", "yellow", LIVE_ARG_LINES)
            if final:
                self._count(self.arg, "    ")

    def _lines(self, lines: list[str], part: _Part, indent: str, style: str, bound: int) -> None:
        """The part's lines not handled yet: printed while the bound has room (the line that meets it cut there),
        then counted."""
        for line in lines[part.done:]:
            part.done += 1
            if part.rows >= bound:
                part.more += 1
                continue
            rows = self.terminal.rows(line, indent, bound - part.rows)
            part.rows += len(rows)
            self._print("\n".join(rows), style)

    def _count(self, part: _Part, indent: str) -> None:
        if part.more and not part.counted:
            part.counted = True
            self._print(f"{indent}… ({plural(part.more, 'more line')})", "dim")

    def _print(self, text: str, style: str) -> None:
        self.terminal.console.print(Text(text, style=style))


def _after(observed: list[str], printed: list[str]) -> str:
    """What an observation holds past the output already printed: after the last lines printed, found from the end
    (the output in the observation may be cut in the middle), else after the lines it begins with."""
    last = printed[-3:]
    for end in range(len(observed), len(last) - 1, -1):
        if observed[end - len(last):end] == last:
            return "\n".join(observed[end:])
    same = 0
    while same < min(len(printed), len(observed)) and printed[same] == observed[same]:
        same += 1
    return "\n".join(observed[same:])
