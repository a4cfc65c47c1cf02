"""execute_python: a persistent Python worker per run (worker.py), like a notebook kernel.

The worker runs in the run's sandbox with its limits, in a process group of its own, with an allow-listed
environment and no stdin. Its output goes to a file the agent holds open (output.py); its answers come back on a
pipe, read in bounded lines against a deadline that no flood of bytes can push back.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Mapping

from .limits import RunLimits
from .output import ExecResult, clear, output_file, read_capped, watched
from .processes import Started, describe_exit, kill_group_members, kill_process_group
from .sandbox import Launch, Sandbox

WORKER = Path(__file__).resolve().with_name("worker.py")
INTERRUPT_GRACE_S = 30.0  # for an interrupted snippet to answer (a loaded machine, a fork bomb being reaped)
DESCENDANTS_AFTER_S = 2.0  # no answer to the interrupt by then: the snippet's own processes are killed
ANSWER_POLL_S = 0.25
WORKER_END_S = 5.0  # for the sandbox around a worker that closed its channel to end
WORKER_START_S = 120.0  # a worker's start-up (not counted in --exec-timeout: a loaded machine can be slow)
MAX_ANSWER_BYTES = 16 * 2**20  # one line from the worker: a tool call's argument, a status
CHECK_EVERY_S = 0.05  # how often the disk meter is read while code runs: what a writer gets past it


class WorkerStartFailed(Exception):
    pass


class ChannelBroken(Exception):
    """The worker's answer channel carried more than any answer can be (code wrote into it)."""


class DiskLimitReached(Exception):
    pass


