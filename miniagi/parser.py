"""Reading `<r>thought</r><c>command</c>argument` out of a model reply, leniently, the way real models answer:
prose around the action, the whole reply in a code fence, the argument in a ```python fence, odd whitespace and
tag case. A reply that cannot be read raises FormatError, whose message is what the model is told.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass

_WHOLE_FENCE = re.compile(r"\A```[\w+.-]*[ \t]*\n(?P<body>.*)\n[ \t]*```\Z", re.S)
_COMMAND = re.compile(r"<c>\s*(?P<name>[A-Za-z_][\w-]*)\s*</c>", re.I)
_COMMAND_UNCLOSED = re.compile(r"<c>[ \t]*(?P<name>[A-Za-z_][\w-]*)[ \t]*(?:\n|\Z)", re.I)
_THOUGHT = re.compile(r"<r>(?P<thought>.*?)(?:</r>|\Z)", re.S | re.I)
_NEXT_ACTION = re.compile(r"<r>|<c>\s*[A-Za-z_][\w-]*\s*</c>", re.I)
_ARG_FENCE = re.compile(r"\A```[\w+.-]*[ \t]*\n?(?P<body>.*?)(?:\n[ \t]*```|```)", re.S)
_STRAY_TAGS = re.compile(r"</?[rc]>", re.I)


@dataclass(frozen=True)
class Action:
    thought: str
    command: str
    arg: str
    note: str = ""  # something the model should be told about how its reply was read


# a filled-in action, not a placeholder a model could copy as a command, and not a plausible first step
EXAMPLE = "<r>I want to know which Python version is installed.</r><c>execute_shell</c>\npython3 --version"
HOW = ("Reply with exactly one action: your reasoning in <r>…</r>, a command name in <c>…</c>, then its argument. "
       f"For example:\n{EXAMPLE}")


class FormatError(Exception):
    """A reply that holds no usable action. str(error) is the observation the model gets: the problem and how to
    reply (the reply itself is in the context already: it is not quoted back)."""

    def __init__(self, problem: str, reply: str, how: str = HOW):
        self.problem = problem
        self.reply = reply
        super().__init__(f"Your reply could not be used: {problem}.\n{how}")


def parse_reply(reply: str) -> Action:
    text = (reply or "").strip()
    if not text:
        raise FormatError("it was empty", reply or "")
    whole = _WHOLE_FENCE.match(text)
    if whole and _COMMAND.search(whole.group("body")):
        text = whole.group("body").strip()

    found = _COMMAND.search(text) or _COMMAND_UNCLOSED.search(text)
    if not found:
        problem = ("it has <r>…</r> but no command tag <c>…</c>" if "<r>" in text.lower()
                   else "no command tag <c>…</c> was found")
        raise FormatError(problem, reply)

    before, rest = text[:found.start()], text[found.end():]
    line_before = before.rsplit("\n", 1)[-1].rstrip()
    line_after = rest.split("\n", 1)[0].strip()
    if line_before and line_after and line_before[-1] not in ">:" and "<r>" not in before.lower():
        raise FormatError("the <c>…</c> tag was inside a sentence, so it is unclear what to run. Put the command "
                          "tag after your reasoning and the argument after the tag", reply)
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
    command = found.group("name").lower().replace("-", "_")
    return Action(thought=thought, command=command, arg=clean_argument(rest), note=note)


def clean_argument(text: str) -> str:
    """Strip blank lines, common indentation and a surrounding code fence with its language tag; prose after the
    fence is dropped, and a fence the model never closed is still removed."""
    arg = text.strip("\n").rstrip()
    if arg.lstrip().startswith("```"):
        arg = arg.lstrip()
        fenced = _ARG_FENCE.match(arg)
        arg = fenced.group("body") if fenced else arg.partition("\n")[2]
    return textwrap.dedent(arg.strip("\n")).strip()
