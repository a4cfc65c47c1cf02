"""Each reply format reads its own partial reply (`ReplyFormat.partial`), and the terminal, the web page and recall's
look-ahead all read that: for every prefix of a reply, what a person is shown is a prefix of the thought and of the
argument the whole reply holds, never a piece of the format's markup. Adding a format is one file: a test adds one."""

from __future__ import annotations

import json
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from miniagi.commands import COMMANDS
from miniagi.protocols import Partial, formats
from miniagi.protocols.json_object import action_object
from miniagi.protocols.tags import action_text

from .conftest import run_dirs
from .test_ui import wait_for

# text a model writes: no '>' (so no tag can form by chance inside a thought, which no reader could tell apart), no
# backquote (a ``` line in an argument is a fence, dropped), but '<', quotes, backslashes and non-ASCII do occur
TEXT = st.text(alphabet=string.ascii_letters + string.digits + " \n\t<=.,:;'\"\\/éü✓", max_size=60)
COMMAND = st.sampled_from(["execute_python", "execute_shell", "done", "talk_to_user"])
MARKUP = ("<r>", "</r>", "<c>", "</c>", '{"thought"', '"command"', '"args"')


def _is_prefix(shown: str, whole: str) -> bool:
    return whole.strip().startswith(shown.strip())


def _shown_prefixes(reply_format, pieces: list[str], thought: str, command: str, arg: str) -> None:
    reading = reply_format.reading()
    for piece in pieces:
        reading.feed(piece)
        so_far = reading.partial()
        assert isinstance(so_far, Partial)
        assert _is_prefix(so_far.thought, thought), (so_far, thought)
        assert so_far.command in (None, command)
        assert _is_prefix(so_far.arg, arg), (so_far, arg)
        for mark in MARKUP:
            assert mark in thought or mark not in so_far.thought
            assert mark in arg or mark not in so_far.arg
    whole = reading.partial()
    assert (whole.command, whole.thought.strip(), whole.arg.strip()) == (command, thought.strip(), arg.strip())


def _cuts(text: str, data) -> list[str]:
    """The text in pieces as a stream delivers it: cut anywhere, a character at a time in places."""
    points = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=12)) | {len(text)})
    pieces, start = [], 0
    for point in points:
        pieces.append(text[start:point])
        start = point
    return [p for p in pieces if p]


@settings(max_examples=150, deadline=None)
@given(thought=TEXT, command=COMMAND, arg=TEXT, data=st.data())
def test_a_tags_reply_streaming_in_shows_only_its_thought_command_and_argument(thought, command, arg, data):
    thought, arg = thought.strip() or "t", arg.strip()
    text = action_text(thought, command, arg)
    _shown_prefixes(formats()["tags"], _cuts(text, data), thought, command, arg)


@settings(max_examples=150, deadline=None)
@given(thought=TEXT, command=COMMAND, arg=TEXT, data=st.data())
def test_a_json_reply_streaming_in_shows_only_its_thought_command_and_argument(thought, command, arg, data):
    parameter = COMMANDS[command].parameters[0].name
    text = action_object(thought, command, {parameter: arg})
    _shown_prefixes(formats()["json"], _cuts(text, data), thought, command, arg)


@settings(max_examples=150, deadline=None)
@given(thought=TEXT, command=COMMAND, arg=TEXT, data=st.data())
def test_a_tool_call_streaming_in_shows_only_its_thought_command_and_argument(thought, command, arg, data):
    from miniagi.sdk_client import CallPiece

    parameter = COMMANDS[command].parameters[0].name
    arguments = json.dumps({parameter: arg}, ensure_ascii=data.draw(st.booleans()))
    pieces = _cuts(thought, data) + [CallPiece(p, command) for p in _cuts(arguments, data)]
    _shown_prefixes(formats()["tools"], pieces, thought, command, arg)


def test_what_real_models_write_around_an_action_is_not_shown():
    tags, as_json = formats()["tags"], formats()["json"]
    assert tags.partial("```\n<r>Look first</r><c>execute_shell</c>\n```bash\nls -la\n") == \
        Partial("Look first", "execute_shell", "ls -la\n")
    assert tags.partial("<R>Half a tag coming</") == Partial("Half a tag coming")
    assert tags.partial("<r>Sure</r><c>exec") == Partial("Sure")  # the command is not named whole yet
    assert as_json.partial('Here it is:\n```json\n{"thought": "a \\"quoted\\" word\\n", "comm') == \
        Partial('a "quoted" word')
    assert as_json.partial('{"thought": "x", "command": "done", "args": {"answer": "4\\u00') == \
        Partial("x", "done", "4")  # an escape cut in the middle waits for the rest


