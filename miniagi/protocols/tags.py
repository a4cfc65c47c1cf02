"""The tags format, `<r>thought</r><c>command</c>argument`, read leniently the way real models answer: prose
around the action, the whole reply in a code fence, the argument in a ```python fence, odd whitespace and tag case.
A command of several arguments takes them joined with "|" (its `Command.text`: the only format that joins them)."""

from __future__ import annotations

import re
import textwrap

from ..commands import Command
from . import EXAMPLE, Decision, MalformedReply, Partial, ReplyFormat

__all__ = ["FORMAT"]

_WHOLE_FENCE = re.compile(r"\A```[\w+.-]*[ \t]*\n(?P<body>.*)\n[ \t]*```\Z", re.S)
_COMMAND = re.compile(r"<c>\s*(?P<name>[A-Za-z_][\w-]*)\s*</c>", re.I)
_COMMAND_UNCLOSED = re.compile(r"<c>[ \t]*(?P<name>[A-Za-z_][\w-]*)[ \t]*(?:\n|\Z)", re.I)
_THOUGHT = re.compile(r"<r>(?P<thought>.*?)(?:</r>|\Z)", re.S | re.I)
_NEXT_ACTION = re.compile(r"<r>|<c>\s*[A-Za-z_][\w-]*\s*</c>", re.I)
_ARG_FENCE = re.compile(r"\A```[\w+.-]*[ \t]*\n?(?P<body>.*?)(?:\n[ \t]*```|```)", re.S)
_STRAY_TAGS = re.compile(r"</?[rc]>", re.I)
# a reply as far as it came: a tag whose end has not come yet, a command named whole (its line ended)
_TAG_CUT = re.compile(r"<(?:/?[rc]?)\Z", re.I)
_COMMAND_SO_FAR = re.compile(r"<c>\s*(?P<name>[A-Za-z_][\w-]*)\s*(?:</c>|\n)", re.I)


def action_text(thought: str, command: str, arg: str) -> str:
    return f"<r>{thought}</r><c>{command}</c>\n{arg}"


HOW = ("Reply with exactly one action: your reasoning in <r>…</r>, a command name in <c>…</c>, then its argument. "
       f"For example:\n{action_text(*EXAMPLE.fix)}")


def parse_reply(reply: str, reply_format: ReplyFormat | None = None) -> Decision:
    """The action of a reply, among the commands of `reply_format` (the built-in ones when none is given)."""
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
    command = (reply_format or FORMAT).command_named(found.group("name"), reply)
    return Decision(thought, command, command.parse(clean_argument(rest)), note)


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
        return parse_reply(completion.text, self)

    def partial(self, text: str, tool: str = "", arguments: str = "") -> Partial:
        """The thought inside <r> (or before <c>), the command once its tag or line is closed, the argument after
        it without a code fence: no tag, and no half of one still coming, is in what it returns."""
        body = text.lstrip()
        if body.startswith("```"):  # the whole reply in a fence
            body = body.partition("\n")[2]
        found = _COMMAND_SO_FAR.search(body)
        before, rest = (body[:found.start()], body[found.end():]) if found else (body, "")
        before = re.split(r"<c>", before, maxsplit=1, flags=re.I)[0]
        thought = _THOUGHT.search(before)
        thought = thought.group("thought") if thought else _STRAY_TAGS.sub("", before)
        if not found:
            return Partial(_TAG_CUT.sub("", re.split(r"</r>", thought, maxsplit=1, flags=re.I)[0]).strip())
        arg = rest.lstrip(" \t").removeprefix("\n")
        if arg.lstrip().startswith("```"):
            arg = arg.lstrip().partition("\n")[2] if "\n" in arg else ""
        arg = "\n".join(line for line in arg.split("\n") if not line.lstrip().startswith("```"))
        return Partial(thought.strip(), found.group("name"), arg)

    def reply(self, record) -> dict:
        return {"role": "assistant", "content": action_text(record.thought, record.command, record.arg)}

    def usage(self, command: Command) -> str:
        return f"Write it as: <c>{command.name}</c>\n{command.help_argument()}"

    def describe(self) -> str:
        commands = "\n".join(f"- {c.name} {c.help_argument()}: {c.doc}"
                             for c in self.commands.actions())
        return f"""Reply with exactly ONE action:
<r>your reasoning, briefly</r><c>command</c>
its argument (it may span lines; code needs no fence)

Commands:
{commands}

Example, for another objective ("{EXAMPLE.objective}"). Your reply:
{action_text(EXAMPLE.thought, "execute_python", EXAMPLE.code)}
The next message: Observation (step 1): {EXAMPLE.result}
Your next reply:
{action_text(EXAMPLE.last_thought, "done", EXAMPLE.answer)}

When the objective is achieved, reply with done and the complete final answer."""


FORMAT = TagsFormat()