class PythonSession:
    """A persistent Python worker process: state survives between `run` calls, crashes and timeouts do not
    take the agent down, and a fresh worker replaces a dead one."""

    def __init__(self, workdir: Path, env: Mapping[str, str], timeout_s: float, max_chars: int,
                 limits: RunLimits | None = None, sandbox: Sandbox | None = None,
                 tools: list[dict] = (), tool_handler: Callable[[str, str], dict] | None = None):
        # the agent's commands the code may call as functions ({"name", "params", "join", "doc"}), and who runs
        # them: tool_handler(name, arg) → {"result": text} | {"result", "data"} | {"error": text}
        self.tools = list(tools)
        self.tool_handler = tool_handler
        self.limits = limits
        self.sandbox = sandbox
        self.workdir = Path(workdir)
        self.env = dict(env)
        self.timeout_s = timeout_s
        self.max_chars = max_chars
        self.output = output_file()
        self.worker: Started | None = None
        self.requests = None
        self.responses: int | None = None
        self.buffer = bytearray()
        self.scanned = 0  # how much of the buffer holds no newline: each byte is looked at once
        self.runs = 0
        self.on_output: Callable[[str], None] | None = None  # told each line of output as the code prints it

    def _start(self) -> None:
        request_read, request_write = os.pipe()
        response_read, response_write = os.pipe()
        self.workdir.mkdir(parents=True, exist_ok=True)
        clear(self.output)
        out = self.output.fileno()
        argv = [sys.executable, "-I", "-u", str(WORKER), str(request_read), str(response_write), str(out)]
        launch = self.sandbox.launch(argv) if self.sandbox else Launch(argv, ())
        env = self.sandbox.environment(self.env) if self.sandbox else self.env
        try:
            process = subprocess.Popen(launch.argv, cwd=self.workdir, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                       stderr=out, pass_fds=(request_read, response_write, out, *launch.pass_fds),
                                       start_new_session=True)
        finally:
            os.close(request_read)
            os.close(response_write)
        self.worker = Started(process)
        if self.limits:
            self.limits.disk.started(process.pid)
        self.requests = os.fdopen(request_write, "w", encoding="utf-8")
        self.responses = response_read
        self.buffer = bytearray()
        self.scanned = 0
        limits = self.limits.worker_settings() if self.limits else {}
        try:
            self._send({"limits": limits, "tools": self.tools})
            ready = self._wait_reply(WORKER_START_S, watch=False)
        except TimeoutError:
            raise WorkerStartFailed(f"the Python worker did not start within {WORKER_START_S:g} s") from None
        except (BrokenPipeError, ChannelBroken):
            ready = None
        if ready is None:
            said = read_capped(self.output, 2000).strip()
            raise WorkerStartFailed("the Python worker could not start" + (f":\n{said}" if said else ""))

    def _send(self, message: dict) -> None:
        self.requests.write(json.dumps(message) + "\n")
        self.requests.flush()

    @property
    def alive(self) -> bool:
        return self.worker is not None and self.worker.poll() is None

    def run(self, code: str, label: str | None = None) -> ExecResult:
        disk_left = self.limits.disk.left(fresh=True) if self.limits else None
        if disk_left == 0:
            return ExecResult("", ok=False, note=f"Not run: {self.limits.disk.describe()}. Nothing more can be "
                                                 "written in this run; say what you have, or finish.")
        restarted = ""
        if not self.alive:
            if self.worker is not None:
                restarted = "(A fresh Python worker was started for this code; earlier state was lost.)"
            self._close_worker()
            try:
                self._start()
            except WorkerStartFailed as exc:
                self._close_worker()
                return ExecResult("", ok=False, note=f"{exc}\nNothing was run.")
        self.runs += 1
        clear(self.output)
        oom_before = self.limits.cgroups.oom_kills() if self.limits else 0
        # the label names the code in tracebacks: the step that ran it, when the caller says
        request_id = self.runs
        try:
            self._send({"id": request_id, "code": code, "label": label or f"<code {self.runs}>",
                        "file_bytes": self.limits.file_allowance(disk_left) if self.limits else None})
            with watched(self.output, self.on_output):
                reply = self._serve_tools(request_id)
        except TimeoutError:
            return self._stop_snippet(f"Timed out after {self.timeout_s:g} s (--exec-timeout)",
                                      "Make long work faster or split it into smaller steps.")
        except DiskLimitReached:
            return self._stop_snippet(f"Stopped: {self.limits.disk.describe()}",
                                      "Nothing more can be written in this run.")
        except ChannelBroken:
            output = read_capped(self.output, self.max_chars)
            self._close_worker()
            return ExecResult(output, ok=False, note="\n".join(filter(None, [restarted, (
                "The code wrote into the Python worker's own answer channel (a descriptor of the worker), so the "
                "worker was stopped. A fresh worker starts with the next code: variables, imports and functions "
                "from earlier steps are lost and must be defined again.")])))
        except BrokenPipeError:
            reply = None
        if reply is None:
            return self._worker_died(restarted, oom_before)
        notes = [restarted] if restarted else []
        output = read_capped(self.output, self.max_chars)
        if reply["status"] == "interrupted":
            notes.append("The code was interrupted (KeyboardInterrupt).")
        if reply.get("forks_stopped"):
            notes.append(f"{reply['forks_stopped']} forked copies of the Python process were still running after "
                         "the code ended and were stopped.")
        return ExecResult(output, note="\n".join(notes), ok=reply["status"] == "ok")

    def _serve_tools(self, request_id: int) -> dict | None:
        """The snippet's final reply, answering the tool calls it makes on the way. The time limit counts the
        snippet's own time, not the time the agent spends carrying out its calls."""
        left = self.timeout_s
        while True:
            started = time.monotonic()
            reply = self._wait_reply(left, request_id=request_id)
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
            self._send(answer)

    def _wait_reply(self, timeout_s: float, request_id: int | None = None, watch: bool = True) -> dict | None:
        """The worker's next answer (to request_id, when given: a stale or forged line is skipped), or None when
        the worker is gone. TimeoutError when it takes too long — checked on every pass, so a flood of bytes
        cannot push the deadline back; DiskLimitReached (with watch) when the code writes past --exec-disk."""
        deadline = time.monotonic() + timeout_s if timeout_s else None
        next_check = time.monotonic() + CHECK_EVERY_S
        while True:
            line = self._next_line()
            if line is not None:
                try:
                    reply = json.loads(line) if line.strip() else None
                except ValueError:
                    reply = None
                # what the worker did not write (code writing into the channel) is skipped
                if isinstance(reply, dict) and (request_id is None or reply.get("id", request_id) == request_id):
                    return reply
                continue
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise TimeoutError
            if watch and self.limits and now >= next_check:
                next_check = now + CHECK_EVERY_S
                if not self.limits.disk.left():
                    raise DiskLimitReached
            wait = CHECK_EVERY_S if deadline is None else min(CHECK_EVERY_S, deadline - now)
            ready, _, _ = select.select([self.responses], [], [], wait)
            if ready:
                chunk = os.read(self.responses, 1 << 20)
                if not chunk:
                    return None
                self.buffer += chunk

    def _next_line(self) -> bytes | None:
        end = self.buffer.find(b"\n", self.scanned)
        if end < 0:
            self.scanned = len(self.buffer)
            if self.scanned > MAX_ANSWER_BYTES:
                raise ChannelBroken
            return None
        line = bytes(self.buffer[:end])
        del self.buffer[:end + 1]
        self.scanned = 0
        return line

    def _stop_snippet(self, why: str, advice: str) -> ExecResult:
        """Interrupt the snippet and kill whatever it started, keeping the worker and its state. Only a worker that
        ignores the interrupt, or does not answer it within INTERRUPT_GRACE_S, is killed with its whole process
        group. (The sandbox's launcher and init ignore SIGINT.)"""
        pgid = self.worker.pid
        worker = self.sandbox.command(pgid) if self.sandbox else pgid
        kill_process_group(pgid, signal.SIGINT)
        started = time.monotonic()
        reply = None
        while time.monotonic() - started < INTERRUPT_GRACE_S:
            try:
                reply = self._wait_reply(ANSWER_POLL_S, request_id=self.runs, watch=False)
                break  # an answer, or None: the worker is gone
            except TimeoutError:
                pass
            except ChannelBroken:
                break
            if time.monotonic() - started < DESCENDANTS_AFTER_S:
                continue
            if worker is not None and _ignores_interrupt(worker):
                break
            # what the snippet started may be what it waits for (or a fork bomb starving it): those go, not it
            kill_group_members(pgid, spare=self.sandbox.spared(pgid) if self.sandbox else {pgid})
        output = read_capped(self.output, self.max_chars)
        if reply is not None:
            kill_group_members(pgid, spare=self.sandbox.spared(pgid) if self.sandbox else {pgid})
            return ExecResult(output, ok=False, note=(
                f"{why}: the code was interrupted and any process it started was killed. The Python session "
                f"keeps its variables. {advice}"))
        self._close_worker()
        return ExecResult(output, ok=False, note=(
            f"{why}: the Python worker did not stop, so it was killed with its whole process group. "
            "A fresh worker starts with the next code: variables, imports and functions from earlier steps are "
            f"lost and must be defined again. {advice}"))

    def _worker_died(self, restarted: str, oom_before: int) -> ExecResult:
        code = self.worker.wait(WORKER_END_S)  # the sandbox around it ends a moment after the worker
        if code is None:  # the worker lives but closed its answer channel: it cannot be talked to
            kill_process_group(self.worker.pid)
            code = self.worker.wait()
        output = read_capped(self.output, self.max_chars)
        self._close_worker()
        if self.limits and self.limits.cgroups.oom_kills() > oom_before:
            cause = (f"ran out of memory: all of the code's processes together may use --exec-memory "
                     f"{self.limits.limits.memory_mb} MB, shared memory included")
        else:
            cause = f"{describe_exit(code)} while running this code (os._exit(), a crash, or running out of memory)"
        return ExecResult(output, ok=False, note="\n".join(filter(None, [restarted, (
            f"The Python worker process {cause}. A fresh worker starts with the next code: variables, imports and "
            "functions from earlier steps are lost and must be defined again.")])))

    def _close_worker(self) -> None:
        if self.worker is not None:
            if self.worker.poll() is None:
                kill_process_group(self.worker.pid)
            self.worker.wait()
            if self.limits:
                self.limits.disk.ended(self.worker.pid, self.worker.rusage)
        if self.requests is not None:
            try:
                self.requests.close()
            except OSError:
                pass
        if self.responses is not None:
            os.close(self.responses)
        self.worker = self.requests = self.responses = None

    def close(self) -> None:
        self._close_worker()
        self.output.close()


def _ignores_interrupt(pid: int) -> bool:
    """Whether a process has SIGINT ignored (the kernel's SigIgn mask): interrupting it again is no use."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status.read(8192).splitlines():
                if line.startswith(b"SigIgn:"):
                    return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    except (OSError, ValueError, IndexError):
        pass
    return False