LINES_FORMAT = '''\
"""The lines format: THOUGHT:, COMMAND: and ARG: lines. A test's format, to show that adding one is one file."""

from miniagi.protocols import Decision, MalformedReply, Partial, ReplyFormat


def _fields(text: str) -> dict:
    fields, key = {}, None
    for line in text.split("\\n"):
        head, colon, rest = line.partition(":")
        if colon and head in ("THOUGHT", "COMMAND", "ARG"):
            key, fields[head] = head, rest.strip()
        elif key is not None:
            fields[key] += "\\n" + line
    return fields


class LinesFormat(ReplyFormat):
    name = "lines"
    how = "Reply with THOUGHT: your reasoning, COMMAND: a command, ARG: its argument, each on its own line."

    def read(self, completion) -> Decision:
        fields = _fields(completion.text)
        if "COMMAND" not in fields:
            raise MalformedReply("there is no COMMAND: line", completion.text, self.how)
        command = self.command_named(fields["COMMAND"], completion.text)
        return Decision(fields.get("THOUGHT", ""), command, command.parse(fields.get("ARG", "")))

    def partial(self, text: str, tool: str = "", arguments: str = "") -> Partial:
        fields = _fields(text)
        named = "COMMAND" in fields and "ARG:" in text
        return Partial(fields.get("THOUGHT", ""), fields["COMMAND"] if named else None, fields.get("ARG", ""))

    def reply(self, record) -> dict:
        return {"role": "assistant", "content": f"THOUGHT: {record.thought}\\nCOMMAND: {record.command}\\n"
                                                f"ARG: {record.arg}"}

    def usage(self, command) -> str:
        return f"Write it as: COMMAND: {command.name} then ARG: its argument"

    def describe(self) -> str:
        names = "\\n".join(f"- {c.name}: {c.doc}" for c in self.commands.actions())
        return f"{self.how}\\n\\nCommands:\\n{names}\\n\\nWhen the objective is achieved, COMMAND: done."


FORMAT = LinesFormat()
'''


@pytest.fixture
def lines_format(tmp_path, monkeypatch):
    """One file, in a folder the protocols package reads its formats from: nothing else is added anywhere."""
    import miniagi.protocols as protocols

    folder = tmp_path / "more_formats"
    folder.mkdir()
    (folder / "lines.py").write_text(LINES_FORMAT)
    monkeypatch.setattr(protocols, "__path__", [*protocols.__path__, str(folder)])
    formats.cache_clear()
    yield formats()["lines"]
    formats.cache_clear()


def test_adding_a_reply_format_is_one_file(lines_format, cli, llm, isolated, tmp_path):
    from miniagi.webui.control import Channel, ControlledTerminal

    llm.add("THOUGHT: count the files\nCOMMAND: execute_shell\nARG: echo three-files",
            "THOUGHT: that is it\nCOMMAND: done\nARG: There are three.")
    done = cli("--protocol", "lines", "-y", "count the files")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "There are three."
    system = llm.agent_requests()[0]["messages"][0]["content"]
    assert "THOUGHT: your reasoning" in system  # the system prompt describes the new format
    assert "ARG: echo three-files" in json.dumps(llm.agent_requests()[1]["messages"])  # its history too
    (run,) = run_dirs(isolated.home)
    assert "three-files" in (run / "trace.jsonl").read_text()

    # the web page reads a reply streaming in as the new format does
    channel_dir = tmp_path / "channel"
    channel_dir.mkdir()
    terminal = ControlledTerminal(Channel(channel_dir))
    terminal.reply_format = lines_format
    with terminal.receiving("agent") as on_piece:
        on_piece("THOUGHT: list them\nCOMMAND: execute_shell\nARG: ls -")
        shown = wait_for(lambda: Channel(channel_dir).streaming(), "the page is told the reply so far")
    assert shown["thought"] == "list them" and shown["command"] == "execute_shell" and shown["arg"] == "ls -"
    assert Channel(channel_dir).streaming() is None  # gone once the reply has come
