"""The json format: one JSON object per reply, `{"thought", "command", "args"}`, with the command's arguments by
name. Where the endpoint supports structured outputs the schema goes with the request; replies are read leniently
(a code fence or prose around the object, single quotes, the older `"arg"` text)."""

from __future__ import annotations

import functools
import json
import re

from ..commands import Command
from . import EXAMPLE, Decision, MalformedReply, Partial, ReplyFormat, call_arguments, json_string_so_far, lenient_json

_ARG_SO_FAR = re.compile(r'"args?"\s*:\s*(?:\{\s*"[^"\\]*"\s*:\s*)?"')  # the first argument's string value


def action_object(thought: str, command: str, args: dict) -> str:
    return json.dumps({"thought": thought, "command": command, "args": args}, ensure_ascii=False)


class JsonFormat(ReplyFormat):
    name = "json"
    how = ("Reply with exactly one JSON object and nothing else, for example:\n"
           + action_object(EXAMPLE.fix[0], EXAMPLE.fix[1], {"command_line": EXAMPLE.fix[2]}))

    def request(self) -> dict:
        return self._request

    @functools.cached_property
    def _request(self) -> dict:  # a format's commands do not change: built once, not every step
        actions = self.commands.actions()
        schema = {"type": "object",
                  "properties": {"thought": {"type": "string"},
                                 "command": {"type": "string", "enum": [c.name for c in actions]},
                                 "args": {"anyOf": [c.schema() for c in actions]}},
                  "required": ["thought", "command", "args"], "additionalProperties": False}
        # the first the endpoint takes is used (remembered for the run): OpenAI/vLLM/Ollama json_schema,
        # llama.cpp's json_object with a schema, plain JSON mode; else plain text, read leniently
        return {"response_format": [
            {"type": "json_schema", "json_schema": {"name": "action", "strict": True, "schema": schema}},
            {"type": "json_object", "schema": schema},
            {"type": "json_object"}]}

    def read(self, completion) -> Decision:
        text = completion.text.strip()
        if not text:
            raise MalformedReply("it was empty", completion.text, self.how)
        try:
            values = lenient_json(_object_in(text))
        except ValueError as exc:
            raise MalformedReply(f"no JSON object could be read from it ({exc})", completion.text, self.how) from None
        if not isinstance(values, dict) or not isinstance(values.get("command"), str):
            raise MalformedReply('the object has no "command" string', completion.text, self.how)
        command = self.command_named(values["command"], completion.text)
        # the arguments under "args"; or, from a model that strays, beside the command or as the older "arg" text
        args = values.get("args", {k: v for k, v in values.items() if k not in ("thought", "command")})
        args, given = call_arguments(command, args)
        return Decision(str(values.get("thought", "")).strip(), command, args, given=given)

    def partial(self, text: str, tool: str = "", arguments: str = "") -> Partial:
        """The object's "thought", its "command" once that string is closed, and the first argument's string so
        far, JSON escapes read; none of the object's syntax. Prose or a fence before the object is not shown."""
        start = text.find("{")
        if start < 0:
            return Partial()
        body = text[start:]

        def value(key: str) -> tuple[str, bool]:
            found = re.search(rf'"{key}"\s*:\s*"', body)
            return json_string_so_far(body, found.end()) if found else ("", False)

        thought, _ = value("thought")
        command, named = value("command")
        arg = _ARG_SO_FAR.search(body)
        return Partial(thought.strip(), command if named else None,
                       json_string_so_far(body, arg.end())[0] if arg else "")

    def reply(self, record) -> dict:
        args = self.shown_arguments(record)
        return {"role": "assistant", "content": action_object(record.thought, record.command, args)}

    def usage(self, command: Command) -> str:
        return f"Write it as: {action_object('…', command.name, command.placeholders())}"

    def describe(self) -> str:
        commands = "\n".join(f"- {c.signature(returns=False)}: {c.doc}" for c in self.commands.actions())
        first = action_object(EXAMPLE.thought, "execute_python", {"code": EXAMPLE.code})
        last = action_object(EXAMPLE.last_thought, "done", {"answer": EXAMPLE.answer})
        return f"""Reply with ONE action: one JSON object, nothing else:
{{"thought": "your reasoning, briefly", "command": "a command's name", "args": {{its arguments by name}}}}

Commands:
{commands}

Example, for another objective ("{EXAMPLE.objective}"). Your reply:
{first}
The next message: Observation (step 1): {EXAMPLE.result}
Your next reply:
{last}

When the objective is achieved, reply with done."""


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


FORMAT = JsonFormat()
