"""The tags format, `<r>thought</r><c>command</c>argument`, read leniently the way real models answer: prose
around the action, the whole reply in a code fence, the argument in a ```python fence, odd whitespace and tag case.
A command of several arguments takes them joined with "|" (the only format that joins them)."""

from __future__ import annotations

import re
import textwrap

from ..commands import COMMANDS, Command, actions
from . import (EXAMPLE_ANSWER, EXAMPLE_CODE, EXAMPLE_FIX, EXAMPLE_LAST_THOUGHT, EXAMPLE_OBJECTIVE, EXAMPLE_RESULT,
               EXAMPLE_THOUGHT, Decision, MalformedReply, ReplyFormat, check_command)

_WHOLE_FENCE = re.compile(r"\A```[\w+.-]*[ \t]*\n(?P<body>.*)\n[ \t]*```\Z", re.S)
_COMMAND = re.compile(r"<c>\s*(?P<name>[A-Za-z_][\w-]*)\s*</c>", re.I)
_COMMAND_UNCLOSED = re.compile(r"<c>[ \t]*(?P<name>[A-Za-z_][\w-]*)[ \t]*(?:\n|\Z)", re.I)
_THOUGHT = re.compile(r"<r>(?P<thought>.*?)(?:</r>|\Z)", re.S | re.I)
_NEXT_ACTION = re.compile(r"<r>|<c>\s*[A-Za-z_][\w-]*\s*</c>", re.I)
_ARG_FENCE = re.compile(r"\A```[\w+.-]*[ \t]*\n?(?P<body>.*?)(?:\n[ \t]*```|```)", re.S)
_STRAY_TAGS = re.compile(r"</?[rc]>", re.I)
_ITEM = re.compile(r"\S*[./:\d]\S*")  # a list item in the text form: a path, a URL, a result number


# --- the text form of a command's arguments: the only place where they are joined with "|" ------------------------
def join_args(command: Command, args: dict) -> str:
    """The arguments as one text, joined with "|" (a list's items each after its own |)."""
    if command.json_argument:  # one JSON object (an MCP tool's)
        return command.text(args)
    parts = []
    for parameter in command.parameters:
        value = args.get(parameter.name)
        if value is not None:
            parts.extend(value if isinstance(value, list) else [value])
    return "|".join(str(part) for part in parts)


def split_args(command: Command, text: str) -> dict:
    """The arguments of a text form. One parameter takes the whole text. Several are split at "|": a closing list
    takes the trailing parts that look like paths, URLs or result numbers (at least the last part), and the first
    parameter takes whatever is left over, so it may itself contain a "|"."""
    if command.json_argument:
        return command.parse(text)
    text = text.strip()
    if not text or not command.parameters:
        return {}
    if len(command.parameters) == 1:
        return {command.parameters[0].name: command.parameters[0].value(text)}
    parts = [part.strip() for part in text.split("|")]
    *leading, last = command.parameters
    tail: list[str] = []
    if len(parts) > len(leading):
        tail.append(parts.pop())
        while last.is_list and len(parts) > len(leading) and _ITEM.fullmatch(parts[-1]):
            tail.insert(0, parts.pop())
    extra = max(0, len(parts) - len(leading))
    values = ["|".join(parts[:extra + 1]), *parts[extra + 1:]]
    args = {p.name: value for p, value in zip(leading, values) if value}
    if tail:
        args[last.name] = tail if last.is_list else tail[0]
    return args


def placeholders(command: Command) -> str:
    """How the tags help names the arguments: QUESTION|SOURCE[|…] (a list's items each after its own |)."""
    if command.json_argument:  # {"repo_path": "…"} (optional: max_count)
        return command.help_argument()
    return "|".join(f"{p.name.upper().removesuffix('S')}[|…]" if p.is_list else p.name.upper()
                    for p in command.parameters)


def action_text(thought: str, command: str, arg: str) -> str:
    return f"<r>{thought}</r><c>{command}</c>\n{arg}"


