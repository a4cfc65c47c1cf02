"""miniagi in a real terminal (a pseudo-terminal, read through a terminal emulator): what a person sees while the
model writes and while code runs, against a model server that streams slowly."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
import time

import pyte
import pytest

from .conftest import act
from .fake_llm import Stream, Wait

COLUMNS, ROWS = 120, 60


class Screen:
    """A process on a pseudo-terminal of COLUMNS x ROWS; everything it writes goes through a terminal emulator, so
    `text()` is what a person sees now (what was erased is gone) and `history` all the lines that scrolled by."""

    def __init__(self, args: list[str], cwd, env: dict, stdout=None):
        """`stdout`: a file to send stdout to instead of the terminal."""
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
        self.master = master
        self.screen = pyte.HistoryScreen(COLUMNS, ROWS, history=10_000)
        self.stream = pyte.ByteStream(self.screen)
        self.raw = bytearray()
        self.changed = threading.Condition()
        out = open(stdout, "wb") if stdout else None
        self.process = subprocess.Popen([sys.executable, "-m", "miniagi", *args], cwd=cwd, stdin=slave,
                                        stdout=out or slave, stderr=slave, env=dict(env, TERM="xterm-256color",
                                                                             COLUMNS=str(COLUMNS)),
                                        start_new_session=True)
        os.close(slave)
        if out:
            out.close()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # the process is gone and the terminal with it
                data = b""
            with self.changed:
                if not data:
                    self.closed = True
                    self.changed.notify_all()
                    return
                self.raw += data
                self.stream.feed(data)
                self.changed.notify_all()

    closed = False

    def text(self) -> str:
        """Every line shown so far that is still there: the scrolled-off history, then the screen."""
        history = ["".join(line[x].data for x in range(COLUMNS)).rstrip() for line in self.screen.history.top]
        return "\n".join(history + [line.rstrip() for line in self.screen.display]).rstrip()

    def wait_for(self, pattern: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not re.search(pattern, self.text()):
                left = deadline - time.monotonic()
                if left <= 0 or self.closed:
                    raise AssertionError(f"not seen on the screen: {pattern!r}\n--- screen ---\n{self.text()}")
                self.changed.wait(left)
            return self.text()

    def finish(self, timeout: float = 60) -> int:
        code = self.process.wait(timeout)
        self.reader.join(10)
        os.close(self.master)
        return code


@pytest.fixture
def terminal(llm, isolated):
    screens = []

    def start(*args: str, stdout=None) -> Screen:
        env = dict(os.environ, OPENAI_BASE_URL=llm.url, OPENAI_API_KEY="sk-test-key-123456",
                   MINIAGI_MEMORY_SCOPE="off")
        screens.append(Screen(list(args), isolated.work, env, stdout=stdout))
        return screens[-1]

    yield start
    for screen in screens:
        if screen.process.poll() is None:
            screen.process.kill()
            screen.finish()


SNIPPET = ("import os, time\n"
           "print('tank', 'one', 'is ready')\n"
           "while not os.path.exists('go'):\n"
           "    time.sleep(0.02)\n"
           "print('tank', 'two', 'is ready')\n")  # the lines it prints are not in the code


def test_the_thought_and_the_code_output_show_as_they_come(terminal, llm, isolated):
    thought_seen = threading.Event()
    llm.add(Stream(["<r>", "Counting ", "the ", "tanks ", "first.", Wait(thought_seen),
                    "</r><c>execute_python</c>\n", *SNIPPET.splitlines(keepends=True)]),
            act("done", "two tanks are ready"))
    screen = terminal("-y", "count the tanks")
    screen.wait_for(r"Counting the tanks first\.")  # before the reply has ended: the server waits for this
    assert llm.agent_requests() and screen.process.poll() is None
    thought_seen.set()
    shown = screen.wait_for(r"tank one is ready")  # printed while the snippet still runs: it waits for 'go'
    assert "tank two is ready" not in shown and "execute_python" in shown
    screen.wait_for(r"tank one is ready\n.*step 1: execute_python running… \d+ s$")  # the time it has run, below
    (isolated.work / "go").touch()
    assert screen.finish() == 0
    shown = screen.text()
    assert "tank two is ready" in shown and "two tanks are ready" in shown
    assert shown.count("tank one is ready") == 1  # not again in the observation
    assert "⠋" not in shown and "thinking…" not in shown  # no spinner left behind


@pytest.mark.parametrize("protocol", ["json", "tools"])
def test_other_reply_formats_stream_their_thought_then_command_and_argument(terminal, llm, protocol):
    seen = threading.Event()
    if protocol == "json":
        pieces = ['{"thought": "', "Measuring ", "the ", "water", '", "command": "execute_python", ',
                  '"args": {"code": "', "print(", "'level ", "four')\\n", Wait(seen), "print(2)", '"}}']
        llm.add(Stream(pieces), '{"thought": "done", "command": "done", "args": {"answer": "four"}}')
    else:
        pieces = ['{"code": "', "print(", "'level ", "four')\\n", Wait(seen), "print(2)", '"}']
        llm.add(Stream(["Measuring ", "the ", "water"], calls=[("execute_python", pieces)]))
        llm.add(Stream([], calls=[("done", ['{"answer": "four"}'])]))
    screen = terminal("-y", "--protocol", protocol, "measure")
    shown = screen.wait_for(r"print\('level four'\)")  # the argument's first line, before the reply ends
    assert re.search(r"Measuring the water\n\s*execute_python\n", shown)
    seen.set()
    assert screen.finish() == 0
    assert "level four" in screen.text()


def test_ctrl_c_keeps_what_was_shown(terminal, llm):
    never = threading.Event()
    llm.add(Stream(["<r>", "Reading ", "the ", "gauges\n", "one ", "by ", "one", Wait(never, 30)]))
    screen = terminal("-y", "read the gauges")
    screen.wait_for(r"one by one")
    os.killpg(screen.process.pid, signal.SIGINT)
    assert screen.finish() == 130
    shown = screen.text()
    assert "Reading the gauges" in shown and "one by one" in shown
    never.set()


def test_code_output_escape_sequences_are_made_visible_and_bounded(terminal, llm):
    code = "print('\\x1b[2J\\x1b]0;pwned\\x07 bell')\nfor i in range(500):\n    print('row', i)"
    llm.add(act("execute_python", code), act("done", "ok"))
    screen = terminal("-y", "print rows")
    assert screen.finish() == 0
    shown = screen.text()
    assert "\\x1b[2J\\x1b]0;pwned\\x07 bell" in shown
    # the first lines as they come, the last ones when it ends (a traceback is seen), the middle counted
    assert "row 0" in shown and "row 250" not in shown and "(475 more lines)" in shown
    assert shown.count("row 499") == 1  # not again in the observation


def test_without_a_terminal_stderr_has_whole_lines_and_stdout_only_the_answer(cli, llm):
    llm.add(Stream(["<r>", "Slowly ", "now", "</r><c>execute_python</c>\n", "print('made it')"], every=0.05),
            act("done", "the answer"))
    proc = cli("-y", "go slowly", process=True)
    assert proc.returncode == 0 and proc.stdout == "the answer\n"
    assert "\r" not in proc.stderr and "\x1b" not in proc.stderr and "⠋" not in proc.stderr
    assert "made it" in proc.stderr and "  Slowly now" in proc.stderr.splitlines()


def test_ctrl_c_while_code_runs_keeps_its_printed_lines(terminal, llm):
    llm.add(act("execute_python", "import time\nprint('gauge', 'one', 'read')\ntime.sleep(60)"))
    screen = terminal("-y", "read slowly")
    screen.wait_for(r"\n    gauge one read\n")
    os.killpg(screen.process.pid, signal.SIGINT)
    assert screen.finish() == 130
    assert "    gauge one read" in screen.text().splitlines() and "interrupted" in screen.text()


def test_the_spinner_draws_the_line_coming_without_waiting_for_the_reply():
    """Printing a line of the reply (under the reply's lock) waits for the display's lock, which the spinner's thread
    holds while it draws the line still coming: that drawing must not wait for the reply's lock, or both wait
    forever (a run hung mid-reply)."""
    import io

    from rich.console import Console

    from miniagi.protocols import formats
    from miniagi.terminal import LiveReply, Terminal

    terminal = Terminal(interactive=False)
    terminal.console = Console(file=io.StringIO(), force_terminal=True, width=100)
    reply = LiveReply(terminal, 1, formats()["tags"].reading())
    reply.feed("<r>Half a")
    updating, done = threading.Event(), threading.Event()

    def update_in_progress() -> None:
        with reply.lock:
            updating.set()
            done.wait(30)

    threading.Thread(target=update_in_progress, daemon=True).start()
    assert updating.wait(30)
    drawn: list = []
    drawer = threading.Thread(target=lambda: drawn.append(reply.coming()), daemon=True)
    drawer.start()
    drawer.join(10)
    done.set()
    assert not drawer.is_alive(), "drawing waited for the reply's lock"
    assert drawn[0].plain == "  Half a"
