"""Runs on disk: $MINIAGI_HOME/runs/RUN_ID/{trace.jsonl,result.json}.

trace.jsonl is the source of truth: one event per line, appended and flushed as the run goes, so a crash or a
SIGKILL loses at most the step in flight; `resume` rebuilds a run's state from it. result.json is the summary,
rewritten atomically as the run goes (at most every half second while it runs, and at its end).
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import re
import secrets
import socket
import stat
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

from memory.jsonl import json_lines

from .config import ConfigError
from .redaction import redact_data

STATUSES = ("done", "limit", "format_error", "stuck", "error", "interrupted", "running")
RESULT_MAX_BYTES = 16 * 2**20  # a result.json is a few KB: a larger "result" is not one
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")  # what an id (or a prefix of one) may hold: never a path
WHOLE_RUN_ID = re.compile(r"\d{8}-\d{6}-[0-9a-f]{6}")  # an id as new_run_id makes it, whole
NOT_KEPT = "a run refused before its first model reply is not kept: its error said \"was not kept\""


def miniagi_command(*args: str) -> list[str]:
    """How miniagi starts another miniagi (a batch's objective, the web UI's run): this Python with -P, so that the
    current directory — a work directory, where code writes json.py or memory.py — is not on sys.path, and nothing
    of it is imported outside the sandbox (-I before Python 3.11)."""
    return [sys.executable, "-P" if sys.version_info >= (3, 11) else "-I", "-m", "miniagi", *args]


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def new_run_id() -> str:
    """The start time, then six hex digits: the microsecond (in 4 µs steps) and one random digit, so that ids sort
    as their runs started, even several in one second (`last`, `runs`), and two runs never share one."""
    now = time.time()
    return f"{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}-{int(now % 1 * 1e6) >> 2:05x}" \
           f"{secrets.randbelow(16):x}"


def open_regular(path: Path, max_bytes: int | None = None):
    """A run file for reading (binary): a regular file only, never through a link, never waiting (a FIFO, a device
    or a link raises OSError at once, as does a file over max_bytes). Code the run executed may have been where
    these files are; whoever reads them (a command, the UI) must not hang on one or read without end."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path} is not a regular file")
        if max_bytes is not None and info.st_size > max_bytes:
            raise OSError(f"{path} is larger than {max_bytes // 2**20} MB")
        os.set_blocking(descriptor, True)
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


