"""What a newcomer's terminal shows (a pseudo-terminal read through a terminal emulator): long lines wrapped under
their indent, `a` at the approval prompt, an MCP result without the model's framing, talk_to_user's question once,
no fragment of the thought above a step's header."""

from __future__ import annotations

import os
import re
import sys
import threading

import pyte
import pytest

from . import test_live_terminal
from .conftest import act
from .fake_llm import Stream
from .test_mcp import PROBE, real_servers, write_config

WORDS = " ".join(f"w{i}" for i in range(150))  # one line of ~800 characters: ten screen lines at 80 columns


terminal = test_live_terminal.terminal  # the fixture: miniagi on a pseudo-terminal read through an emulator


@pytest.fixture
def narrow(monkeypatch):
    """The terminal fixture's screen at 80 columns."""
    monkeypatch.setattr(test_live_terminal, "COLUMNS", 80)


def thought_rows(shown: str, first: str, last: str) -> list[str]:
    lines = shown.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith(first))
    end = next(i for i in range(start, len(lines)) if last in lines[i])
    return lines[start:end + 1]


@pytest.mark.parametrize("streamed", [True, False])
def test_a_long_thought_is_shown_whole_wrapped_under_its_indent(narrow, terminal, llm, streamed):
    thought = f"Start {WORDS} end of the first line.\nA second line."
    reply = act("execute_python", f"print('x' * 300)\nprint({WORDS.split()[0]!r})", thought=thought)
    # streamed: shown as it comes; else (no usage of streaming in the reply) shown when the step is known
    llm.add(Stream([reply[i:i + 7] for i in range(0, len(reply), 7)]) if streamed else reply, act("done", "ok"))
    screen = terminal("-y", "think long")
    assert screen.finish() == 0
    shown = screen.text()
    rows = thought_rows(shown, "  Start w0", "end of the first line.")
    assert len(rows) >= 9 and all(row.startswith("  ") and len(row) <= 80 for row in rows)
    assert " ".join(row.strip() for row in rows) == f"Start {WORDS} end of the first line."
    assert "  A second line." in shown.split("\n") and "…" not in "\n".join(rows)
    output = [line for line in shown.split("\n") if line.strip() and set(line.strip()) == {"x"}]
    assert sum(len(line.strip()) for line in output) == 300 and all(line.startswith("    ") for line in output)


def test_approval_a_runs_this_and_every_later_command_of_the_run(llm, isolated):
    from .test_interactive import run_in_terminal

    llm.add(act("execute_shell", "touch one.txt"), act("execute_python", "open('two.txt', 'w').close()"),
            act("execute_shell", "touch three.txt"), act("done", "three files"))
    proc = run_in_terminal(llm, isolated, "a\n", "make files", env=dict(
        os.environ, OPENAI_BASE_URL=llm.url, OPENAI_API_KEY="sk-test-key-123456", MINIAGI_MEMORY_SCOPE="off"))
    assert proc.returncode == 0, proc.stderr
    assert all((isolated.work / name).exists() for name in ("one.txt", "two.txt", "three.txt"))
    assert proc.stderr.count("Run it?") == 1 and "[a]ll" in proc.stderr
    assert "every later command of this run runs without asking" in proc.stderr
    # the commands not asked about are shown on their step's line instead of in the approval panel
    assert "open('two.txt', 'w').close()" in proc.stderr and "touch three.txt" in proc.stderr


def test_an_mcp_result_shows_the_result_not_its_framing(narrow, terminal, llm, tmp_path):
    config = write_config(tmp_path / "probe.json", {"probe": {"command": sys.executable, "args": [PROBE]}})
    llm.add(act("probe__big", '{"lines": 5}'), act("done", "ok"))
    screen = terminal("-y", "--mcp-config", config, "five lines")
    assert screen.finish() == 0
    shown = screen.text()
    assert "UNTRUSTED" not in shown and "as far as the user" not in shown
    assert all(f"    line {i} of the long result" in shown.split("\n") for i in range(5))


def test_talk_to_user_shows_its_question_once(terminal, llm):
    llm.add(act("talk_to_user", "Which colour should the chart be?"), act("done", "blue it is"))
    screen = terminal("make a chart")
    screen.wait_for(r"your reply:")
    os.write(screen.master, b"blue\n")
    assert screen.finish() == 0
    shown = screen.text()
    assert shown.count("Which colour should the chart be?") == 1 and "blue it is" in shown


