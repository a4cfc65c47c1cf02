"""How a reply carries its action: one module per reply format, each behind the small `ReplyFormat` interface.

- tags   `<r>thought</r><c>command</c>argument`, the MiniAGI format: works with any model, even a base model;
- tools  native tool calls (OpenAI function calling; vLLM, Ollama, llama.cpp server with tool-capable models): what
         modern chat models are trained for. Each command is a tool with one typed parameter per argument;
- json   one JSON object `{"thought", "command", "args"}`; where the endpoint supports structured outputs, the
         schema (command names as an enum, each command's arguments) is sent, so a constrained decoder cannot
         produce a bad action.

A format says what it adds to the agent's request (`request`: its own stop sequences, tools or response format),
how to read a reply (`read`, raising MalformedReply), how to read a reply still streaming in (`partial`: the
thought, command and argument so far, which the terminal, the web page and recall's look-ahead all show or read, so
no format's markup reaches a person), how a step is shown back in the history (`render`, in its own
standard form, which teaches the format to a model that strays) and how the system prompt tells the model to
reply (`describe`: the commands and an example in the real shape of the format's turns).

Adding a format is one module in this folder that defines `FORMAT`, an instance of its `ReplyFormat`: `formats()`,
the table of formats by name, is what the option, the system prompt, the terminal and the web page all read.
Each agent uses its format `offering` the agent's own commands (the built-in ones and its MCP tools): a format
reads and offers those, and asks a command itself how its arguments are written (`Command.text`, `parse`,
`placeholders`, `help_argument`).
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import functools
import importlib
import json
import os
import pkgutil
import shutil
import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from ..commands import Command, CommandTable

if TYPE_CHECKING:
    from memory.context import StepRecord

    from ..model import Completion

@dataclass(frozen=True)
class Example:
    """The worked example every format's description shows, each in its own shape."""

    objective: str = "How many days are there from 2024-03-01 to 2024-12-25?"
    thought: str = "Python's datetime can count them."
    code: str = "from datetime import date\n(date(2024, 12, 25) - date(2024, 3, 1)).days"
    result: str = "299"
    last_thought: str = "That answers it."
    answer: str = "There are 299 days from 2024-03-01 to 2024-12-25."
    # a filled-in action for format errors: not a placeholder a model could copy, and not a plausible first step
    fix: tuple[str, str, str] = ("I want to know which Python version is installed.", "execute_shell",
                                 "python3 --version")


EXAMPLE = Example()
SYSTEM_PROGRAMS = ("/usr/local/bin", "/usr/bin", "/bin")  # root's to write: no run's code plants there


@dataclass(frozen=True)
class Decision:
    """What a reply chose: its reasoning, one command and the command's arguments by parameter name."""

    thought: str
    definition: Command  # the command chosen, from the format's table
    args: dict  # as the command takes them: its parameters' types
    note: str = ""  # something the model should be told about how its reply was read
    given: dict | None = None  # the arguments object exactly as the model sent it (json, tools), when it sent one

    @property
    def command(self) -> str:
        return self.definition.name

    @property
    def arg(self) -> str:
        """The arguments as one text (the command's own text form): what the terminal shows and the loop compares."""
        return self.definition.text(self.args)

    @property
    def call(self) -> dict:
        """The call's arguments as one JSON object: what the trace records and the history shows back."""
        return self.args if self.given is None else self.given


class MalformedReply(Exception):
    """A reply that holds no usable action. str(error) is what the model is told: the problem and how to reply
    (the reply itself is in the context already: it is not quoted back)."""

    def __init__(self, problem: str, reply: str, how: str):
        self.problem = problem
        self.reply = reply
        super().__init__(f"Your reply could not be used: {problem}.\n{how}")


@dataclass(frozen=True)
class Partial:
    """A reply as far as it has come, read by its format: what a person is shown while it streams in (none of the
    format's markup) and what recall's look-ahead reads."""

    thought: str = ""
    command: str | None = None  # None until the reply has named it whole
    arg: str = ""  # the argument so far, as text (as `Command.text` writes it)


