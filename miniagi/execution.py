"""Running the agent's code: a persistent Python worker per run and one-off shell commands.

Both run in the work directory, in a process group of their own (and a PID namespace of their own where Linux
allows it, see sandbox.py), with an allow-listed environment and no stdin; both are bounded by a time limit that takes their whole process group down; both write their output to a
file so that a 10 MB print or a background process holding the pipe can neither flood memory nor hang us.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from .containment import Containment
from .sandbox import Launch, Sandbox

INTERRUPT_GRACE_S = 5.0  # for the snippet to answer an interrupt (a loaded machine, a fork bomb being reaped)
WORKER_START_S = 120.0  # a worker's start-up (not counted in --exec-timeout: a loaded machine can be slow)


def cut_marker(cut_chars: int) -> str:
    return f"\n[… {cut_chars:,} characters cut from the middle …]\n"


def cap_text(text: str, max_chars: int) -> str:
    """Keep the head and the tail of a long text and say how much was cut."""
    if len(text) <= max_chars:
        return text
    head = max_chars * 2 // 3
    tail = max_chars - head
    return text[:head] + cut_marker(len(text) - head - tail) + text[len(text) - tail:]


def read_capped(path: Path, max_chars: int) -> str:
    """The head and tail of a possibly huge output file, reading no more than needed."""
    size = path.stat().st_size
    # utf-8 is at most 4 bytes a character; reading 4x the characters is always enough
    if size <= max_chars * 4:
        return cap_text(path.read_bytes().decode("utf-8", "replace"), max_chars)
    head_chars = max_chars * 2 // 3
    tail_chars = max_chars - head_chars
    with open(path, "rb") as handle:
        head = handle.read(head_chars * 4).decode("utf-8", "replace")[:head_chars]
        handle.seek(size - tail_chars * 4)
        tail = handle.read().decode("utf-8", "replace")[-tail_chars:]
    approx_cut = size - len(head.encode()) - len(tail.encode())
    return head + f"\n[… about {approx_cut:,} bytes cut from the middle …]\n" + tail


def kill_process_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Signal a process group. SIGKILL is repeated while live members remain, since members forking while the
    signal is delivered (a fork bomb) can escape one round."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + 3.0
    while sig == signal.SIGKILL and time.monotonic() < deadline and _live_members(pgid):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.005)


def _live_members(pgid: int) -> bool:
    return bool(group_members(pgid, live_only=True))


def group_members(pgid: int, spare: set[int] = frozenset(), live_only: bool = False) -> list[int]:
    """The processes of a group but the spared ones (with live_only, not the zombies)."""
    import psutil

    members = []
    for pid in psutil.pids():
        if pid in spare:
            continue
        try:
            if os.getpgid(pid) != pgid:
                continue
            if live_only and psutil.Process(pid).status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                continue
        except (OSError, psutil.Error):  # gone meanwhile
            continue
        members.append(pid)
    return members


def kill_group_members(pgid: int, spare: set[int]) -> int:
    """SIGKILL every process of a group but the spared ones until none is left (a fork bomb refills the group
    while we kill); returns how many were killed."""
    killed = 0
    for _ in range(50):
        found = 0
        for pid in group_members(pgid, spare, live_only=True):
            try:
                os.kill(pid, signal.SIGKILL)
                found += 1
            except OSError:
                continue
        killed += found
        if not found:
            break
    return killed


def wait_group_empty(pgid: int, spare: set[int], timeout_s: float = 3.0) -> None:
    """Until the killed members of a group are gone (reaped), so their process slots are free."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and group_members(pgid, spare):
        time.sleep(0.02)


class WorkerStartFailed(Exception):
    pass


@dataclass(frozen=True)
class ExecResult:
    output: str
    note: str = ""  # what the model must know besides the output: timeout, lost state, exit code
    ok: bool = True

    def observation(self) -> str:
        parts = [self.output.rstrip("\n") if self.output.strip() else "(no output)"]
        if self.note:
            parts.append(self.note)
        return "\n".join(parts)


