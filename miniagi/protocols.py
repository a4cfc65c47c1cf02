"""How a reply carries its action — three protocols over one loop:

- tags   `<r>thought</r><c>command</c>argument`, the MiniAGI format: works with any model, even a base model;
- tools  native tool calls (OpenAI function calling; vLLM, Ollama, llama.cpp server with tool-capable models): what
         modern chat models are trained for. The command table becomes the request's `tools`;
- json   one JSON object `{"thought", "command", "arg"}`; where the endpoint supports structured outputs, the
         action's schema (command names as an enum) is sent, so a constrained decoder cannot produce a bad action.

A protocol says how to ask (`request`), how to read a reply (`read`, raising FormatError) and how a step is shown
back in the history (`render`: in its own standard form, which teaches the format to a model that strays).
"""

from __future__ import annotations

import ast
import difflib
import functools
import inspect
import json
import subprocess

from memory.context import StepRecord

from .commands import COMMANDS, Command
from .model import Completion
from .parser import HOW, Action, FormatError, parse_reply

EXAMPLE_OBJECTIVE = "How many days are there between 2024-03-01 and 2024-12-25?"
EXAMPLE_CODE = "from datetime import date\n(date(2024, 12, 25) - date(2024, 3, 1)).days"
EXAMPLE_RESULT = "299"
EXAMPLE_ANSWER = "There are 299 days between 2024-03-01 and 2024-12-25."


@functools.cache
def parameter(command: Command) -> str:
    """The name of a command's argument: its function's own name for it (code, query, answer…)."""
    names = list(inspect.signature(command.run).parameters)
    return names[1] if len(names) > 1 else "arg"


def check_command(name: str, reply: str, how: str) -> str:
    """The command's canonical name; a FormatError naming the closest command when there is no such command."""
    name = name.strip().lower().replace("-", "_")
    if name in COMMANDS:
        return name
    close = difflib.get_close_matches(name, COMMANDS, n=1, cutoff=0.6)
    hint = f" Did you mean {close[0]}?" if close else ""
    raise FormatError(f"{name!r} is not a command.{hint} The commands are: {', '.join(COMMANDS)}", reply, how)


def one_command_line(command: str, arg: str) -> tuple[str, str]:
    """execute_shell runs one command line. A multi-line argument runs its first line only — unless the lines form
    one command (a backslash continuation, a here-document, a loop or `if` block the first line cannot end) —
    and the model is told what was dropped."""
    if command != "execute_shell" or "\n" not in arg.strip():
        return arg, ""
    first, rest = arg.strip().split("\n", 1)
    if first.rstrip().endswith("\\") or "<<" in first or _incomplete(first):
        return arg, ""
    return first, (f"Note: execute_shell runs ONE command line; only the first line was run. Dropped: "
                   f"{len(rest.splitlines())} more line(s) beginning {rest.strip()[:80]!r}. To run a script, write "
                   "it to a file first or use execute_python.")


