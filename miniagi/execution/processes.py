"""The processes executed code runs in: started in a group of their own, waited for, reaped (with the rusage that
tells how much their whole tree wrote), and killed — group and all."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time


class Started:
    """A process we started, reaped by us with wait4 (never by Popen) so its tree's rusage is known."""

    def __init__(self, process: subprocess.Popen):
        self.process = process
        self.pid = process.pid
        self.rusage = None
        try:  # wakes a wait the moment the process ends (Linux 5.3+); else waits poll
            self._pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            self._pidfd = None

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def poll(self) -> int | None:
        if self.process.returncode is None:
            try:
                pid, status, rusage = os.wait4(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: nothing more to learn
                self.process.returncode = -1
                return self.process.returncode
            if pid:
                self.rusage = rusage
                self.process.returncode = os.waitstatus_to_exitcode(status)
        return self.process.returncode

    def wait(self, timeout_s: float | None = None) -> int | None:
        """The exit code, or None when the process is still running after timeout_s (None: wait for good)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            if self._pidfd is not None:
                select.select([self._pidfd], [], [], left)
            else:
                time.sleep(0.01 if left is None else min(0.01, left))
        self.close()
        return self.process.returncode

    def close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


def kill_process_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Signal a process group. SIGKILL is repeated while live members remain, since members forking while the
    signal is delivered (a fork bomb) can escape one round."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + 3.0
    while sig == signal.SIGKILL and time.monotonic() < deadline and group_members(pgid, live_only=True):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.005)


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