class PythonSession:
    """A persistent Python worker process: state survives between `run` calls, crashes and timeouts do not
    take the agent down, and a fresh worker replaces a dead one."""

    def __init__(self, workdir: Path, env: Mapping[str, str], timeout_s: float, max_chars: int,
                 containment: Containment | None = None, sandbox: Sandbox | None = None,
                 tools: list[dict] = (), tool_handler: Callable[[str, str], dict] | None = None):
        # the agent's commands the code may call as functions ({"name", "params", "join", "doc"}), and who runs
        # them: tool_handler(name, arg) → {"result": text} | {"result", "data"} | {"error": text}
        self.tools = list(tools)
        self.tool_handler = tool_handler
        self.containment = containment
        self.sandbox = sandbox
        self.workdir = Path(workdir)
        self.env = dict(env)
        self.timeout_s = timeout_s
        self.max_chars = max_chars
        self.scratch = Path(tempfile.mkdtemp(prefix="miniagi-py-"))
        self.output_path = self.scratch / "output"
        self.process: subprocess.Popen | None = None
        self.requests = None
        self.responses = None
        self.runs = 0

    def _start(self) -> None:
        request_read, request_write = os.pipe()
        response_read, response_write = os.pipe()
        env = dict(self.env, MINIAGI_WORKER_REQUEST_FD=str(request_read),
                   MINIAGI_WORKER_RESPONSE_FD=str(response_write),
                   MINIAGI_WORKER_LIMITS=json.dumps(self.containment.worker_settings() if self.containment else {}),
                   MINIAGI_WORKER_TOOLS=json.dumps(self.tools))
        self.workdir.mkdir(parents=True, exist_ok=True)
        launch = _launch(self.sandbox, [sys.executable, "-u", "-m", "miniagi.worker"])
        self.process = subprocess.Popen(
            launch.argv, cwd=self.workdir, env=self._worker_env(env),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(request_read, response_write, *launch.pass_fds), start_new_session=True)
        os.close(request_read)
        os.close(response_write)
        self.requests = os.fdopen(request_write, "w", encoding="utf-8")
        self.responses = response_read
        try:
            ready = self._wait_reply(WORKER_START_S)
        except TimeoutError:
            ready = None
        if ready is None:
            raise WorkerStartFailed(f"the Python worker did not start within {WORKER_START_S:g} s")

    @staticmethod
    def _worker_env(env: dict[str, str]) -> dict[str, str]:
        # the worker must find the miniagi package even when it is not installed (running from a checkout)
        package_root = str(Path(__file__).resolve().parent.parent)
        paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        return dict(env, PYTHONPATH=os.pathsep.join([*paths, package_root]))

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def run(self, code: str, label: str | None = None) -> ExecResult:
        restarted = ""
        if not self.alive:
            if self.process is not None:
                restarted = "(A fresh Python worker was started for this code; earlier state was lost.)"
            self._close_worker()
            try:
                self._start()
            except WorkerStartFailed as exc:
                self._close_worker()
                return ExecResult("", ok=False, note=f"{exc}; nothing was run. Try again.")
        self.runs += 1
        # the label names the code in tracebacks: the step that ran it, when the caller says
        request = {"code": code, "output": str(self.output_path), "label": label or f"<code {self.runs}>"}
        try:
            self.requests.write(json.dumps(request) + "\n")
            self.requests.flush()
        except BrokenPipeError:
            return self._worker_died(restarted)
        try:
            reply = self._serve_tools()
        except TimeoutError:
            return self._timed_out()
        except BrokenPipeError:
            return self._worker_died(restarted)
        if reply is None:
            return self._worker_died(restarted)
        notes = [restarted] if restarted else []
        output = read_capped(self.output_path, self.max_chars)
        if reply["status"] == "interrupted":
            notes.append("The code was interrupted (KeyboardInterrupt).")
        if reply.get("forks_stopped"):
            notes.append(f"{reply['forks_stopped']} forked copies of the Python process were still running after "
                         "the code ended and were stopped.")
        return ExecResult(output, note="\n".join(notes), ok=reply["status"] == "ok")

    def _serve_tools(self) -> dict | None:
        """The snippet's final reply, answering the tool calls it makes on the way. The time limit counts the
        snippet's own time, not the time the agent spends carrying out its calls."""
        left = self.timeout_s
        while True:
            started = time.monotonic()
            reply = self._wait_reply(left)
            if left:
                left = max(0.001, left - (time.monotonic() - started))
            if reply is None or "tool" not in reply:
                return reply
            if self.tool_handler is None:
                answer = {"error": "tools are not available here"}
            else:
                try:
                    answer = self.tool_handler(str(reply["tool"]), str(reply.get("arg", "")))
                except BaseException:  # the run stops (interrupted, endpoint gone): the snippet waits in vain
                    self._close_worker()
                    raise
            self.requests.write(json.dumps(answer) + "\n")
            self.requests.flush()

    def _wait_reply(self, timeout_s: float) -> dict | None:
        """The worker's answer, or None when the worker is gone; TimeoutError when it takes too long."""
        deadline = time.monotonic() + timeout_s if timeout_s else None
        buffer = b""
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.responses], [], [], remaining)
            if not ready:
                raise TimeoutError
            chunk = os.read(self.responses, 65536)
            if not chunk:
                return None
            buffer += chunk
            if buffer.endswith(b"\n"):
                return json.loads(buffer)

    def _timed_out(self) -> ExecResult:
        """Interrupt the snippet (state survives); anything it started is killed; a worker that ignores the
        interrupt is killed with its whole process group. (The namespace's init and unshare ignore SIGINT.)"""
        pgid = self.process.pid
        kill_process_group(pgid, signal.SIGINT)
        try:
            reply = self._wait_reply(INTERRUPT_GRACE_S)
        except TimeoutError:
            reply = None
        output = read_capped(self.output_path, self.max_chars)
        limit = f"Timed out after {self.timeout_s:g} s (--exec-timeout)"
        if reply is not None:
            kill_group_members(pgid, spare=_spared(self.sandbox, pgid))
            return ExecResult(output, ok=False, note=(
                f"{limit}: the code was interrupted and any process it started was killed. The Python session "
                "keeps its variables. Make long work faster or split it into smaller steps."))
        self._close_worker()
        return ExecResult(output, ok=False, note=(
            f"{limit}: the Python worker did not stop, so it was killed with its whole process group. "
            "A fresh worker starts with the next code: variables, imports and functions from earlier steps are "
            "lost and must be defined again."))

    def _worker_died(self, restarted: str) -> ExecResult:
        code = self.process.wait() if self.process else None
        output = read_capped(self.output_path, self.max_chars) if self.output_path.exists() else ""
        self._close_worker()
        return ExecResult(output, ok=False, note="\n".join(filter(None, [restarted, (
            f"The Python worker process {describe_exit(code)} while running this code (os._exit(), a crash, or "
            "running out of memory). A fresh worker starts with the next code: variables, imports and functions "
            "from earlier steps are lost and must be defined again.")])))

    def _close_worker(self) -> None:
        if self.process is not None:
            kill_process_group(self.process.pid)
            self.process.wait()
        if self.requests is not None:
            try:
                self.requests.close()
            except OSError:
                pass
        if self.responses is not None:
            os.close(self.responses)
        self.process = self.requests = self.responses = None

    def close(self) -> None:
        self._close_worker()
        shutil.rmtree(self.scratch, ignore_errors=True)