HOW = ("Reply with exactly one action: your reasoning in <r>…</r>, a command name in <c>…</c>, then its argument. "
       f"For example:\n{action_text(*EXAMPLE_FIX)}")


def parse_reply(reply: str) -> Decision:
    text = (reply or "").strip()
    if not text:
        raise MalformedReply("it was empty", reply or "", HOW)
    whole = _WHOLE_FENCE.match(text)
    if whole and _COMMAND.search(whole.group("body")):
        text = whole.group("body").strip()

    found = _COMMAND.search(text) or _COMMAND_UNCLOSED.search(text)
    if not found:
        problem = ("it has <r>…</r> but no command tag <c>…</c>" if "<r>" in text.lower()
                   else "no command tag <c>…</c> was found")
        raise MalformedReply(problem, reply, HOW)

    before, rest = text[:found.start()], text[found.end():]
    line_before = before.rsplit("\n", 1)[-1].rstrip()
    line_after = rest.split("\n", 1)[0].strip()
    if line_before and line_after and line_before[-1] not in ">:" and "<r>" not in before.lower():
        raise MalformedReply("the <c>…</c> tag was inside a sentence, so it is unclear what to run. Put the command "
                             "tag after your reasoning and the argument after the tag", reply, HOW)
    thought_match = _THOUGHT.search(before)
    thought = (thought_match.group("thought") if thought_match else _STRAY_TAGS.sub("", before)).strip()
    reversed_thought = re.match(r"\s*<r>(?P<thought>.*?)</r>", rest, re.S | re.I)
    if reversed_thought and not thought:  # <c>command</c><r>thought</r>argument
        thought, rest = reversed_thought.group("thought").strip(), rest[reversed_thought.end():]

    note = ""
    following = _NEXT_ACTION.search(rest)
    if following:
        rest = rest[:following.start()]
        note = ("Your reply held more than one action; only the first was run. "
                "Send exactly one action per reply and wait for its result.")
    command = check_command(found.group("name"), reply, HOW)
    return Decision(thought, command, split_args(COMMANDS[command], clean_argument(rest)), note)


def clean_argument(text: str) -> str:
    """Strip blank lines, common indentation and a surrounding code fence with its language tag; prose after the
    fence is dropped, and a fence the model never closed is still removed."""
    arg = text.strip("\n").rstrip()
    if arg.lstrip().startswith("```"):
        arg = arg.lstrip()
        fenced = _ARG_FENCE.match(arg)
        arg = fenced.group("body") if fenced else arg.partition("\n")[2]
    return textwrap.dedent(arg.strip("\n")).strip()


class TagsFormat(ReplyFormat):
    name = "tags"
    how = HOW
    # where a reply should end: a second action, or an observation the model goes on to invent
    stop = ("\nObservation", "\nobservation:", "Observation (step", "\n<r>")

    def read(self, completion) -> Decision:
        return parse_reply(completion.text)

    def reply(self, record) -> dict:
        return {"role": "assistant", "content": action_text(record.thought, record.command, record.arg)}

    def usage(self, command: Command) -> str:
        return f"Write it as: <c>{command.name}</c>\n{placeholders(command)}"

    def describe(self) -> str:
        commands = "\n".join(f"- {c.name} {placeholders(c)}: {c.doc}"
                             for c in actions())
        return f"""Reply with exactly ONE action:
<r>your reasoning, briefly</r><c>command</c>
its argument (it may span lines; code needs no fence)

Commands:
{commands}

Example, for another objective ("{EXAMPLE_OBJECTIVE}"). Your reply:
{action_text(EXAMPLE_THOUGHT, "execute_python", EXAMPLE_CODE)}
The next message: Observation (step 1): {EXAMPLE_RESULT}
Your next reply:
{action_text(EXAMPLE_LAST_THOUGHT, "done", EXAMPLE_ANSWER)}

When the objective is achieved, reply with done and the complete final answer."""


FORMAT = TagsFormat()