class _Pipe:
    """A terminal's output: fed to a terminal emulator as it is written."""

    def __init__(self, screen: pyte.HistoryScreen):
        self.stream = pyte.Stream(screen)

    def write(self, text: str) -> int:
        self.stream.feed(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True


STEPS = 150


def test_no_fragment_of_the_thought_is_left_above_a_steps_header_under_load(monkeypatch):
    """The spinner redraws (here as often as it can, from its own thread) while the reply's lines are printed: a
    redraw between a print's erasing and its writing left the line still coming above the step's header."""
    from rich.live import Live

    from miniagi import terminal as ui
    from miniagi.commands import CommandTable
    from miniagi.protocols import formats
    from miniagi.terminal import DrawingConsole, Terminal

    class Eager(Live):  # the spinner's refreshes as close together as they come on a loaded machine
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **dict(kwargs, refresh_per_second=2000))

    monkeypatch.setattr(ui, "Live", Eager)
    screen = pyte.HistoryScreen(80, 30, history=100_000)
    terminal = Terminal(interactive=False)
    terminal.serve(lambda text: text, formats()["tags"].offering(CommandTable()))  # the format reads the reply
    terminal.console = DrawingConsole(file=_Pipe(screen), force_terminal=True, force_interactive=True, width=80,
                                      height=30, highlight=False)
    pieces = ["<r>", "Compute ", "the ", "primes ", "below ", "one ", "hundred", "</r>", "<c>done</c>\n", "ok"]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the threads take turns as often as they can (a run sets 0.2 ms)
    try:
        for step in range(1, STEPS + 1):
            with terminal.thinking(step), terminal.receiving("agent") as on_piece:
                for piece in pieces:
                    on_piece(piece)
                    threading.Event().wait(0.001)  # the next piece: the spinner redraws meanwhile
            terminal.action(step, "Compute the primes below one hundred", "done", "ok", 0.0)
    finally:
        sys.setswitchinterval(switch)
    history = ["".join(line[x].data for x in range(80)).rstrip() for line in screen.history.top]
    lines = [line for line in history + [line.rstrip() for line in screen.display] if line]
    headers = [i for i, line in enumerate(lines) if re.fullmatch(r"step \d+", line)]
    assert len(headers) == STEPS
    assert headers[0] == 0 and all(lines[i - 1] == "    ok" for i in headers[1:]), \
        [lines[i - 1] for i in headers if i and lines[i - 1] != "    ok"]


@real_servers
def test_the_time_servers_json_result_is_shown_whole(narrow, terminal, llm, tmp_path):
    """The issue's own case: get_current_time answers with a few lines of JSON."""
    config = write_config(tmp_path / "time.json", {"time": {
        "command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}})
    llm.add(act("time__get_current_time", '{"timezone": "Europe/Paris"}'), act("done", "it is late"))
    screen = terminal("-y", "--mcp-config", config, "what time is it in Paris")
    assert screen.finish() == 0
    shown = screen.text()
    assert "UNTRUSTED" not in shown
    assert re.search(r'\n    \{\n\s+"timezone": "Europe/Paris",\n\s+"datetime": "\d{4}-', shown), shown
    assert re.search(r'\n\s+"is_dst": (true|false)\n    \}\n', shown), shown


def test_the_help_fits_an_80_column_terminal_without_a_word_broken(narrow, terminal):
    screen = terminal("--help")
    assert screen.finish() == 0
    shown = [line for line in screen.text().split("\n") if line.strip()]
    # the emulator wraps what is too long at column 80: a line that fills the row and goes on broke at the edge
    assert all(len(line) < 80 or not shown[i + 1:i + 2] or shown[i + 1].startswith(" ")
               for i, line in enumerate(shown)), "\n".join(shown)
    text = " ".join(line.strip() for line in shown)
    assert "main run options" in text and "--max-cost USD" in text and "--protocol P" in text


@pytest.mark.parametrize("streamed", [True, False])
def test_the_answer_is_shown_once_on_one_screen_and_in_the_step_block_when_stdout_goes_elsewhere(
        terminal, llm, isolated, streamed):
    answer = "# Result\n\nThe largest file is `big.bin` (ANSWER-LINE-7)."
    reply = act("done", answer)
    for _ in range(2):
        llm.add(Stream([reply[i:i + 9] for i in range(0, len(reply), 9)]) if streamed else reply)
    screen = terminal("-y", "find the largest file")
    assert screen.finish() == 0
    assert screen.text().count("ANSWER-LINE-7") == 1  # stdout's last line, not the step block's as well
    assert screen.text().rstrip().endswith("The largest file is `big.bin` (ANSWER-LINE-7).")
    # stdout into a file: the screen shows the answer in the step block, the file has it
    elsewhere = terminal("-y", "-c", "last", "again", stdout=isolated.work / "answer.txt")
    assert elsewhere.finish() == 0
    assert elsewhere.text().count("ANSWER-LINE-7") == 1
    assert (isolated.work / "answer.txt").read_text().strip() == answer


def test_runs_and_show_fit_an_80_column_screen(narrow, terminal, llm, isolated):
    objective = "find the largest file in this folder and say how big it is, in megabytes"
    llm.add(act("execute_shell", "echo " + "word " * 40), act("done", "3 MB"))
    assert terminal("-y", objective).finish() == 0
    runs = terminal("runs")
    assert runs.finish() == 0
    rows = [line for line in runs.text().split("\n") if line.strip()]
    assert len(rows) == 2 and all(len(row) <= 80 for row in rows)
    assert rows[0].split()[-1] == "objective" and "find the largest" in rows[1]
    show = terminal("show", "last")
    assert show.finish() == 0
    lines = show.text().split("\n")
    heading = next(i for i, line in enumerate(lines) if line.startswith("step 1 command: execute_shell"))
    assert re.match(r"  \d+\+\d+ tokens · \$", lines[heading + 1])  # the figures under the heading, not cut
    echoed = [line for line in lines if "word word" in line]
    assert len(echoed) >= 2 and all(line.startswith("  ") for line in echoed)