def describe_exit(code: int | None) -> str:
    """How a process ended, in words; inside a namespace a signal arrives as the shell-style 128 + N."""
    if code is None:
        return "ended"
    signum = -code if code < 0 else code - 128 if code > 128 else 0
    try:
        name = signal.Signals(signum).name if signum else ""
    except ValueError:
        name = ""
    if name:
        return f"was killed by signal {name}" + (f" (exit code {code})" if code > 0 else "")
    return f"exited with code {code}"


def _launch(sandbox: Sandbox | None, argv: list[str]) -> Launch:
    return sandbox.launch(argv) if sandbox is not None else Launch(argv, ())


def _spared(sandbox: Sandbox | None, leader: int) -> set[int]:
    return sandbox.spared(leader) if sandbox is not None else {leader}


def shell_program() -> list[str]:
    bash = shutil.which("bash")
    return [bash, "-c"] if bash else ["/bin/sh", "-c"]


def run_shell(command: str, workdir: Path, env: Mapping[str, str], timeout_s: float, max_chars: int,
              containment: Containment | None = None, sandbox: Sandbox | None = None) -> ExecResult:
    """One shell command line: no stdin (interactive programs fail fast), output and exit code reported."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="miniagi-sh-") as scratch:
        output_path = Path(scratch) / "output"
        with open(output_path, "wb") as output:
            program = shell_program()
            prefix = containment.shell_prefix(program[0]) if containment else ""
            launch = _launch(sandbox, [*program, prefix + command])
            process = subprocess.Popen(launch.argv, cwd=workdir, env=dict(env), stdin=subprocess.DEVNULL,
                                       stdout=output, stderr=subprocess.STDOUT, pass_fds=launch.pass_fds,
                                       start_new_session=True)
            try:
                code = process.wait(timeout=timeout_s or None)
                note = f"exit code {code}" if 0 <= code <= 128 else describe_exit(code)
                # background jobs end with the command (start long-lived servers from execute_python instead)
                kill_process_group(process.pid)
            except subprocess.TimeoutExpired:
                kill_process_group(process.pid)
                process.wait()
                code = None
                note = (f"Timed out after {timeout_s:g} s (--exec-timeout): the command and its whole process "
                        "group were killed. Run long jobs in the background or in smaller steps.")
        text = read_capped(output_path, max_chars)
    return ExecResult(text, note=note, ok=code == 0)
