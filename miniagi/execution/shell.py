"""execute_shell: one shell command line, in the run's sandbox with its limits, in a process group of its own, no
stdin (interactive programs fail fast); its output and exit code are reported, and background jobs end with it."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Callable, Mapping

from .limits import RunLimits
from .output import ExecResult, Tail, output_file, read_capped
from .processes import Started, describe_exit, kill_process_group
from .sandbox import Launch, Sandbox, find_program

CHECK_EVERY_S = 0.05  # how often the disk meter is read while it runs: what a writer gets past it


def shell_program() -> list[str]:
    bash = find_program("bash", os.environ.get("PATH"))
    return [bash, "-c"] if bash else ["/bin/sh", "-c"]


def run_shell(command: str, workdir: Path, env: Mapping[str, str], timeout_s: float, max_chars: int,
              limits: RunLimits | None = None, sandbox: Sandbox | None = None,
              on_output: Callable[[str], None] | None = None) -> ExecResult:
    disk_left = limits.disk.left(fresh=True) if limits else None
    if disk_left == 0:
        return ExecResult("", ok=False, note=f"Not run: {limits.disk.describe()}. Nothing more can be written in "
                                             "this run; say what you have, or finish.")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    with output_file() as output:
        program = shell_program()
        prefix = limits.shell_prefix(program[0], disk_left) if limits else ""
        argv = [*program, prefix + command]
        launch = sandbox.launch(argv) if sandbox else Launch(argv, ())
        process = subprocess.Popen(launch.argv, cwd=workdir, env=sandbox.environment(dict(env)) if sandbox else env,
                                   stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                   pass_fds=launch.pass_fds, start_new_session=True)
        started = Started(process)
        if limits:
            limits.disk.started(process.pid)
        stopped = ""
        deadline = time.monotonic() + timeout_s if timeout_s else None
        tail = Tail(output, on_output)  # its lines to whoever watches, as they come
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            code = started.wait(CHECK_EVERY_S if left is None else max(0.0, min(CHECK_EVERY_S, left)))
            if code is not None:
                break
            if deadline is not None and time.monotonic() >= deadline:
                stopped = (f"Timed out after {timeout_s:g} s (--exec-timeout): the command and its whole process "
                           "group were killed. Run long jobs in the background or in smaller steps.")
            elif limits and not limits.disk.left():
                stopped = (f"Stopped: {limits.disk.describe()}; the command and its whole process group were "
                           "killed.")
            if stopped:
                kill_process_group(process.pid)
                started.wait()
                break
        tail.stop()
        # background jobs end with the command (start long-lived servers from execute_python instead)
        kill_process_group(process.pid)
        if limits:
            limits.disk.ended(process.pid, started.rusage)
        text = read_capped(output, max_chars)
    if stopped:
        return ExecResult(text, note=stopped, ok=False)
    note = f"exit code {code}" if 0 <= code <= 128 else describe_exit(code)
    return ExecResult(text, note=note, ok=code == 0)
