"""The tools format: native tool calls. Each command is a tool whose parameters are the command's own, typed; a step
is shown back as an assistant tool call and a tool message with the same id."""

from __future__ import annotations

import functools
import json
import re

from ..commands import Command
from . import (
    EXAMPLE,
    Decision,
    MalformedReply,
    Partial,
    ReplyFormat,
    call_arguments,
    json_string_so_far,
    lenient_json,
    observation_text,
)

_FIRST_VALUE = re.compile(r'\A\s*\{\s*"[^"\\]*"\s*:\s*"')  # a call's arguments, up to its first string value


def call_text(name: str, args: dict) -> str:
    return f"{name} with {json.dumps(args, ensure_ascii=False)}"


class ToolsFormat(ReplyFormat):
    name = "tools"
    how = f"Call exactly one tool per reply; for example, to finish: call {call_text('done', {'answer': '…'})}."

    def request(self) -> dict:
        return self._request

    @functools.cached_property
    def _request(self) -> dict:  # a format's commands do not change: built once, not every step
        return {"tools": [{"type": "function", "function": {"name": c.name, "description": c.doc,
                                                            "parameters": c.schema()}}
                          for c in self.commands.actions()]}

    def read(self, completion) -> Decision:
        calls = completion.tool_calls
        if not calls:
            raise MalformedReply("it called no tool", completion.text, self.how)
        call = calls[0]
        command = self.command_named(call.name, self.raw_reply(completion))
        name = command.name
        try:
            values = lenient_json(call.arguments.strip() or "{}")
        except ValueError as exc:
            raise MalformedReply(f"the arguments of your call to {name} are not valid JSON ({exc}); send them as a "
                                 f"JSON object, e.g. {json.dumps(command.placeholders(), ensure_ascii=False)}",
                                 self.raw_reply(completion), self.how) from None
        note = ""
        if len(calls) > 1:
            note = (f"Your reply held {len(calls)} tool calls; only the first ({name}) was run. Call one tool per "
                    "reply and wait for its result.")
        args, given = call_arguments(command, values)
        return Decision(completion.text.strip(), command, args, note, given)

    def partial(self, text: str, tool: str = "", arguments: str = "") -> Partial:
        """The message text as the thought; the tool's name once a call begins, and its first string argument so
        far (the arguments object's syntax is not shown)."""
        start = _FIRST_VALUE.match(arguments) if tool else None
        return Partial(text.strip(), tool or None, json_string_so_far(arguments, start.end())[0] if start else "")

    def reply(self, record) -> dict:
        args = self.shown_arguments(record)
        return {"role": "assistant", "content": record.thought or None,
                "tool_calls": [{"id": f"call_{record.step}", "type": "function",
                                "function": {"name": record.command,
                                             "arguments": json.dumps(args, ensure_ascii=False)}}]}

    def render(self, record) -> list[dict]:
        if not record.command:
            return record.messages()
        return [self.reply(record),
                {"role": "tool", "tool_call_id": f"call_{record.step}", "content": observation_text(record)}]

    def usage(self, command: Command) -> str:
        return f"Call {call_text(command.name, command.placeholders())}."

    def describe(self) -> str:
        return (f"Act by calling exactly ONE tool per reply, with your reasoning, briefly, as the message text. The "
                f"tool's result comes back as the next message, before your next step.\n\nExample, for another "
                f"objective (\"{EXAMPLE.objective}\"): you call {call_text('execute_python', {'code': EXAMPLE.code})}; "
                f"the tool's message says: Observation (step 1): {EXAMPLE.result}; you call "
                f"{call_text('done', {'answer': EXAMPLE.answer})}.\n\n"
                "When the objective is achieved, call done with answer: the complete final answer.")

    def raw_reply(self, completion) -> str:
        calls = "".join(f"\n[tool call {c.name}({c.arguments})]" for c in completion.tool_calls)
        return (completion.text + calls).strip()


FORMAT = ToolsFormat()
