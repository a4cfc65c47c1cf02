"""Where executed code starts: in a PID and mount namespace of its own when Linux allows it without privileges.

Inside, `/proc` shows only the code's own processes: the agent's environment (/proc/<pid>/environ), memory and
command line are out of sight, `os.getppid()` is the namespace's init rather than the agent, and `kill` cannot
reach the agent. The namespace is made with util-linux `unshare --user --map-root-user --pid --fork --mount-proc`
(a user namespace, so no privilege is needed; as root it also drops real root's power outside), and its PID 1
is nsinit.py, which reaps orphans and ends everything when the agent is gone.

Where the platform refuses (no unshare, user namespaces disabled), code starts anyway, outside a namespace: the
agent says so once on stderr and records it in the run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

NSINIT = Path(__file__).with_name("nsinit.py")
UNSHARE_FLAGS = ("--user", "--map-root-user", "--pid", "--fork", "--mount-proc", "--kill-child")
INNER_COMMAND_PID = 2  # nsinit is 1 and forks the command first


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    pass_fds: tuple[int, ...]


def probe(path: str | None = None) -> tuple[str | None, str]:
    """(the unshare program, "") when a namespace can be made here, else (None, why not)."""
    program = shutil.which("unshare", path=path)
    if program is None:
        return None, "the unshare program (util-linux) is not installed"
    try:
        done = subprocess.run([program, *UNSHARE_FLAGS, "true"], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"unshare could not be run ({exc})"
    if done.returncode != 0:
        why = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return None, f"the system refused a namespace ({why[-1] if why else f'exit {done.returncode}'})"
    return program, ""


class Sandbox:
    """Launches the commands of one run. `isolated` says whether they get a namespace; `reason` why not."""

    def __init__(self, cgroup_procs: str | None = None, path: str | None = None):
        self.unshare, self.reason = probe(path)
        self.cgroup_procs = cgroup_procs
        # the lifeline: every namespace's init holds the read end; only we hold the write end, so when this
        # process is gone (even SIGKILLed) the inits read end-of-file and end their namespaces
        self._lifeline_read, self._lifeline_write = (os.pipe() if self.unshare else (-1, -1))

    @property
    def isolated(self) -> bool:
        return self.unshare is not None

    def launch(self, argv: list[str]) -> Launch:
        if self.unshare:
            argv = [self.unshare, *UNSHARE_FLAGS, sys.executable, "-I", "-S", str(NSINIT),
                    str(self._lifeline_read), *argv]
        if self.cgroup_procs:  # join the run's pids cgroup before anything else starts
            argv = ["/bin/sh", "-c", f'echo $$ > {self.cgroup_procs} 2>/dev/null; exec "$@"', "sh", *argv]
        return Launch(argv, (self._lifeline_read,) if self.unshare else ())

    def spared(self, leader: int) -> set[int]:
        """The processes of a launch that are not the command's own work: the leader (unshare) and the
        namespace's init, plus the command itself; outside a namespace, the leader is the command."""
        if not self.unshare:
            return {leader}
        keep = {leader}
        for init in _children(leader):
            keep.add(init)
            keep.update(pid for pid in _children(init) if _inner_pid(pid) in (INNER_COMMAND_PID, None))
        return keep

    def close(self) -> None:
        for fd in (self._lifeline_read, self._lifeline_write):
            if fd >= 0:
                os.close(fd)
        self._lifeline_read = self._lifeline_write = -1


def _children(pid: int) -> list[int]:
    """The kernel's own list of a process's children. (Not psutil's children(), which reads every process on
    the machine to find them: slow during a fork bomb, when this is asked, and it can miss the worker.)"""
    found: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            found.extend(int(p) for p in (task / "children").read_text().split())
    except (OSError, ValueError):
        pass
    return found


def _inner_pid(pid: int) -> int | None:
    """A process's pid inside its own namespace (the last NSpid field), None when the kernel does not say."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except (OSError, ValueError):
        pass
    return None
