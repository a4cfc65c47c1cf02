"""Limits on the code the agent runs, so a fork bomb, a 50 GB allocation or a disk-filling loop cannot take the
machine down — and so that code cannot lift them from inside.

Every execute_python worker and execute_shell command gets:
- memory: RLIMIT_DATA per process (an allocation past it fails at once with MemoryError / ENOMEM), and, where a
  memory cgroup can be made, the same figure for all of the run's code together, shared and anonymous mappings
  included (`mmap.mmap(-1, …)` is not counted by RLIMIT_DATA): past it the kernel's OOM killer ends a process;
- number of processes: a cgroup `pids` limit where one can be made (always as root, where RLIMIT_NPROC is not
  enforced), else RLIMIT_NPROC set to what the user already runs plus the allowance;
- CPU time: RLIMIT_CPU per snippet / command, on top of the wall-clock --exec-timeout;
- file size: RLIMIT_FSIZE at what is left of `--exec-disk`, and in total `--exec-disk`: every byte the run's
  processes write to disk is counted (the kernel's per-process I/O accounting, `write_bytes`), and so is every
  block allocated in the work directory and every file made there; code that goes past it is stopped. fallocate,
  which allocates blocks at once without writing them, is refused inside the namespace kinds (nsinit.py), so no
  single command can allocate past the meter before it looks;
- no core dumps.

Hard limits (rlimits) can only be lowered from inside. The cgroups' files are out of the code's reach where the
sandbox keeps them so: read-only under bwrap and in the namespace sandbox (whose init remounts them read-only and
drops its privileges); with no sandbox, code running as root can rewrite them.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
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
    disk_mb: int = 10240

    @property
    def memory_bytes(self) -> int:
        return self.memory_mb * 2**20

    @property
    def file_bytes(self) -> int:
        return min(self.file_mb, self.disk_mb) * 2**20

    @property
    def disk_bytes(self) -> int:
        return self.disk_mb * 2**20

    @property
    def files(self) -> int:
        """How many files code may make in the work directory: one per 16 KB of --exec-disk, at least 10,000."""
        return max(10_000, self.disk_bytes // 16384)


def _user_process_count() -> int:
    import psutil

    uid = os.getuid()
    return sum(1 for process in psutil.process_iter(["uids"])
               if process.info["uids"] and process.info["uids"].real == uid)


def _hierarchies() -> list[tuple[Path, set[str]]]:
    """Where cgroups of our own may be created, with the controllers each offers: every cgroup v1 hierarchy at
    our own cgroup in it, and our own cgroup v2 node when its subtree_control delegates controllers."""
    found = []
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
        membership = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return found
    for line in mounts:
        fields = line.split()
        if len(fields) < 4:
            continue
        mount_point, kind, options = fields[1], fields[2], set(fields[3].split(","))
        if kind == "cgroup":
            controllers = options & {"pids", "memory"}
            own = next((m.split(":", 2)[2] for m in membership
                        if controllers and controllers <= set(m.split(":", 2)[1].split(","))), None)
            if controllers and own is not None:
                found.append((Path(mount_point) / own.lstrip("/"), controllers))
        elif kind == "cgroup2":
            own = next((m.split(":", 2)[2] for m in membership if m.startswith("0::")), "/")
            # our own node, else (as root) the hierarchy's top, which may delegate what our node cannot
            for root in dict.fromkeys([Path(mount_point) / own.lstrip("/"), Path(mount_point)]):
                try:
                    delegated = set((root / "cgroup.subtree_control").read_text().split()) & {"pids", "memory"}
                except OSError:
                    continue
                if delegated:
                    found.append((root, delegated))
    return found


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
        return True
    except OSError:
        return False


class RunCgroups:
    """One run's cgroups (one per v1 hierarchy, or one v2 node): a process cap and a memory cap for all of its
    executed code. What could be had is in `limits_processes` / `limits_memory`; neither, on a system that
    gives us no cgroup."""

    def __init__(self, limits: Limits):
        self.paths: list[Path] = []
        self.controllers: set[str] = set()
        name = f"miniagi-{os.getpid()}-{secrets.token_hex(3)}"
        for root, offered in _hierarchies():
            wanted = offered - self.controllers
            if not wanted:
                continue
            path = root / name
            try:
                path.mkdir()
            except OSError:
                continue
            got = set()
            if "pids" in wanted and _write(path / "pids.max", str(limits.processes)):
                got.add("pids")
            if "memory" in wanted and self._cap_memory(path, limits.memory_bytes):
                got.add("memory")
            if got:
                self.paths.append(path)
                self.controllers |= got
            else:
                _remove(path)

    @staticmethod
    def _cap_memory(path: Path, limit: int) -> bool:
        if (path / "memory.max").exists():  # v2; no swapping past the limit either
            _write(path / "memory.swap.max", "0")
            return _write(path / "memory.max", str(limit))
        if not _write(path / "memory.limit_in_bytes", str(limit)):
            return False
        _write(path / "memory.memsw.limit_in_bytes", str(limit))  # only where swap accounting is on
        return True

    @property
    def limits_processes(self) -> bool:
        return "pids" in self.controllers

    @property
    def limits_memory(self) -> bool:
        return "memory" in self.controllers

    @property
    def procs_files(self) -> list[str]:
        """The files a process writes its pid to, to join the run's cgroups (the sandbox's launcher does it)."""
        return [str(path / "cgroup.procs") for path in self.paths]

    def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer has ended in the run's memory cgroup."""
        for path in self.paths:
            for name, key in (("memory.events", "oom_kill"), ("memory.oom_control", "oom_kill")):
                try:
                    for line in (path / name).read_text().splitlines():
                        field, _, value = line.partition(" ")
                        if field == key:
                            return int(value)
                except (OSError, ValueError):
                    continue
        return 0

    def _members(self) -> list[int]:
        pids: set[int] = set()
        for path in self.paths:
            try:
                pids.update(int(p) for p in (path / "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                continue
        return sorted(pids)

    def kill_all(self, timeout_s: float = 5.0) -> bool:
        """Kill every process in the cgroups; True when they are empty. New forks are refused first, so a fork
        bomb cannot refill them while we kill."""
        for path in self.paths:
            if (path / "pids.max").exists():
                _write(path / "pids.max", "1")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            members = self._members()
            if not members:
                return True
            for pid in members:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.01)
        return False

    def close(self) -> None:
        if self.paths and self.kill_all():
            for path in self.paths:
                _remove(path)
        self.paths = []


def _remove(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass


class DiskMeter:
    """What the run's executed code has put on disk, against `--exec-disk`: the larger of two readings.

    - Bytes written: the kernel counts, per process, the bytes it made dirty in the page cache (`write_bytes` in
      /proc/PID/io), and adds a child's count to its parent's when the parent reaps it. So a launch's whole tree —
      the launcher, the sandbox's init (which reaps every orphan) and what runs inside — is read as the sum over
      its live processes, and once the launcher is reaped, from its rusage. The highest reading is kept, so
      processes killed when the sandbox ends still count.
    - Blocks allocated in the work directory since the run began (st_blocks, whatever call made them:
      `fallocate` and `posix_fallocate` dirty no page), and the number of files there, against a cap of its own
      (`Limits.files`: empty files cost inodes, not blocks).

    Read four times a second while code runs (the work directory's walk no more often than twice a second, and
    rarer when it is slow; always once a launch has ended): past the limit, the code is stopped."""

    def __init__(self, limit_bytes: int, places: tuple[Path, ...] = (), file_limit: int | None = None):
        self.limit = limit_bytes
        self.file_limit = file_limit
        self.finished = 0  # bytes written by launches that have ended
        self.live: dict[int, int] = {}  # launcher pid → the most its tree was seen to have written
        self.places = places
        self.base_blocks, self.base_files = _allocated(places)
        self.grown_blocks = self.grown_files = 0
        self._next_walk = 0.0

    def started(self, leader: int) -> None:
        self.live[leader] = 0

    def ended(self, leader: int, rusage=None) -> None:
        seen = self.live.pop(leader, 0)
        reaped = rusage.ru_oublock * 512 if rusage is not None else 0
        self.finished += max(seen, reaped)
        if self.places:
            self._walk()  # what the launch left (even when walks are slow)

    def _walk(self) -> None:
        started = time.monotonic()
        blocks, files = _allocated(self.places)
        self.grown_blocks = max(self.grown_blocks, blocks - self.base_blocks)
        self.grown_files = max(self.grown_files, files - self.base_files)
        now = time.monotonic()
        self._next_walk = now + max(WALK_EVERY_S, 20 * (now - started))

    def written(self) -> int:
        for leader in self.live:
            self.live[leader] = max(self.live[leader], _tree_write_bytes(leader))
        if self.places and time.monotonic() >= self._next_walk:
            self._walk()
        return max(self.finished + sum(self.live.values()), self.grown_blocks)

    def left(self, fresh: bool = False) -> int:
        """What is left; fresh (before a snippet or command starts), with the work directory walked now: a
        warm Python worker's snippet ends with no launch ending."""
        if fresh and self.places:
            self._walk()
        left = max(0, self.limit - self.written())
        return 0 if self.file_limit is not None and self.grown_files > self.file_limit else left

    def describe(self) -> str:
        if self.file_limit is not None and self.grown_files > self.file_limit:
            return (f"executed code has made {self.grown_files:,} files in the work directory in this run, past the "
                    f"limit of {self.file_limit:,} that --exec-disk {self.limit // 2**20:,} gives")
        return (f"executed code has written {self.written() / 2**20:,.0f} MB to disk in this run, past its limit of "
                f"{self.limit / 2**20:,.0f} MB (--exec-disk)")


WALK_EVERY_S = 0.5


def _allocated(places: tuple[Path, ...]) -> tuple[int, int]:
    """Bytes allocated (st_blocks × 512) and entries, under these folders; links are not followed, a file's blocks
    are counted once however many hard links it has (a link allocates nothing), and other file systems mounted
    inside are counted too (the --sandbox-allow ones are bound there)."""
    blocks = files = 0
    linked: set[tuple[int, int]] = set()
    pending = [str(place) for place in places]
    while pending:
        try:
            with os.scandir(pending.pop()) as entries:
                for entry in entries:
                    files += 1
                    try:
                        info = entry.stat(follow_symlinks=False)
                        if info.st_nlink > 1 and not entry.is_dir(follow_symlinks=False):
                            if (info.st_dev, info.st_ino) in linked:
                                continue
                            linked.add((info.st_dev, info.st_ino))
                        blocks += info.st_blocks * 512
                        if entry.is_dir(follow_symlinks=False):
                            pending.append(entry.path)
                    except OSError:
                        continue
        except OSError:
            continue
    return blocks, files


def _tree_write_bytes(leader: int) -> int:
    total, pending, seen = 0, [leader], set()
    while pending:
        pid = pending.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += _write_bytes(pid)
        pending.extend(children(pid))
    return total


def _write_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/io", "rb") as io:
            for line in io.read(4096).splitlines():
                if line.startswith(b"write_bytes:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def children(pid: int) -> list[int]:
    """The kernel's own list of a process's children. (Not psutil's children(), which reads every process on
    the machine to find them: slow during a fork bomb.)"""
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children", "rb") as listing:
                found.extend(int(p) for p in listing.read().split())
    except (OSError, ValueError):
        pass
    return found


class RunLimits:
    """The limits of one run: its cgroups and disk meter, the rlimits its Python worker sets on itself (see
    worker.py) and the `ulimit` line that starts each shell command (so no code of ours runs between fork and
    exec)."""

    def __init__(self, limits: Limits, workdir: Path | None = None):
        self.limits = limits
        self.cgroups = RunCgroups(limits)
        self.disk = DiskMeter(limits.disk_bytes, (workdir,) if workdir else (), limits.files)
        # RLIMIT_NPROC counts every process of the user; root ignores it (the cgroup covers root)
        self.nproc = (None if self.cgroups.limits_processes or os.getuid() == 0
                      else _user_process_count() + limits.processes)

    def gaps(self) -> list[str]:
        """What these limits cannot hold on this system, in words."""
        found = []
        if not self.cgroups.limits_memory:
            found.append("shared memory (mmap) is not counted in --exec-memory (no memory cgroup could be made)")
        if self.nproc is None and not self.cgroups.limits_processes:
            found.append("the number of processes is not capped (running as root with no pids cgroup)")
        return found

    def file_allowance(self, disk_left: int) -> int:
        """How large a file the next snippet or command may write: no more than is left of --exec-disk."""
        return min(self.limits.file_bytes, disk_left)

    def worker_settings(self) -> dict:
        return {"data_bytes": self.limits.memory_bytes, "file_bytes": self.limits.file_bytes,
                "cpu_s": self.limits.cpu_s, "nproc": self.nproc}

    def shell_prefix(self, shell: str, disk_left: int) -> str:
        """Lines run before the command: lower the limits (soft and hard)."""
        block = 512 if not shell.endswith("bash") else 1024  # POSIX sh counts ulimit -f in 512-byte blocks
        limits = [f"-d {self.limits.memory_bytes // 1024}", f"-f {self.file_allowance(disk_left) // block}", "-c 0",
                  f"-t {int(self.limits.cpu_s) + 1}"] + ([f"-u {self.nproc}"] if self.nproc else [])
        return "; ".join(f"ulimit {limit} 2>/dev/null" for limit in limits) + "\n"

    def close(self) -> None:
        self.cgroups.close()
