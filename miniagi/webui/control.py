"""The channel between `miniagi ui` and a run it started (`miniagi run --control DIR …`): a folder of small files.

The run writes:
  runs          the id of each run it starts, a line each (a chat starts several)
  question.json what it waits for: {"id", "kind": approve | ask | confirm, "run_id", "command", "arg", "message"}
  stream.json   the agent's reply as it streams in, as its format reads it: {"step", "thought", "command", "arg"}
                (gone between replies): the page shows no format's markup
  output.json   what the running command printed, bounded as the terminal bounds it: {"run_id", "step", "command",
                "started" (epoch s), "lines" (the first), "more" (how many past them), "tail" (the last), "running"};
                kept after the command ends or is stopped, so the page keeps every line it showed
The UI writes:
  answer.json   {"id" (the question's), "run": bool, "feedback": str} or {"id", "answer": str}

The folder is under $MINIAGI_HOME (ui/SESSION), which the sandbox hides from executed code: code cannot answer
its own approval. Every file is written whole (a temporary file renamed over it), so a reader never sees half.
Nothing here imports the web stack: the run's process uses it too.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import uuid
from pathlib import Path

from ..terminal import LIVE_OUTPUT_LINES, OBSERVATION_PREVIEW_LINES, Approval, Terminal

POLL_S = 0.1
STREAM_EVERY_S = 0.2


def write_whole(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class Channel:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.asking = threading.Lock()  # one question at a time (code may call a command from another thread)
        self.parent = os.getppid()  # the UI that started this run: when it is gone, nobody will answer

    # --- the run's side ------------------------------------------------------------------------------------------
    def started(self, run_id: str) -> None:
        with open(self.path / "runs", "a", encoding="utf-8") as runs:
            runs.write(run_id + "\n")

    def ask(self, question: dict) -> dict:
        """Put a question and wait for its answer (Ctrl-C, SIGINT, ends the wait as it ends a terminal prompt)."""
        with self.asking:
            qid = uuid.uuid4().hex[:12]
            answer_path = self.path / "answer.json"
            answer_path.unlink(missing_ok=True)
            write_whole(self.path / "question.json", json.dumps({**question, "id": qid}))
            try:
                while True:
                    answer = read_json(answer_path)
                    if answer is not None and answer.get("id") == qid:
                        return answer
                    if os.getppid() != self.parent:  # the UI ended without stopping it (killed): as Ctrl-C
                        raise KeyboardInterrupt
                    time.sleep(POLL_S)
            finally:
                (self.path / "question.json").unlink(missing_ok=True)
                answer_path.unlink(missing_ok=True)

    def stream(self, partial: dict | None) -> None:
        self._view("stream.json", partial)

    def output(self, printed: dict) -> None:
        self._view("output.json", printed)

    def _view(self, name: str, data: dict | None) -> None:
        try:
            if data is None:
                (self.path / name).unlink(missing_ok=True)
            else:
                write_whole(self.path / name, json.dumps(data, ensure_ascii=False))
        except OSError:  # only a view of the run: the run goes on without it
            pass

    # --- the UI's side -------------------------------------------------------------------------------------------
    def runs(self) -> list[str]:
        try:
            return (self.path / "runs").read_text(encoding="utf-8").split()
        except OSError:
            return []

    def question(self) -> dict | None:
        """The question waiting for the page: not one answered already (the run takes the answer at its next look,
        so for a moment both files are there; a page drawn then must not offer the question again)."""
        question = read_json(self.path / "question.json")
        if question is None:
            return None
        answered = read_json(self.path / "answer.json")
        return None if answered is not None and answered.get("id") == question.get("id") else question

    def answer(self, qid: str, answer: dict) -> bool:
        """Answer the question now waiting, if its id is `qid` (an old page cannot answer a newer question)."""
        question = self.question()
        if question is None or question.get("id") != qid:
            return False
        write_whole(self.path / "answer.json", json.dumps({**answer, "id": qid}))
        return True

    def streaming(self) -> dict | None:
        return read_json(self.path / "stream.json")

    def printed(self) -> dict | None:
        return read_json(self.path / "output.json")


class PrintedSoFar:
    """What a running command printed, bounded as the terminal bounds it: its first lines, then a count and its last
    lines. Lines come from the thread reading the output; a writer thread puts them in the channel a few times a
    second, and once more when the command ends (or is stopped)."""

    def __init__(self, channel: Channel, redact, run_id: str, step: int, command: str):
        self.channel, self.redact = channel, redact
        self.view = {"run_id": run_id, "step": step, "command": command, "started": time.time(), "lines": [],
                     "more": 0, "tail": [], "running": True}
        self.lock = threading.Lock()
        self.changed = True
        self.done = threading.Event()
        self.writer = threading.Thread(target=self._write_often, name="output-to-ui", daemon=True)
        self.writer.start()

    def line(self, text: str) -> None:
        text = self.redact(text)
        with self.lock:
            if len(self.view["lines"]) < LIVE_OUTPUT_LINES:
                self.view["lines"].append(text)
            else:
                self.view["more"] += 1
                self.view["tail"] = [*self.view["tail"], text][-OBSERVATION_PREVIEW_LINES:]
            self.changed = True

    def close(self) -> None:
        self.done.set()
        self.writer.join()
        with self.lock:
            self.view["running"] = False
            self.changed = True
        self._flush()

    def _write_often(self) -> None:
        while not self.done.wait(STREAM_EVERY_S):
            self._flush()

    def _flush(self) -> None:
        with self.lock:
            if not self.changed or not self.view["lines"]:  # a command that prints nothing leaves no view
                return
            self.changed = False
            view = dict(self.view, lines=list(self.view["lines"]))  # the reader thread appends to the list
        self.channel.output(view)


class ControlledTerminal(Terminal):
    """The terminal of a run that `miniagi ui` steers: progress still goes to stderr (the UI keeps it as the
    session's log); approvals, questions and confirmations are put to the channel and wait for the page's answer."""

    def __init__(self, channel: Channel, **kwargs):
        super().__init__(interactive=True, **kwargs)
        self.channel = channel
        self.run_id = ""
        self.step = 0  # of the reply last streamed: the step whose command runs next
        self.printed: PrintedSoFar | None = None

    @property
    def live(self) -> bool:
        """The page follows what code prints, as it prints it."""
        return True

    def thinking(self, step: int):
        self.step = step
        return super().thinking(step)

    @contextlib.contextmanager
    def working(self, what: str, step: int | None = None):
        """A command running: what it prints goes to the page as it prints it, and stays there when it ends or
        is stopped."""
        with super().working(what, step):
            if step is not None:  # the model thinks: its reply streams through `receiving`
                yield
                return
            command = what.rsplit(": ", 1)[-1].removesuffix(" running")
            self.printed = PrintedSoFar(self.channel, self.redact, self.run_id, self.step, command)
            try:
                yield
            finally:
                self.printed.close()
                self.printed = None

    def code_line(self, line: str) -> None:
        printed = self.printed
        if printed is not None:
            printed.line(line)

    def run_started(self, run_id: str, objective: str, model: str, resumed_at: int | None = None,
                    follows: str | None = None, sandbox: str | None = None) -> None:
        super().run_started(run_id, objective, model, resumed_at, follows, sandbox)
        self.run_id = run_id
        self.channel.started(run_id)

    def approve(self, command: str, arg: str) -> Approval:
        shown = self.redact(arg)  # (the question is a file, and a page: the secret gate stands)
        if shown != arg:  # what it hid runs too: said where the person reads it, before they approve
            shown = ("# miniagi: parts of this command match a secret value and are shown as [REDACTED]; they run as "
                     f"written (approve in a terminal to see them)\n{shown}")
        answer = self.channel.ask({"kind": "approve", "run_id": self.run_id, "command": command, "arg": shown})
        feedback = str(answer.get("feedback") or "").strip()
        if answer.get("run"):
            return Approval(True)
        if not feedback:
            return Approval(False, "The user refused to run this command. Choose another way forward.")
        return Approval(False, f"The user did not run this command and said: {feedback}")

    def ask_user(self, message: str) -> str:
        return str(self.channel.ask({"kind": "ask", "run_id": self.run_id, "message": self.redact(message)})
                   .get("answer") or "")

    def confirm(self, question: str) -> bool:
        return bool(self.channel.ask({"kind": "confirm", "run_id": self.run_id, "message": self.redact(question)})
                    .get("run"))

    @contextlib.contextmanager
    def receiving(self, role: str):
        """The agent's reply, as it streams, is also written for the page as its format reads it (a few times a
        second, and whenever it pauses)."""
        with super().receiving(role) as shown:
            if role != "agent" or self.reply_format is None:
                yield shown
                return
            reply = self.reply_format.reading()
            pieces: list[str] = []
            written = [0]
            done = threading.Event()

            def flush() -> None:
                if len(pieces) != written[0]:
                    written[0] = len(pieces)
                    so_far = reply.partial()
                    self.channel.stream({"step": self.step, "thought": self.redact(so_far.thought),
                                         "command": so_far.command, "arg": self.redact(so_far.arg)})

            def writer() -> None:
                while not done.wait(STREAM_EVERY_S):
                    flush()

            def on_piece(piece: str) -> None:
                shown(piece)
                reply.feed(piece)
                pieces.append(piece)

            thread = threading.Thread(target=writer, name="stream-to-ui", daemon=True)
            thread.start()
            try:
                yield on_piece
            finally:
                done.set()
                thread.join()
                self.channel.stream(None)
