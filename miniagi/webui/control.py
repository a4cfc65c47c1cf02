"""The channel between `miniagi ui` and a run it started (`miniagi run --control DIR …`): a folder of small files.

The run writes:
  runs          the id of each run it starts, a line each (a chat starts several)
  question.json what it waits for: {"id", "kind": approve | ask | confirm, "run_id", "command", "arg", "message"}
  stream.txt    the agent's reply as it streams in (empty between replies)
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

from ..ui import Approval, Terminal

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

    def stream(self, text: str) -> None:
        try:
            write_whole(self.path / "stream.txt", text)
        except OSError:  # only a view of the reply: the run goes on without it
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

    def streaming(self) -> str:
        try:
            return (self.path / "stream.txt").read_text(encoding="utf-8")
        except OSError:
            return ""


class ControlledTerminal(Terminal):
    """The terminal of a run that `miniagi ui` steers: progress still goes to stderr (the UI keeps it as the
    session's log); approvals, questions and confirmations are put to the channel and wait for the page's answer."""

    def __init__(self, channel: Channel, **kwargs):
        super().__init__(interactive=True, **kwargs)
        self.channel = channel
        self.run_id = ""

    def run_started(self, run_id: str, objective: str, model: str, resumed_at: int | None = None,
                    follows: str | None = None, sandbox: str | None = None) -> None:
        super().run_started(run_id, objective, model, resumed_at, follows, sandbox)
        self.run_id = run_id
        self.channel.started(run_id)

    def approve(self, command: str, arg: str) -> Approval:
        answer = self.channel.ask({"kind": "approve", "run_id": self.run_id, "command": command,
                                   "arg": self.redact(arg)})
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
        """The agent's reply, as it streams, is also written for the page (a few times a second, and whenever
        it pauses)."""
        with super().receiving(role) as shown:
            if role != "agent":
                yield shown
                return
            pieces: list[str] = []
            written = [0]
            done = threading.Event()

            def flush() -> None:
                if len(pieces) != written[0]:
                    written[0] = len(pieces)
                    self.channel.stream(self.redact("".join(pieces)))

            def writer() -> None:
                while not done.wait(STREAM_EVERY_S):
                    flush()

            def on_piece(piece: str) -> None:
                shown(piece)
                pieces.append(piece)

            thread = threading.Thread(target=writer, name="stream-to-ui", daemon=True)
            thread.start()
            try:
                yield on_piece
            finally:
                done.set()
                thread.join()
                self.channel.stream("")