class ReplySoFar:
    """A reply still streaming in, fed piece by piece: its text (a tool call's thought) and a tool call's name and
    arguments (pieces that carry a `tool`), read by its format."""

    def __init__(self, reply_format: ReplyFormat):
        self.reply_format = reply_format
        self.text: list[str] = []
        self.arguments: list[str] = []
        self.tool = ""

    def feed(self, piece: str) -> None:
        if getattr(piece, "tool", None):
            self.tool = piece.tool
            self.arguments.append(piece)
        else:
            self.text.append(piece)

    def partial(self) -> Partial:
        return self.reply_format.partial("".join(self.text), self.tool, "".join(self.arguments))


class ReplyFormat:
    name: ClassVar[str]
    how: ClassVar[str]  # how to reply, told with every malformed reply
    stop: ClassVar[tuple[str, ...]] = ()  # where a reply should end: the request's stop sequences

    def __init__(self, commands: CommandTable | None = None):
        self._commands = commands

    @property
    def commands(self) -> CommandTable:
        """The commands it offers and reads: an agent's own table (`offering`), else the built-in ones."""
        return self._commands if self._commands is not None else CommandTable()

    def offering(self, commands: CommandTable) -> ReplyFormat:
        """This format for an agent's commands (the built-in ones and its MCP tools)."""
        return type(self)(commands)

    def command_named(self, name: str, reply: str) -> Command:
        """The action a reply names (its canonical name); a MalformedReply naming the closest one when there is no
        such action."""
        commands = self.commands
        name = name.strip().lower().replace("-", "_")
        offered = [c.name for c in commands.actions()]
        if name in offered:
            return commands[name]
        close = difflib.get_close_matches(name, offered, n=1, cutoff=0.6)
        hint = f" Did you mean {close[0]}?" if close else ""
        if name in commands:
            hint = f" It is a function inside execute_python only.{hint}"
        raise MalformedReply(f"{name!r} is not a command.{hint} The commands are: {', '.join(offered)}", reply,
                             self.how)

    def shown_arguments(self, record: StepRecord) -> dict:
        """A step's arguments as its call is shown back: the object recorded, or (traces older than it) read from
        the text form."""
        if record.args is not None:
            return record.args
        command = self.commands.get(record.command)
        return command.parse(record.arg) if command else {"arg": record.arg}

    def request(self) -> dict:
        """What the format adds to the agent's request: its stop sequences, tools or response_format."""
        return {"stop": list(self.stop)} if self.stop else {}

    def read(self, completion: Completion) -> Decision:
        raise NotImplementedError

    def partial(self, text: str, tool: str = "", arguments: str = "") -> Partial:
        """A reply as far as it came (its text; a tool call's name and arguments so far): the thought, the command
        once it is named whole, the argument so far. By default all of the text is the thought: a format with
        markup of its own reads past it here, so the markup is never shown."""
        return Partial(text.strip(), tool or None, arguments)

    def reading(self) -> ReplySoFar:
        """A reply about to stream in, to be fed its pieces and read as far as it came."""
        return ReplySoFar(self)

    def reply(self, record: StepRecord) -> dict:
        """A step's action as the assistant message this format would have sent."""
        raise NotImplementedError

    def render(self, record: StepRecord) -> list[dict]:
        """A step as the history shows it: the reply in this format's standard form, then the observation."""
        if not record.command:  # a malformed reply is shown as it came, with its format error
            return record.messages()
        return [self.reply(record), {"role": "user", "content": observation_text(record)}]

    def describe(self) -> str:
        """The system prompt's part on how to reply: the commands, an example run, how to finish."""
        raise NotImplementedError

    def usage(self, command: Command) -> str:
        """How a call of the command is written in this format, its arguments as placeholders."""
        raise NotImplementedError

    def raw_reply(self, completion: Completion) -> str:
        """A reply that could not be used, as text (kept in the history with its format error)."""
        return completion.text


def observation_text(record: StepRecord) -> str:
    return f"Observation (step {record.step}):\n{record.observation}"


