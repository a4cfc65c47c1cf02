"""Limits on the code the agent runs, so a fork bomb or a 50 GB allocation cannot take the machine down.

Every execute_python worker and execute_shell command gets:
- memory: RLIMIT_DATA (heap and anonymous mappings, not reserved address space, so runtimes that reserve large
  virtual regions still start) — an allocation past it fails with MemoryError / ENOMEM;
- file size: RLIMIT_FSIZE — a write past it fails with EFBIG;
- CPU time: RLIMIT_CPU per snippet / command, on top of the wall-clock --exec-timeout;
- number of processes: a cgroup `pids` limit when one can be made (always as root, where RLIMIT_NPROC is not
  enforced), else RLIMIT_NPROC set to what the user already runs plus the allowance;
- no core dumps, its own process group (and PID namespace, see sandbox.py), the working directory as HOME,
  an allow-listed environment.

This contains accidents and runaway code; it is not a security boundary against hostile code, which can still read
and write whatever the user can. For that, run miniagi in a container (see docs/sandbox.md).
"""

from __future__ import annotations

import os
import secrets
import signal
from dataclasses import dataclass
from pathlib import Path

FILE_LIMIT_MB = 1024
PROCESS_ALLOWANCE = 256


@dataclass(frozen=True)
class Limits:
    memory_mb: int = 4096
    file_mb: int = FILE_LIMIT_MB
    processes: int = PROCESS_ALLOWANCE
    cpu_s: float = 120.0

    @property
    def memory_bytes(self) -> int:
        return self.memory_mb * 2**20

    @property
    def file_bytes(self) -> int:
        return self.file_mb * 2**20


def _user_process_count() -> int:
    import psutil

    uid = os.getuid()
    return sum(1 for process in psutil.process_iter(["uids"])
               if process.info["uids"] and process.info["uids"].real == uid)


def _cgroup_roots() -> list[Path]:
    """Where a pids cgroup of our own may be created: cgroup v1's pids hierarchy, or our own cgroup v2 node."""
    roots = []
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
        membership = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return roots
    for line in mounts:
        fields = line.split()
        if len(fields) < 4:
            continue
        mount_point, kind, options = fields[1], fields[2], fields[3].split(",")
        if kind == "cgroup" and "pids" in options:
            own = next((m.split(":", 2)[2] for m in membership if ":pids:" in m), "/")
            roots.append(Path(mount_point) / own.lstrip("/"))
        elif kind == "cgroup2":
            own = next((m.split(":", 2)[2] for m in membership if m.startswith("0::")), "/")
            root = Path(mount_point) / own.lstrip("/")
            if (root / "cgroup.subtree_control").exists() and "pids" in (
                    (root / "cgroup.subtree_control").read_text()):
                roots.append(root)
    return roots


class ProcessGroupCap:
    """A pids cgroup for one run's executed code; None from `create` when the system will not give us one."""

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def create(cls, processes: int) -> "ProcessGroupCap | None":
        for root in _cgroup_roots():
            path = root / f"miniagi-{os.getpid()}-{secrets.token_hex(3)}"
            try:
                path.mkdir()
                (path / "pids.max").write_text(str(processes))
                return cls(path)
            except OSError:
                try:
                    path.rmdir()
                except OSError:
                    pass
        return None

    @property
    def procs_file(self) -> str:
        return str(self.path / "cgroup.procs")

    def kill_all(self, timeout_s: float = 5.0) -> bool:
        """Kill every process in the cgroup; True when it is empty. New forks are refused first, so a fork bomb
        cannot refill the group while we kill."""
        import time

        try:
            (self.path / "pids.max").write_text("1")
        except OSError:
            pass
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                pids = [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
            except OSError:
                return True
            if not pids:
                return True
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.01)
        return False

    def close(self) -> None:
        if self.kill_all():
            try:
                self.path.rmdir()
            except OSError:
                pass


class Containment:
    """The limits of one run, applied to its Python worker (by the worker itself, see worker.py) and to each
    shell command (by a `ulimit` prefix, so no code of ours runs between fork and exec)."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.cap = ProcessGroupCap.create(limits.processes)
        # RLIMIT_NPROC counts every process of the user; root ignores it (the cgroup covers root)
        self.nproc = None if self.cap or os.getuid() == 0 else _user_process_count() + limits.processes

    def worker_settings(self) -> dict:
        return {"data_bytes": self.limits.memory_bytes, "file_bytes": self.limits.file_bytes,
                "cpu_s": self.limits.cpu_s, "nproc": self.nproc}

    @property
    def cgroup_procs(self) -> str | None:
        """The file a process writes its pid to, to join the run's pids cgroup (the sandbox does it)."""
        return self.cap.procs_file if self.cap else None

    def shell_prefix(self, shell: str) -> str:
        """Lines run before the command: lower the limits (soft and hard)."""
        block = 512 if not shell.endswith("bash") else 1024  # POSIX sh counts ulimit -f in 512-byte blocks
        limits = [f"-d {self.limits.memory_bytes // 1024}", f"-f {self.limits.file_bytes // block}", "-c 0",
                  f"-t {int(self.limits.cpu_s) + 1}"] + ([f"-u {self.nproc}"] if self.nproc else [])
        return "; ".join(f"ulimit {limit} 2>/dev/null" for limit in limits) + "\n"

    def close(self) -> None:
        if self.cap:
            self.cap.close()
