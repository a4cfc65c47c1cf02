"""Checkpoints: every change a run makes to the files of its work directory, kept so that it can be shown
(`miniagi diff`) and undone (`miniagi undo`). Cline keeps a shadow git repository per task and Aider commits each
change for /undo; miniagi keeps its own content-addressed store under the run's folder (store.py), which executed
code cannot see, and never touches a git repository the work directory may be.

A run holds one `Checkpoints`: the tree as it was before the run is kept first (in a thread, while the model thinks
of the first step); then, around each step whose command may change files (code, shell, an MCP tool), one walk
before (what changed outside the run since: kept apart, never undone) and one after (what the step changed). A walk
stats every path and reads only the files whose stat moved (tree.py), so a step that changed nothing costs a stat
per path, and one that changed much costs what it changed."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Callable, Iterable, Iterator

from ..run_store import now_iso
from .store import Record, Secrets, Store
from .tree import Entry, TooLarge, inside, walk

FOLDER = "checkpoints"  # in the run's folder
MAX_KEPT_BYTES = 2 * 2**30  # what one checkpoint may add to the store: more is no work directory (a home, a disk)
LEFT_OUT_SHOWN = 4  # paths named in the one line that says what is not kept


class Checkpoints:
    def __init__(self, workdir: Path, run_dir: Path, *, file_limit_bytes: int, secrets: Iterable[str] = (),
                 warn: Callable[[str], None] = lambda text: None, completed_step: int = 0):
        self.workdir = str(workdir)
        self.skip = inside(workdir, home_of(run_dir))  # a work directory that holds the home (miniagi run in ~)
        self.file_limit = file_limit_bytes
        self.secrets = Secrets.of(secrets)
        self.warn = warn
        self.store = Store(run_dir / FOLDER, create=True)
        self.tree: dict[str, Entry] = self.store.tree()  # as recorded last
        self.walked: dict = {}  # path → (stat signature, Entry) as the last walk found it
        self.walked_ns = 0
        self.left_out: list[str] = []  # files not kept, until the run has said what it leaves out
        self.told = False
        self.broken = ""  # why checkpoints stopped for this run
        self.changed: dict[int, dict[str, str]] = {}  # step → what it changed, until its observation
        self.unsaid: list[str] = []  # what to tell the person, said from the loop's thread (in order with the steps)
        self.lock = threading.Lock()
        # a new run keeps the tree first; a resumed one notes what changed while it stood still
        first = ("start", completed_step) if not self.store.records else ("outside", completed_step + 0.5)
        self.first = threading.Thread(target=self._take, args=first, name="checkpoints-start", daemon=True)
        self.first.start()

    @contextlib.contextmanager
    def step(self, number: int, command: str) -> Iterator[None]:
        """Around step `number`'s command: what changed since the last checkpoint is kept as an outside change
        first, and what the command changed after it (also when it is interrupted)."""
        if not may_change_files(command):
            yield
            return
        self.first.join()
        self._take("outside", number - 0.5)
        self._say()
        try:
            yield
        finally:
            self.changed[number] = self._take("step", number)

    def files(self, number: int) -> dict[str, str] | None:
        """What step `number` changed, for its observation: each path (a folder's with a trailing /) → added,
        modified or deleted (None once checkpoints stopped: not known)."""
        self._say()
        changed = self.changed.pop(number, {})
        return None if self.broken else changed

    def _say(self) -> None:
        while self.unsaid:
            self.warn(self.unsaid.pop(0))

    def _take(self, kind: str, step: float) -> dict[str, str]:
        with self.lock:
            if self.broken:
                return {}
            try:
                return self._record(kind, step)
            except TooLarge as exc:
                self.broken = str(exc)
                self.unsaid.append(f"checkpoints are off for the rest of this run: {exc} (give a smaller --workdir, "
                                   "or --no-checkpoints)")
                return {}
            except Exception as exc:  # the disk, or a bug: the run goes on without checkpoints, and says so
                self.broken = f"{type(exc).__name__}: {exc}"
                self.unsaid.append(f"checkpoints stopped for this run (undo covers the steps before): {self.broken}")
                return {}

    def _record(self, kind: str, step: float) -> dict[str, str]:
        added: dict[str, list[int]] = {}
        kept = [0]

        def keep(descriptor: int, info, path: str) -> Entry:
            mode = info.st_mode & 0o7777
            if info.st_size > self.file_limit:
                entry = Entry("file", mode, info.st_size, not_kept=f"over {self.file_limit / 2**20:g} MB")
            else:
                digest, size, why = self.store.keep(descriptor, self.file_limit, self.secrets, added)
                entry = Entry("file", mode, size, digest, not_kept=why)
                kept[0] += size
                if kept[0] > MAX_KEPT_BYTES:
                    raise TooLarge(f"the work directory holds over {MAX_KEPT_BYTES / 2**30:g} GB to keep")
            if entry.not_kept and not self.told:
                self.left_out.append(f"{path} ({entry.not_kept})")
            return entry

        try:
            found = walk(self.workdir, self.walked, keep, self.walked_ns, self.skip)
        except BaseException:
            self.store.forget(added)  # contents no record will name
            raise
        self.walked, self.walked_ns = found.entries, found.started_ns
        changes: dict[str, Entry | None] = {}
        for path in found.fresh:  # the others are as the last walk found them, and that is recorded
            entry = found.entries[path][1]
            if self.tree.get(path) != entry:
                changes[path] = entry
        new_paths = sum(path not in self.tree for path in changes)
        if len(found.entries) - new_paths < len(self.tree):  # something recorded is gone
            for path in self.tree.keys() - found.entries.keys():
                changes[path] = None
        described = describe(changes, self.tree)
        if changes or kind == "start":
            self.store.append(Record(kind, step, changes, added, self.workdir if kind == "start" else "", now_iso()))
            for path, entry in changes.items():
                if entry is None:
                    del self.tree[path]
                else:
                    self.tree[path] = entry
        else:
            self.store.forget(added)  # read again and found as it was recorded, in a content new to the store
        self._tell(found.ignored)
        return described

    def _tell(self, ignored: list[str]) -> None:
        """Once a run: what its checkpoints leave out, so undo cannot bring back."""
        if self.told or not (ignored or self.left_out):
            return
        self.told = True
        left = [f"{path}/ (a folder never kept)" for path in ignored] + self.left_out
        more = f" and {len(left) - LEFT_OUT_SHOWN} more" if len(left) > LEFT_OUT_SHOWN else ""
        self.unsaid.append(f"checkpoints: not kept, so undo cannot bring them back: "
                           f"{', '.join(left[:LEFT_OUT_SHOWN])}{more}")
        self.left_out = []

    def close(self) -> None:
        self.first.join()
        with self.lock:
            self.store.close()


class NoCheckpoints:
    """--no-checkpoints: steps run as they are, observations carry no `files`."""

    @contextlib.contextmanager
    def step(self, number: int, command: str) -> Iterator[None]:
        yield

    def files(self, number: int) -> None:
        return None

    def close(self) -> None:
        pass


def open_checkpoints(settings, run_dir: Path, secrets: Iterable[str], warn: Callable[[str], None],
                     completed_step: int) -> Checkpoints | NoCheckpoints:
    if not settings.checkpoints:
        return NoCheckpoints()
    try:
        return Checkpoints(settings.workdir_path, run_dir, file_limit_bytes=settings.checkpoint_max_file * 2**20,
                           secrets=secrets, warn=warn, completed_step=completed_step)
    except OSError as exc:  # the run goes on without them
        warn(f"checkpoints are off for this run: {exc.strerror or exc}")
        return NoCheckpoints()


def home_of(run_dir: Path) -> Path:
    """$MINIAGI_HOME, from a run's folder in it (HOME/runs/RUN_ID)."""
    return run_dir.parent.parent


def may_change_files(command: str) -> bool:
    """Code, the shell and MCP tools may change files; the agent's own commands (notes, search, reading, the
    person, done) do not."""
    from ..commands import COMMANDS

    found = COMMANDS.get(command)
    return found is None or found.needs_approval


def describe(changes: dict[str, Entry | None], before: dict[str, Entry]) -> dict[str, str]:
    """Each changed path (a folder's with a trailing /) → added, modified or deleted."""
    described = {}
    for path in sorted(changes):
        entry, old = changes[path], before.get(path)
        shown = path + "/" if (entry or old).kind == "folder" else path
        described[shown] = "added" if old is None else "deleted" if entry is None else "modified"
    return described
