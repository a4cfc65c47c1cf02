"""Runs on disk: $MINIAGI_HOME/runs/RUN_ID/{trace.jsonl,result.json}.

trace.jsonl is the source of truth: one event per line, appended and flushed as the run goes, so a crash or a
SIGKILL loses at most the step in flight; `resume` rebuilds a run's state from it. result.json is the summary,
rewritten atomically after every step.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

from .config import ConfigError
from .redaction import redact_data

STATUSES = ("done", "limit", "format_error", "stuck", "error", "interrupted", "running")


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


class RunRecord:
    """One run's folder. Every text written passes through `redact`, so no secret reaches the disk."""

    def __init__(self, directory: Path, redact: Callable[[str], str] = lambda text: text):
        self.dir = directory
        self.run_id = directory.name
        self.redact = redact
        self.trace_path = directory / "trace.jsonl"
        self.result_path = directory / "result.json"
        self._trace = None

    def append(self, event: dict) -> None:
        if self._trace is None:
            self.dir.mkdir(parents=True, exist_ok=True)
            torn = self.trace_path.exists() and self.trace_path.stat().st_size and not self._ends_with_newline()
            # unbuffered: each event goes to the OS at once (surviving SIGKILL), and a failed write (disk full)
            # leaves nothing behind in a buffer to fail again later
            self._trace = open(self.trace_path, "ab", buffering=0)
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
        self.dir.mkdir(parents=True, exist_ok=True)
        partial = self.result_path.with_suffix(".json.tmp")
        partial.write_text(json.dumps(redact_data(self.redact, result), indent=2, ensure_ascii=False) + "\n",
                           encoding="utf-8")
        os.replace(partial, self.result_path)

    def read_result(self) -> dict:
        """result.json; a run still marked running whose process is gone (killed) reads as interrupted."""
        try:
            result = json.loads(self.result_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if result.get("status") == "running" and _process_gone(result):
            result.update(status="interrupted", message=f"its process ({result.get('pid')}) is gone: it was killed "
                          f"or crashed. `miniagi resume {self.run_id}` continues it")
        return result

    def workdir(self) -> str | None:
        """The work directory the run was started in (from its run_start event), or None if not known."""
        try:
            with self.trace_path.open("rb") as trace:
                first = json.loads(trace.readline() or b"{}")
        except (OSError, ValueError):
            return None
        workdir = (first.get("settings") or {}).get("workdir") if isinstance(first, dict) else None
        return workdir if isinstance(workdir, str) and Path(workdir).is_absolute() else None  # older runs: "."

    def events(self) -> Iterator[dict]:
        """The trace's events; a line torn by a crash mid-write is skipped."""
        if not self.trace_path.exists():
            return
        with open(self.trace_path, encoding="utf-8") as handle:
            for line in handle:
                try:
                    yield json.loads(line)
                except ValueError:
                    continue

    def close(self) -> None:
        if self._trace is not None:
            self._trace.close()
            self._trace = None


def process_identity() -> dict:
    """What tells this process apart from a later one with the same pid: host, pid and start time."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "pid_started": _start_time(os.getpid())}


def _start_time(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
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
        """A run by its id or an unambiguous prefix of it."""
        run_id = run_id.strip().rstrip("/")
        exact = self.root / run_id
        if run_id and exact.is_dir():
            return RunRecord(exact, self.redact)
        matches = sorted(p for p in self.root.glob(f"{run_id}*") if p.is_dir()) if run_id else []
        if len(matches) == 1:
            return RunRecord(matches[0], self.redact)
        if not matches:
            raise ConfigError(f"no run {run_id!r} under {self.root} (see `miniagi runs`)")
        raise ConfigError(f"{run_id!r} matches {len(matches)} runs: give more of the id")

    def results(self, status: str | None = None) -> list[dict]:
        """Every run's result.json, newest first."""
        if not self.root.is_dir():
            return []
        found = []
        for directory in self.root.iterdir():
            result = RunRecord(directory).read_result() if directory.is_dir() else {}
            if result and (status is None or result.get("status") == status):
                found.append(result)
        return sorted(found, key=lambda r: (r.get("started_at") or "", r.get("run_id") or ""), reverse=True)
