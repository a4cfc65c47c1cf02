"""One run's checkpoints on disk, in `$MINIAGI_HOME/runs/RUN_ID/checkpoints/` (hidden from executed code):

- `blobs`: every file content kept, once each (content-addressed: sha256), appended one after another;
- `log.jsonl`: one record per checkpoint, in the order they were taken: its kind (`start`: the tree before the
  run; `step`: what step N changed; `outside`: what changed between steps, not by the run; `undo`: what
  `miniagi undo` put back), the step it belongs to, the paths that changed (each its new `Entry`, or null: gone)
  and where the contents it added lie in `blobs`.

A record's `step` orders it: N for step N's own changes, N + 0.5 for what happened after step N (outside changes
before the next step, an undo), 0 for the start. The tree after step k is every record with step ≤ k applied in
order. Blobs are written before the record that names them; a record torn by a crash is skipped."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from memory.jsonl import json_lines

from ..errors import ConfigError
from ..safefs import append, open_dir
from .tree import Entry

CHUNK = 1 << 20
BLOBS, LOG = "blobs", "log.jsonl"
OPEN_FLAGS = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class StoreError(ConfigError):
    """The checkpoints cannot be read (missing, damaged, changed by someone else): one line, as a usage error."""


@dataclass
class Record:
    kind: str  # start | step | outside | undo
    step: float
    changes: dict[str, Entry | None]
    blobs: dict[str, list[int]] = field(default_factory=dict)  # digest → [offset, size] in blobs
    workdir: str = ""  # the start record's: where the tree is
    time: str = ""

    def to_json(self) -> dict:
        data = {"kind": self.kind, "step": self.step, "time": self.time,
                "changes": {path: None if entry is None else entry.to_json() for path, entry in self.changes.items()},
                "blobs": self.blobs}
        if self.workdir:
            data["workdir"] = self.workdir
        return data

    @classmethod
    def from_json(cls, data: dict) -> Record:
        return cls(str(data["kind"]), float(data["step"]),
                   {str(path): Entry.from_json(entry) for path, entry in data["changes"].items()},
                   {str(digest): [int(n) for n in where] for digest, where in (data.get("blobs") or {}).items()},
                   str(data.get("workdir") or ""), str(data.get("time") or ""))


class Store:
    """Reads and writes one run's checkpoints folder. Every file in it is opened through the folder's descriptor,
    never through a link."""

    def __init__(self, folder: Path, create: bool = False):
        self.folder = folder
        if not create and not folder.is_dir():
            raise StoreError(f"no checkpoints in {folder.parent} (the run was made with --no-checkpoints, or by a "
                             "miniagi older than checkpoints)")
        self.fd = open_dir(folder) if create else os.open(folder, os.O_RDONLY | os.O_DIRECTORY | OPEN_FLAGS)
        self.records: list[Record] = []
        self.index: dict[str, list[int]] = {}  # every blob kept: digest → [offset, size]
        self._blobs: int | None = None
        self._end = 0
        self._torn = False  # the log's last line was cut off (a crash mid-write): the next record starts a new one
        self._read_log()

    def _read_log(self) -> None:
        try:
            descriptor = os.open(LOG, os.O_RDONLY | OPEN_FLAGS, dir_fd=self.fd)
        except FileNotFoundError:
            return
        with os.fdopen(descriptor, "rb") as log:
            data = log.read()
        self._torn = bool(data) and not data.endswith(b"\n")
        for value in json_lines(data.split(b"\n")):  # a line torn by a crash mid-write is skipped
            try:
                record = Record.from_json(value)
            except (ValueError, KeyError, TypeError, AttributeError):
                continue  # not a record
            self.records.append(record)
            self.index.update(record.blobs)

    # --- writing ----------------------------------------------------------------------------------------------
    def _open_blobs(self) -> int:
        if self._blobs is None:
            self._blobs = os.open(BLOBS, os.O_RDWR | os.O_CREAT | OPEN_FLAGS, 0o600, dir_fd=self.fd)
            info = os.fstat(self._blobs)
            if not stat.S_ISREG(info.st_mode):
                raise OSError(f"{self.folder / BLOBS} is not a regular file")
            self._end = info.st_size
        return self._blobs

    def keep(self, source: int, size_limit: int, secrets: Secrets | None,
             added: dict[str, list[int]]) -> tuple[str, int, str]:
        """The content of the open file `source` kept, once (a content kept before is not written again): its digest,
        its size and "" — or "", the size read and why it is not kept (it grew past `size_limit`, or it holds one of
        the `secrets`). A new blob is noted in `added` (digest → [offset, size])."""
        blobs = self._open_blobs()
        start, digest, size = self._end, hashlib.sha256(), 0
        tail, overlap = b"", (secrets.longest - 1) if secrets else 0
        why = ""
        while True:
            chunk = os.read(source, CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > size_limit:
                why = f"over {size_limit / 2**20:g} MB"
                break
            if secrets is not None and secrets.pattern.search(tail + chunk):
                why = "holds a secret"
                break
            tail = chunk[-overlap:] if overlap else b""
            digest.update(chunk)
            view, at = memoryview(chunk), start + size - len(chunk)
            while view:
                written = os.pwrite(blobs, view, at)
                view, at = view[written:], at + written
        name = digest.hexdigest()
        if why or name in self.index or name in added:
            os.ftruncate(blobs, start)
            return ("", size, why) if why else (name, size, "")
        added[name] = [start, size]
        self._end = start + size
        return name, size, ""

    def forget(self, added: dict[str, list[int]]) -> None:
        """Contents kept for a record that will not be written: the blobs file is cut back to before them."""
        if added and self._blobs is not None:
            self._end = min(offset for offset, _ in added.values())
            os.ftruncate(self._blobs, self._end)

    def append(self, record: Record) -> None:
        """The record after the blobs it names (they are on disk first: a crash between leaves an unnamed tail)."""
        line = json.dumps(record.to_json(), separators=(",", ":")) + "\n"
        append(self.fd, LOG, (("\n" if self._torn else "") + line).encode())
        self._torn = False
        self.records.append(record)
        self.index.update(record.blobs)

    # --- reading -----------------------------------------------------------------------------------------------
    def content(self, digest: str) -> bytes:
        """A kept content, checked against its digest."""
        where = self.index.get(digest)
        if where is None:
            raise StoreError(f"the content {digest[:12]} is not in {self.folder / BLOBS}")
        data = os.pread(self._open_blobs(), where[1], where[0])
        if hashlib.sha256(data).hexdigest() != digest:
            raise StoreError(f"{self.folder / BLOBS} is damaged: the content {digest[:12]} does not match its digest")
        return data

    def tree(self, upto: float = float("inf")) -> dict[str, Entry]:
        """The tree after every record with step ≤ upto, applied in order."""
        tree: dict[str, Entry] = {}
        for record in self.records:
            if record.step <= upto:
                apply(tree, record.changes)
        return tree

    @property
    def workdir(self) -> str:
        return self.records[0].workdir if self.records else ""

    def close(self) -> None:
        if self._blobs is not None:
            os.close(self._blobs)
            self._blobs = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def apply(tree: dict[str, Entry], changes: dict[str, Entry | None]) -> None:
    for path, entry in changes.items():
        if entry is None:
            tree.pop(path, None)
        else:
            tree[path] = entry


@dataclass(frozen=True)
class Secrets:
    """What a kept content must not hold: the secrets the run knows (their values and spellings)."""

    pattern: re.Pattern
    longest: int

    @classmethod
    def of(cls, values) -> Secrets | None:
        values = sorted({v.encode() for v in values if v}, key=len, reverse=True)
        return cls(re.compile(b"|".join(map(re.escape, values))), len(values[0])) if values else None
