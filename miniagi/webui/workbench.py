"""What `miniagi ui` starts: each run (or chat) is an ordinary `python -m miniagi run|chat|resume --control DIR`
process, steered through the files in DIR (control.py). It records into the same run store as a run started in a
terminal, so `miniagi runs`, `show` and `resume` see it.

A session is one such process: a run, a resumed run, or a chat (its objectives written to its stdin, a line
each, as `miniagi chat` reads them; its Python session and memory carry over). Its folder,
$MINIAGI_HOME/ui/SESSION, holds the channel and the process's output; the sandbox hides the home from executed
code. Stop is Ctrl-C: SIGINT to the process group, as a batch stops its objectives (state saved, resumable).
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from ..protocols import formats
from ..run_store import miniagi_command
from .control import Channel

PROTOCOLS = tuple(formats())  # the reply formats a page may choose: the table of formats
LOG_TAIL = 4000  # characters of a failed start's stderr shown
EARLIER_SESSIONS = 200  # session folders of earlier UIs looked through for what a stopped command printed


@dataclass
class Options:
    """The options a page may choose; anything else comes from the environment and .env, as in a terminal."""
    model: str = ""
    protocol: str = ""
    max_steps: int | None = None
    critic: bool = False
    yes: bool = False  # run without asking

    def flags(self) -> list[str]:
        flags = ["--critic" if self.critic else "--no-critic"]
        if self.model:  # name=value: a value that starts with - is not taken for an option
            flags.append(f"--model={self.model}")
        if self.protocol:
            flags.append(f"--protocol={self.protocol}")
        if self.max_steps:
            flags.append(f"--max-steps={self.max_steps}")
        return flags + (["--yes"] if self.yes else [])


@dataclass
class Session:
    id: str
    kind: str  # run, resume, chat
    workdir: Path
    folder: Path
    process: subprocess.Popen
    yes: bool = False
    channel: Channel = field(init=False)

    def __post_init__(self):
        self.channel = Channel(self.folder)

    def alive(self) -> bool:
        return self.process.poll() is None

    def runs(self) -> list[str]:
        return self.channel.runs()

    def current(self) -> str | None:
        runs = self.runs()
        return runs[-1] if runs else None

    def interrupt(self) -> None:
        if self.alive():
            try:
                os.killpg(self.process.pid, signal.SIGINT)
            except ProcessLookupError:
                pass

    def say(self, objective: str) -> bool:
        """The next objective of a chat (one line, as `miniagi chat` reads them)."""
        if self.kind != "chat" or not self.alive() or self.process.stdin is None:
            return False
        try:
            self.process.stdin.write(" ".join(objective.split()) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, ValueError):
            return False
        return True

    def log_tail(self) -> str:
        try:
            return (self.folder / "stderr.txt").read_text(encoding="utf-8", errors="replace")[-LOG_TAIL:]
        except OSError:
            return ""


class Workbench:
    def __init__(self, home: Path, workdirs: list[Path], environ: dict[str, str] | None = None):
        self.home = Path(home)
        self.workdirs = [Path(w).expanduser().resolve() for w in workdirs] or [Path.cwd().resolve()]
        self.environ = dict(os.environ if environ is None else environ)
        self.sessions: dict[str, Session] = {}

    def workdir(self, chosen: str) -> Path | None:
        """One of the allowed work directories, by its path as the form lists it; None for any other."""
        for allowed in self.workdirs:
            if chosen == str(allowed):
                return allowed
        return None

    def spawn(self, kind: str, args: list[str], workdir: Path, yes: bool, stdin_text: str | None = None) -> Session:
        sid = uuid.uuid4().hex[:12]
        folder = self.home / "ui" / sid
        folder.mkdir(parents=True, mode=0o700)
        env = {**self.environ, "MINIAGI_HOME": str(self.home)}
        env.pop("MINIAGI_UNATTENDED", None)  # the page is the person
        # run in the work directory, whose json.py or memory.py (code may write them) must not be imported here
        command = miniagi_command(*args, "--control", str(folder), "--workdir", str(workdir))
        with open(folder / "stdout.txt", "w") as out, open(folder / "stderr.txt", "w") as err:
            process = subprocess.Popen(command, cwd=workdir, env=env, stdin=subprocess.PIPE, stdout=out, stderr=err,
                                       text=True, encoding="utf-8", start_new_session=True)
        if stdin_text is not None:
            process.stdin.write(stdin_text)
            process.stdin.close()
        session = self.sessions[sid] = Session(sid, kind, workdir, folder, process, yes)
        return session

    def start(self, objective: str, workdir: Path, options: Options, chat: bool = False,
              follows: str | None = None) -> Session:
        follow = ["--cid", follows] if follows else []
        if chat:
            session = self.spawn("chat", ["chat", *follow, *options.flags()], workdir, options.yes)
            session.say(objective)
            return session
        return self.spawn("run", ["run", *follow, *options.flags(), "-"], workdir, options.yes, stdin_text=objective)

    def resume(self, run_id: str, workdir: Path, yes: bool) -> Session:
        return self.spawn("resume", ["resume", run_id, *(["--yes"] if yes else [])], workdir, yes, stdin_text="")

    def driving(self, run_id: str) -> Session | None:
        """The live session whose current run is this one."""
        for session in reversed(list(self.sessions.values())):
            if session.alive() and session.current() == run_id:
                return session
        return None

    def printed(self, run_id: str) -> dict | None:
        """What the last command of this run printed as a UI followed it (kept after it ends or is stopped): from
        the session of this UI that drove it last, else from the newest session folder of an earlier UI."""
        channels = [session.channel for session in reversed(list(self.sessions.values()))]
        if not any(run_id in channel.runs() for channel in channels):
            channels = [Channel(folder) for folder in self._earlier_sessions()]
        for channel in channels:
            if run_id in channel.runs():
                printed = channel.printed()
                return printed if printed is not None and printed.get("run_id") == run_id else None
        return None

    def _earlier_sessions(self) -> list[Path]:
        """The session folders under the home, newest first (the latest EARLIER_SESSIONS of them)."""
        found = []
        try:
            folders = list((self.home / "ui").iterdir())
        except OSError:
            return []
        for folder in folders:
            try:
                if folder.is_dir() and not folder.is_symlink():
                    found.append((folder.stat().st_mtime, folder))
            except OSError:  # gone meanwhile: the others still count
                continue
        return [folder for _, folder in sorted(found, reverse=True)[:EARLIER_SESSIONS]]

    def close(self) -> None:
        """The UI is stopping: its runs are stopped as Ctrl-C stops them (state saved), chats end."""
        for session in self.sessions.values():
            if session.alive():
                session.interrupt()
                if session.process.stdin is not None:
                    try:
                        session.process.stdin.close()
                    except (BrokenPipeError, OSError):
                        pass
        for session in self.sessions.values():
            try:
                session.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(session.process.pid, signal.SIGKILL)