def _incomplete(line: str) -> bool:
    """Whether a shell line cannot stand alone (bash -n finds an unexpected end: an open loop, quote, block)."""
    try:
        check = subprocess.run(["bash", "-n", "-c", line], capture_output=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return check.returncode != 0


class Protocol:
    name = ""
    how = ""  # how to reply, told with every format error

    def request(self) -> dict:
        """What the protocol adds to the agent's request (tools, response_format)."""
        return {}

    def read(self, completion: Completion) -> Action:
        raise NotImplementedError

    def render(self, record: StepRecord) -> list[dict]:
        """A step as the history shows it: the reply in this protocol's standard form, then the observation."""
        return record.messages()

    def describe(self) -> str:
        """The system prompt's part on how to reply, with the commands and a complete tiny example run."""
        raise NotImplementedError

    def raw_reply(self, completion: Completion) -> str:
        """A reply that could not be used, as text (kept in the history with its format error)."""
        return completion.text


def command_list() -> str:
    return "\n".join(f"- {c.name}: {c.doc} Argument: {c.arg}." for c in COMMANDS.values())


class TagsProtocol(Protocol):
    name = "tags"
    how = HOW

    def read(self, completion: Completion) -> Action:
        action = parse_reply(completion.text)
        return Action(action.thought, check_command(action.command, completion.text, self.how), action.arg,
                      action.note)

    def describe(self) -> str:
        return f"""Each reply is exactly ONE action, in this form:

<r>your reasoning, briefly</r><c>a command's name</c>
its argument (may span many lines)

The commands:
{command_list()}

The argument starts right after </c>. Code needs no fence.

An example of a complete run, for another objective ("{EXAMPLE_OBJECTIVE}"):
<r>Python's datetime can count the days.</r><c>execute_python</c>
{EXAMPLE_CODE}
Observation (step 1):
{EXAMPLE_RESULT}
<r>The computation answers the question.</r><c>done</c>
{EXAMPLE_ANSWER}"""


class ToolsProtocol(Protocol):
    name = "tools"
    how = ("Call exactly one of the tools (functions) per reply, with its arguments as a JSON object; write your "
           "reasoning briefly in the message text. To finish, call done with the complete final answer.")

    @functools.cache  # the command table does not change during a run: built once, not every step
    def request(self) -> dict:
        return {"tools": [{"type": "function", "function": {
            "name": c.name, "description": c.doc,
            "parameters": {"type": "object", "properties": {parameter(c): {"type": "string", "description": c.arg}},
                           "required": [parameter(c)]}}} for c in COMMANDS.values()]}

    def read(self, completion: Completion) -> Action:
        calls = completion.tool_calls
        if not calls:
            raise FormatError("it called no tool: act by calling one of the tools (functions); to finish, call "
                              "done with the final answer", completion.text, self.how)
        call = calls[0]
        name = check_command(call.name, self.raw_reply(completion), self.how)
        arguments = call.arguments.strip() or "{}"
        try:
            values = lenient_json(arguments)
        except ValueError as exc:
            raise FormatError(f"the arguments of your call to {name} are not valid JSON ({exc}); send them as a "
                              f"JSON object, e.g. {{\"{parameter(COMMANDS[name])}\": \"…\"}}",
                              self.raw_reply(completion), self.how) from None
        arg = _argument(values, parameter(COMMANDS[name]))
        note = ""
        if len(calls) > 1:
            note = (f"Your reply held {len(calls)} tool calls; only the first ({name}) was run. Call one tool per "
                    "reply and wait for its result.")
        return Action(thought=completion.text.strip(), command=name, arg=arg, note=note)

    def render(self, record: StepRecord) -> list[dict]:
        if not record.command:
            return record.messages()
        call_id = f"call_{record.step}"
        arguments = json.dumps({parameter(COMMANDS[record.command]) if record.command in COMMANDS else "arg":
                                record.arg}, ensure_ascii=False)
        return [{"role": "assistant", "content": record.thought or None,
                 "tool_calls": [{"id": call_id, "type": "function",
                                 "function": {"name": record.command, "arguments": arguments}}]},
                {"role": "tool", "tool_call_id": call_id,
                 "content": f"Observation (step {record.step}):\n{record.observation}"}]

    def describe(self) -> str:
        return ("Act by calling exactly ONE of the tools (functions) per reply, with your reasoning, briefly, as the "
                "message text. The tool's result comes back before your next step; nothing else runs until then. "
                f"When the objective is achieved, call done with the complete final answer.\n\nAn example of a "
                f"complete run, for another objective (\"{EXAMPLE_OBJECTIVE}\"): call execute_python with "
                f"{{\"code\": {json.dumps(EXAMPLE_CODE)}}}, read the result ({EXAMPLE_RESULT}), then call done with "
                f"{{\"answer\": {json.dumps(EXAMPLE_ANSWER)}}}.")

    def raw_reply(self, completion: Completion) -> str:
        calls = "".join(f"\n[tool call {c.name}({c.arguments})]" for c in completion.tool_calls)
        return (completion.text + calls).strip()


class JsonProtocol(Protocol):
    name = "json"
    how = ('Reply with exactly one JSON object and nothing else, for example:\n{"thought": "I want to know which '
           'Python version is installed.", "command": "execute_shell", "arg": "python3 --version"}')

    @functools.cache
    def request(self) -> dict:
        schema = {"type": "object", "properties": {"thought": {"type": "string"},
                                                   "command": {"type": "string", "enum": list(COMMANDS)},
                                                   "arg": {"type": "string"}},
                  "required": ["thought", "command", "arg"], "additionalProperties": False}
        # the first the endpoint takes is used (remembered for the run): OpenAI/vLLM/Ollama json_schema,
        # llama.cpp's json_object with a schema, plain JSON mode; else plain text, read leniently
        return {"response_format": [
            {"type": "json_schema", "json_schema": {"name": "action", "strict": True, "schema": schema}},
            {"type": "json_object", "schema": schema},
            {"type": "json_object"}]}

    def read(self, completion: Completion) -> Action:
        text = completion.text.strip()
        if not text:
            raise FormatError("it was empty", completion.text, self.how)
        try:
            values = lenient_json(_object_in(text))
        except ValueError as exc:
            raise FormatError(f"no JSON object could be read from it ({exc})", completion.text, self.how) from None
        if not isinstance(values, dict) or not isinstance(values.get("command"), str):
            raise FormatError('the object has no "command" string', completion.text, self.how)
        name = check_command(values["command"], completion.text, self.how)
        arg = values.get("arg", values.get(parameter(COMMANDS[name]), ""))
        arg = arg if isinstance(arg, str) else json.dumps(arg, ensure_ascii=False)
        return Action(thought=str(values.get("thought", "")).strip(), command=name, arg=arg.strip())

    def render(self, record: StepRecord) -> list[dict]:
        if not record.command:
            return record.messages()
        reply = json.dumps({"thought": record.thought, "command": record.command, "arg": record.arg},
                           ensure_ascii=False)
        return [{"role": "assistant", "content": reply},
                {"role": "user", "content": f"Observation (step {record.step}):\n{record.observation}"}]

    def describe(self) -> str:
        first = json.dumps({"thought": "Python's datetime can count the days.", "command": "execute_python",
                            "arg": EXAMPLE_CODE})
        last = json.dumps({"thought": "The computation answers the question.", "command": "done",
                           "arg": EXAMPLE_ANSWER})
        return f"""Each reply is exactly ONE action: one JSON object and nothing else,
{{"thought": "your reasoning, briefly", "command": "a command name", "arg": "the command's argument, as a string"}}

The commands:
{command_list()}

An example of a complete run, for another objective ("{EXAMPLE_OBJECTIVE}"):
{first}
Observation (step 1):
{EXAMPLE_RESULT}
{last}"""


PROTOCOLS: dict[str, Protocol] = {p.name: p for p in (TagsProtocol(), ToolsProtocol(), JsonProtocol())}


def _argument(values, name: str) -> str:
    """The one string argument of a call: under its own name, or the only value given, or the text itself."""
    if isinstance(values, str):
        return values.strip()
    if isinstance(values, dict):
        value = values.get(name, values.get("arg"))
        if value is None and len(values) == 1:
            value = next(iter(values.values()))
        if value is None:
            return ""
        return (value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)).strip()
    return json.dumps(values, ensure_ascii=False)


def _object_in(text: str) -> str:
    """The first balanced {…} in a reply (after a code fence or prose), strings taken into account."""
    start = text.find("{")
    if start < 0:
        raise ValueError("there is no { in it")
    depth, quote, escaped = 0, "", False
    for i in range(start, len(text)):
        char = text[i]
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = ""
        elif char in "\"'":
            quote = char
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[start:i + 1]
    raise ValueError("the object is never closed")


def lenient_json(text: str):
    """JSON, or a Python-style literal (single quotes, True/None) where that is unambiguous."""
    try:
        return json.loads(text)
    except ValueError as exc:
        problem = exc
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise ValueError(str(problem)) from None
    if isinstance(value, (dict, list, str)):
        return value
    raise ValueError(str(problem))