class RunRecord:
    """One run's folder. Every text written passes through `redact`, so no secret reaches the disk."""

    def __init__(self, directory: Path, redact: Callable[[str], str] = lambda text: text):
        self.dir = directory
        self.run_id = directory.name
        self.redact = redact
        self.trace_path = directory / "trace.jsonl"
        self.result_path = directory / "result.json"
        self._trace = None
        self._folder: int | None = None  # the folder, opened once (never through a link) for result.json's writes

    def append(self, event: dict) -> None:
        if self._trace is None:
            self.dir.mkdir(parents=True, exist_ok=True)
            torn = self.trace_path.exists() and self.trace_path.stat().st_size and not self._ends_with_newline()
            # unbuffered: each event goes to the OS at once (surviving SIGKILL), and a failed write (disk full)
            # leaves nothing behind in a buffer to fail again later
            descriptor = os.open(self.trace_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                                 | getattr(os, "O_CLOEXEC", 0), 0o644)  # never through a link
            self._trace = os.fdopen(descriptor, "ab", buffering=0)
            if torn:  # a line cut off by a crash or a full disk: end it, so the next event stands on its own
                self._write(b"\n")
        line = json.dumps(redact_data(self.redact, event), ensure_ascii=False, default=str)
        self._write(line.encode("utf-8") + b"\n")

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[self._trace.write(view):]

    def _ends_with_newline(self) -> bool:
        with open(self.trace_path, "rb") as handle:
            handle.seek(-1, os.SEEK_END)
            return handle.read(1) == b"\n"

    def write_result(self, result: dict) -> None:
        from .safefs import open_dir, replace_file

        if self._folder is None:
            self._folder = open_dir(self.dir)
        # a fresh temporary file (never through a link), renamed over result.json
        replace_file(self._folder, self.result_path.name, (json.dumps(redact_data(self.redact, result), indent=2,
                                                                  ensure_ascii=False) + "\n").encode("utf-8"))

    def read_result(self) -> dict:
        """result.json; a run still marked running whose process is gone (killed) reads as interrupted."""
        try:
            with open_regular(self.result_path, RESULT_MAX_BYTES) as handle:
                result = json.loads(handle.read())
        except (OSError, ValueError):
            return {}
        if not isinstance(result, dict):
            return {}
        if result.get("status") == "running" and _process_gone(result):
            result.update(status="interrupted", message=f"its process ({result.get('pid')}) is gone: it was killed "
                          f"or crashed. `miniagi resume {self.run_id}` continues it")
            result["ended_at"] = result.get("ended_at") or self._last_written()  # its clock stops where it died
        return result

    def _last_written(self) -> str | None:
        """When the run last wrote its trace or result (ISO, UTC)."""
        times = []
        for path in (self.trace_path, self.result_path):
            try:
                times.append(path.lstat().st_mtime)
            except OSError:
                pass
        if not times:
            return None
        return datetime.fromtimestamp(max(times), timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")

    def workdir(self) -> str | None:
        """The work directory the run was started in (from its run_start event), or None if not known."""
        first = self._start()
        workdir = (first.get("settings") or {}).get("workdir")
        return workdir if isinstance(workdir, str) and Path(workdir).is_absolute() else None  # older runs: "."

    def workdir_identity(self) -> list[int] | None:
        """What the work directory was at the run's start, [st_dev, st_ino] (see trust.recorded_workdir)."""
        found = self._start().get("workdir_id")
        return found if isinstance(found, list) and len(found) == 2 and all(type(n) is int for n in found) else None

    def _start(self) -> dict:
        try:
            with open_regular(self.trace_path) as trace:
                first = json.loads(trace.readline(RESULT_MAX_BYTES) or b"{}")
        except (OSError, ValueError):
            return {}
        return first if isinstance(first, dict) else {}

    def events(self, max_bytes: int | None = None) -> Iterator[dict]:
        """The trace's events; a line torn by a crash mid-write is skipped. A trace that is no regular file (or is
        over max_bytes) raises OSError."""
        if not self.trace_path.exists() and not self.trace_path.is_symlink():
            return
        with open_regular(self.trace_path, max_bytes) as handle:
            yield from json_lines(handle)  # bytes: split on b"\n" only

    def close(self) -> None:
        if self._trace is not None:
            self._trace.close()
            self._trace = None
        if self._folder is not None:
            os.close(self._folder)
            self._folder = None


def process_identity() -> dict:
    """What tells this process apart from a later one with the same pid: host, pid and start time (known once per
    process: result.json is written every step)."""
    return dict(_identity(os.getpid()))


@functools.lru_cache(maxsize=4)
def _identity(pid: int) -> tuple:
    return (("host", socket.gethostname()), ("pid", pid), ("pid_started", _start_time(pid)))


def _start_time(pid: int) -> float | None:
    """When the process with this pid started (seconds since the epoch, as the kernel tells it); None: there is none."""
    import psutil  # ~10 ms: only once a run records itself, or a running run is read

    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _process_gone(result: dict) -> bool:
    """Whether the process that wrote a running result has ended (known only on the machine it ran on)."""
    pid = result.get("pid")
    if not isinstance(pid, int) or result.get("host") != socket.gethostname() or result.get("pid_started") is None:
        return False
    return _start_time(pid) != result["pid_started"]


class RunStore:
    def __init__(self, home: Path, redact: Callable[[str], str] = lambda text: text):
        self.root = Path(home) / "runs"
        self.redact = redact

    def create(self) -> RunRecord:
        while True:
            directory = self.root / new_run_id()
            try:
                directory.mkdir(parents=True)
                return RunRecord(directory, self.redact)
            except FileExistsError:
                continue

    def open(self, run_id: str) -> RunRecord:
        """A run by its id, a unique prefix of it, or `last` (the newest run). This is the one way every command and
        the UI find a run: an id is a name under runs/, never a path."""
        run_id = run_id.strip()
        if run_id == "last":
            newest = self.results()
            if not newest:
                raise ConfigError(f"there is no run under {self.root} yet (see `miniagi runs`)")
            return RunRecord(self.root / newest[0]["run_id"], self.redact)
        if not RUN_ID.fullmatch(run_id):
            raise ConfigError(f"{run_id!r} is not a run id: ids look like {new_run_id()} (see `miniagi runs`; "
                              "`last` is the newest run)")
        names = sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.is_symlink()) \
            if self.root.is_dir() else []
        if run_id in names:
            return RunRecord(self.root / run_id, self.redact)
        matches = [name for name in names if name.startswith(run_id)]
        if len(matches) == 1:
            return RunRecord(self.root / matches[0], self.redact)
        if matches:
            shown = ", ".join(matches[:5]) + (", …" if len(matches) > 5 else "")
            raise ConfigError(f"{run_id!r} matches {len(matches)} runs ({shown}): give more of the id")
        closest = difflib.get_close_matches(run_id, names, n=3, cutoff=0.5) or names[-3:][::-1]
        hint = f"; the closest: {', '.join(closest)}" if closest else ""
        gone = f"; {NOT_KEPT}" if WHOLE_RUN_ID.fullmatch(run_id) else ""  # a whole id was printed once: say why
        raise ConfigError(f"no run {run_id!r} under {self.root}{hint} (see `miniagi runs`){gone}")

    def results(self, status: str | None = None) -> list[dict]:
        """Every run's result.json, newest first."""
        if not self.root.is_dir():
            return []
        found = []
        for directory in self.root.iterdir():
            result = RunRecord(directory).read_result() if directory.is_dir() else {}
            if result and (status is None or result.get("status") == status):
                found.append(dict(result, run_id=directory.name))  # the folder is the id, whatever the file says
        return sorted(found, key=lambda r: (r.get("started_at") or "", r.get("run_id") or ""), reverse=True)