@functools.cache
def formats() -> dict[str, ReplyFormat]:
    """The formats there are, by name: the FORMAT of every module in this folder, tags first (the default)."""
    found = [importlib.import_module(f"{__name__}.{module.name}").FORMAT for module in pkgutil.iter_modules(__path__)]
    return {f.name: f for f in sorted(found, key=lambda f: f.name != "tags")}


def one_command_line(decision: Decision) -> Decision:
    """execute_shell runs one command line. A multi-line argument runs its first line only — unless the lines form
    one command (a backslash continuation, a here-document, a loop or `if` block the first line cannot end) —
    and the model is told what was dropped."""
    line = decision.args.get("command_line", "") if decision.command == "execute_shell" else ""
    if "\n" not in line.strip():
        return decision
    first, rest = line.strip().split("\n", 1)
    if first.rstrip().endswith("\\") or "<<" in first or _incomplete(first):
        return decision
    dropped = (f"Note: execute_shell runs ONE command line; only the first line was run. Dropped: "
               f"{len(rest.splitlines())} more line(s) beginning {rest.strip()[:80]!r}. To run a script, write it to "
               "a file first or use execute_python.")
    return Decision(decision.thought, decision.definition, {"command_line": first},
                    "\n\n".join(filter(None, [decision.note, dropped])), decision.given)


def _incomplete(line: str) -> bool:
    """Whether a shell line cannot stand alone (bash -n finds an unexpected end: an open loop, quote, block)."""
    bash = _bash()
    if bash is None:
        return False
    try:
        check = subprocess.run([bash, "-n", "-c", line], capture_output=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return check.returncode != 0


@functools.lru_cache(maxsize=1)
def _bash() -> str | None:
    """The bash the agent runs (outside the sandbox) for this check: the system's, never one from the PATH, where
    code could have planted one (a PATH folder in the work directory). Without one, no line is judged incomplete."""
    return shutil.which("bash", path=os.pathsep.join(SYSTEM_PROGRAMS))


def lenient_json(text: str):
    """JSON, or a Python-style literal (single quotes, True/None) where that is unambiguous. Too deep a nesting is
    a ValueError like any other unreadable text."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        problem = exc if isinstance(exc, ValueError) else "it is nested too deeply"
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise ValueError(str(problem)) from None
    if isinstance(value, (dict, list, str)):
        return value
    raise ValueError(str(problem))


# --- JSON as far as it came: a reply's object or a tool call's arguments, streaming in -----------------------------
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}


def json_string_so_far(text: str, start: int) -> tuple[str, bool]:
    """The JSON string beginning at `start` (just after its quote), as far as it came; whether it ended. An escape
    cut in the middle is left out until the rest of it comes."""
    out, i = [], start
    while i < len(text):
        char = text[i]
        if char == '"':
            return _whole(out), True
        if char != "\\":
            out.append(char)
            i += 1
            continue
        if i + 1 >= len(text):
            break
        escaped = text[i + 1]
        if escaped == "u":
            if i + 6 > len(text):
                break
            with contextlib.suppress(ValueError):
                out.append(chr(int(text[i + 2:i + 6], 16)))
            i += 6
            continue
        out.append(_ESCAPES.get(escaped, escaped))
        i += 2
    return _whole(out), False


def _whole(chars: list[str]) -> str:
    """Characters from JSON escapes, a surrogate pair joined (a lone half becomes U+FFFD)."""
    return "".join(chars).encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def call_arguments(command: Command, values) -> tuple[dict, dict | None]:
    """A JSON reply's arguments, leniently: under their own names; or, when none is, the text form under "arg" (the
    older json format) or in the only value given, whatever its name. Returns the arguments as the command takes
    them and the object as the model sent it (None when it strayed from the parameters' names: the history then
    shows the call in the standard form, which teaches it)."""
    if not isinstance(values, dict):
        return command.parse(values if isinstance(values, str) else _as_text(values)), None
    if not {p.name for p in command.parameters} & values.keys():
        loose = values.get("arg", next(iter(values.values())) if len(values) == 1 else None)
        if loose is not None:
            return command.parse(loose if isinstance(loose, str) else _as_text(loose)), None
    return command.arguments(values), values


def _as_text(value) -> str:
    return json.dumps(value, ensure_ascii=False)
