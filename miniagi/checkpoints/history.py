"""What a run's checkpoints tell afterwards: the diff of the run or of one step (`miniagi diff`), and the undo that
puts the work directory back as it was before the run or after a step (`miniagi undo`).

Undo changes only paths the run changed after that step, and only where they still are as the run left them: a
path changed since by anyone else (the person, another run) is left alone and named. Everything it writes goes
through folder descriptors opened without following links, so a link planted in the work directory cannot send a
restored file elsewhere, and the work directory itself is opened one name at a time from /, so a link put on its
path (by code of a run working above it) cannot either: undo refuses, as resume and replay do
(trust.recorded_workdir)."""

from __future__ import annotations

import difflib
import hashlib
import os
import secrets
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..run_store import now_iso
from ..safefs import open_path_dir
from . import FOLDER, describe, home_of
from .store import Record, Store, StoreError
from .tree import DIR_FLAGS, FILE_FLAGS, Entry, TooLarge, inside, walk

DIFF_MAX_BYTES = 4 * 2**20  # a text larger than this is named, not diffed (difflib's time grows with its square)


@dataclass
class Change:
    path: str
    old: Entry | None
    new: Entry | None


def steps_of(store: Store) -> list[int]:
    """The steps that changed files."""
    return sorted({int(record.step) for record in store.records if record.kind == "step" and record.changes})


def last_step(store: Store) -> int:
    return max((int(record.step) for record in store.records if record.kind == "step"), default=0)


def run_changes(store: Store, step: int | None = None) -> list[Change]:
    """What the run did (from before it to after its last step), or what step `step` did."""
    if step is None:
        end = last_step(store)
        before, after = store.tree(0), store.tree(end)
        records = [r for r in store.records if r.kind == "step"]
    else:
        before, after = store.tree(step - 0.5), store.tree(step)
        records = [r for r in store.records if r.kind == "step" and r.step == step]
    paths = sorted(set().union(*(record.changes for record in records)))
    return [Change(path, before.get(path), after.get(path)) for path in paths
            if not _same(before.get(path), after.get(path))]


# --- undo --------------------------------------------------------------------------------------------------------
@dataclass
class Plan:
    to_step: int
    changes: list[Change] = field(default_factory=list)  # old: as it is now; new: as it will be
    left: list[tuple[str, str]] = field(default_factory=list)  # paths undo will not touch, and why


def plan_undo(store: Store, workdir: str, to_step: int) -> Plan:
    """What undoing to the tree after `to_step` (0: before the run) changes, and what it leaves alone."""
    plan = Plan(to_step)
    target, last = store.tree(to_step), store.tree()
    later = [record for record in store.records if record.step > to_step]
    ran = set().union(*(r.changes for r in later if r.kind in ("step", "undo")))
    outside = set().union(*(r.changes for r in later if r.kind == "outside"))
    now = current(workdir, ran, inside(Path(workdir), home_of(store.folder.parent)))
    for path in sorted(ran):
        present, wanted, left_by_run = now.get(path), target.get(path), last.get(path)
        if _same(present, wanted):
            continue
        if not _same(present, left_by_run):
            plan.left.append((path, "changed since, outside the run"))
        elif path in outside:
            plan.left.append((path, f"changed outside the run while it ran, after step {to_step}"))
        elif wanted is not None and wanted.kind == "file" and not wanted.digest:
            plan.left.append((path, f"its content was not kept ({wanted.not_kept})"))
        else:
            plan.changes.append(Change(path, present, wanted))
    return plan


def current(workdir: str, paths: set[str], skip: frozenset[str]) -> dict[str, Entry]:
    """The work directory as it is now (the contents of `paths` hashed, nothing kept)."""

    def digest(descriptor: int, info, path: str) -> Entry:
        if path not in paths:
            return Entry("file", info.st_mode & 0o7777, info.st_size)
        hashed, size = hashlib.sha256(), 0
        while chunk := os.read(descriptor, 1 << 20):
            hashed.update(chunk)
            size += len(chunk)
        return Entry("file", info.st_mode & 0o7777, size, hashed.hexdigest())

    return {path: entry for path, (_, entry) in walk(workdir, {}, digest, skip=skip).entries.items()}


def apply_undo(store: Store, workdir: str, plan: Plan, run_steps: int) -> list[tuple[str, str]]:
    """Make the plan's changes; returns the paths that could not be changed, and why. What was done is recorded
    (an `undo` record, after the run's `run_steps` steps): the run's checkpoints know the tree as undo left it."""
    done: dict[str, Entry | None] = {}
    failed: list[tuple[str, str]] = []
    root = open_path_dir(workdir)  # (no link on its path either: undo checked it)
    try:
        # away first, deepest first: what the target does not have, and what changes kind
        for change in sorted(plan.changes, key=lambda c: c.path.count("/"), reverse=True):
            if change.old is not None and (change.new is None or change.new.kind != change.old.kind):
                try:
                    _remove(root, change.path, change.old)
                    done[change.path] = None
                except OSError as exc:
                    failed.append((change.path, _why(exc, change.old)))
        # then back, shallowest first; a folder's own mode last (it may forbid writing into it)
        ordered = sorted(plan.changes, key=lambda c: c.path.count("/"))
        for change in ordered:
            if change.new is None or change.path in dict(failed):
                continue
            try:
                _put(root, change.path, change.new, store, fresh=change.path in done or change.old is None)
                done[change.path] = change.new
            except (OSError, StoreError) as exc:
                failed.append((change.path, str(exc.strerror or exc) if isinstance(exc, OSError) else str(exc)))
        for change in reversed(ordered):
            if change.new is not None and change.new.kind == "folder" and change.path in done:
                try:
                    with _parent(root, change.path) as (folder, name):
                        os.chmod(name, change.new.mode, dir_fd=folder, follow_symlinks=False)
                except OSError as exc:
                    failed.append((change.path, str(exc.strerror or exc)))
    finally:
        os.close(root)
        if done:
            store.append(Record("undo", max(run_steps, last_step(store)) + 0.5, done, time=now_iso()))
    return failed


class _parent:
    """The folder that holds `path` (opened from the root one name at a time, never through a link), and the
    path's own name."""

    def __init__(self, root: int, path: str):
        self.root, self.parts = root, path.split("/")
        self.opened: list[int] = []

    def __enter__(self) -> tuple[int, str]:
        folder = self.root
        for part in self.parts[:-1]:
            folder = os.open(part, DIR_FLAGS, dir_fd=folder)
            self.opened.append(folder)
        return folder, self.parts[-1]

    def __exit__(self, *exc) -> None:
        for descriptor in self.opened:
            os.close(descriptor)


def _remove(root: int, path: str, entry: Entry) -> None:
    with _parent(root, path) as (folder, name):
        if entry.kind == "folder":
            os.rmdir(name, dir_fd=folder)
        else:
            os.unlink(name, dir_fd=folder)


def _put(root: int, path: str, entry: Entry, store: Store, fresh: bool) -> None:
    """The path made as `entry` says: a folder made (its mode is set last), a file or a link written to a new name
    beside it and renamed over it."""
    with _parent(root, path) as (folder, name):
        if entry.kind == "folder":
            if fresh:
                os.mkdir(name, 0o700, dir_fd=folder)
            return
        temporary = f".{name}.{secrets.token_hex(6)}.undo"
        if entry.kind == "link":
            os.symlink(entry.target, temporary, dir_fd=folder)
        else:
            data = store.content(entry.digest)
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | FILE_FLAGS, 0o600, dir_fd=folder)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(descriptor, view):]
                os.fchmod(descriptor, entry.mode)
            finally:
                os.close(descriptor)
        try:
            os.replace(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
        except OSError:
            os.unlink(temporary, dir_fd=folder)
            raise


def _why(exc: OSError, entry: Entry) -> str:
    if entry.kind == "folder" and exc.errno in (39, 66):  # ENOTEMPTY
        return "the folder holds files the run did not make"
    return str(exc.strerror or exc)


def _same(a: Entry | None, b: Entry | None) -> bool:
    return a is b if a is None or b is None else a.same_as(b)


# --- showing ------------------------------------------------------------------------------------------------------
def render(changes: list[Change], old_content, new_content) -> str:
    """A unified diff of the changes (`old_content(change)`, `new_content(change)`: the bytes of each side's file).
    Binary files are named, not shown; so are files whose content was not kept."""
    out: list[str] = []
    for change in changes:
        out.extend(_render_one(change, old_content, new_content))
    return "\n".join(out) + ("\n" if out else "")


def _render_one(change: Change, old_content, new_content) -> list[str]:
    path, old, new = change.path, change.old, change.new
    kind = (new or old).kind
    head = [f"diff a/{path} b/{path}"]
    if kind == "folder" and (old is None or new is None or old.kind == new.kind):
        if old is None:
            return [f"new folder {path}/ (mode {new.mode:o})"]
        if new is None:
            return [f"deleted folder {path}/"]
        return [f"folder {path}/: mode {old.mode:o} → {new.mode:o}"]
    if old is not None and new is not None and old.kind == new.kind == "file" and old.mode != new.mode:
        head += [f"old mode {old.mode:o}", f"new mode {new.mode:o}"]
    elif old is None and new is not None and new.kind == "file":
        head.append(f"new file mode {new.mode:o}")
    elif new is None and old is not None and old.kind == "file":
        head.append(f"deleted file mode {old.mode:o}")
    before, after = _text_side(old, change, old_content), _text_side(new, change, new_content)
    if isinstance(before, str) or isinstance(after, str):  # a side that cannot be shown as lines
        if old is not None and new is not None and old.kind == new.kind == "file" and old.digest == new.digest \
                and old.digest:
            return head
        return head + [before if isinstance(before, str) else after]
    if before == after:
        return head
    return head + [line.rstrip("\n") for line in difflib.unified_diff(
        before, after, "/dev/null" if old is None else f"a/{path}", "/dev/null" if new is None else f"b/{path}")]


def _text_side(entry: Entry | None, change: Change, content) -> list[str] | str:
    """A side's lines, or what to say instead of them."""
    if entry is None or entry.kind == "folder":
        return []
    if entry.kind == "link":
        return [f"(link) → {entry.target}\n"]
    if entry.not_kept:
        return f"{change.path}: content not kept ({entry.not_kept}), {entry.size:,} bytes"
    if entry.size > DIFF_MAX_BYTES:
        return f"{change.path}: a large file ({entry.size:,} bytes) changed: not shown"
    data = content(change)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = "\0"
    if "\0" in text:
        return f"Binary file {change.path} changed ({_sizes(change)})"
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n\\ No newline at end of file\n"
    return lines


def _sizes(change: Change) -> str:
    def size(entry: Entry | None) -> str:
        return "none" if entry is None or entry.kind != "file" else f"{entry.size:,} bytes"

    return f"{size(change.old)} → {size(change.new)}"


def stored(store: Store, side: str):
    """Reads one side's file content from the store."""
    return lambda change: store.content(getattr(change, side).digest)


def on_disk(workdir: str):
    """Reads a change's old side from the work directory (never through a link)."""

    def read(change: Change) -> bytes:
        root = open_path_dir(workdir)  # (no link on its path either: undo checked it)
        try:
            with _parent(root, change.path) as (folder, name):
                descriptor = os.open(name, FILE_FLAGS, dir_fd=folder)
                with os.fdopen(descriptor, "rb") as handle:
                    return handle.read()
        finally:
            os.close(root)

    return read


def open_store(run_dir: Path) -> Store:
    store = Store(run_dir / FOLDER)
    if not store.records:
        store.close()
        raise StoreError(f"the checkpoints of {run_dir.name} hold nothing yet")
    return store



# --- the commands -------------------------------------------------------------------------------------------------
def print_diff(record, step: int | None) -> None:
    """`miniagi diff RUN_ID [--step N]`."""
    from ..terminal import visible

    files, text = changes_text(record, step)
    if not files:
        print(f"{'step ' + str(step) if step else 'run ' + record.run_id} changed no files", file=sys.stderr)
        return
    print(visible(_redactor()(text)), end="")


def changes_text(record, step: int | None) -> tuple[dict[str, str], str]:
    """What the run (or its step) changed: each path → added, modified or deleted, and the unified diff."""
    store = _opened(record)
    try:
        if step is not None:
            _check_step(record, store, step, low=1)
        changes = run_changes(store, step)
        files = describe({c.path: c.new for c in changes}, {c.path: c.old for c in changes if c.old is not None})
        return files, render(changes, stored(store, "old"), stored(store, "new"))
    finally:
        store.close()


def undo(record, to_step: int | None, yes: bool) -> int:
    """`miniagi undo RUN_ID [--to-step N] [-y]`: 0 when the work directory is back as it was, 1 when something
    was left as it is."""
    from ..config import ConfigError
    from ..terminal import visible
    from ..text import plural
    from ..trust import recorded_workdir

    result = record.read_result()
    if result.get("status") == "running":
        raise ConfigError(f"run {record.run_id} is still running (process {result.get('pid')}): stop it first")
    store = _opened(record)
    try:
        to_step = int(store.records[0].step) if to_step is None else to_step
        _check_step(record, store, to_step, low=0)
        workdir, when = store.workdir, "before the run" if to_step == 0 else f"after step {to_step}"
        if not os.path.isdir(workdir):
            raise ConfigError(f"the run's work directory {workdir} is gone: nothing to put back into")
        recorded_workdir(workdir, record.workdir_identity())  # not a folder a link on its path now leads to
        try:
            plan = plan_undo(store, workdir, to_step)
        except TooLarge as exc:
            raise ConfigError(f"the run's work directory {workdir} cannot be compared with its checkpoints: {exc}") \
                from None
        redact = _redactor()
        for path, why in plan.left:
            print(visible(redact(f"left as it is: {path} ({why})")), file=sys.stderr)
        if not plan.changes:
            print(f"nothing to undo: what run {record.run_id} changed in {workdir} is as it was {when}"
                  + (", but for what is left as it is above" if plan.left else ""), file=sys.stderr)
            return 1 if plan.left else 0
        print(visible(redact(render(plan.changes, on_disk(workdir), stored(store, "new")))), end="")
        paths = plural(len(plan.changes), "path")
        if not yes and not _confirmed(f"Put {workdir} back as it was {when} ({paths} to change)?",
                                      f"undo would change {paths} in {workdir}"):
            print("nothing was changed", file=sys.stderr)
            return 1
        failed = apply_undo(store, workdir, plan, result.get("steps") or 0)
    finally:
        store.close()
    for path, why in failed:
        print(visible(redact(f"could not put back: {path} ({why})")), file=sys.stderr)
    undone, left = len(plan.changes) - len(failed), len(plan.left) + len(failed)
    print(f"undone in part: {undone} of {paths} put back as they were {when}; {plural(left, 'path')} left as they "
          "are (named above)" if left else f"undone: {workdir} is back as it was {when} ({paths} changed)",
          file=sys.stderr)
    return 1 if left else 0


def _opened(record) -> Store:
    from ..config import ConfigError

    try:
        return open_store(record.dir)
    except (StoreError, OSError) as exc:
        raise ConfigError(f"run {record.run_id} has no checkpoints to show or undo: {exc}") from None


def _check_step(record, store: Store, step: int, low: int) -> None:
    from ..config import ConfigError

    end = record.read_result().get("steps")
    if step < low or (isinstance(end, int) and step > end):
        raise ConfigError(f"run {record.run_id} has steps 1-{end}: step {step} is not one of them")
    first = int(store.records[0].step)
    if step < first:  # resumed by a miniagi that keeps checkpoints, after steps taken by one that did not
        raise ConfigError(f"the checkpoints of run {record.run_id} begin after its step {first}: undo and diff reach "
                          f"back to there, not to step {step}")


def _confirmed(question: str, without_terminal: str) -> bool:
    from ..config import ConfigError

    if sys.stdin is None or not sys.stdin.isatty():
        raise ConfigError(f"{without_terminal}; without a terminal to ask in, confirm with -y")
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def _redactor():
    """Contents shown pass the secret gate: a file the run did not keep is read from the disk."""
    from ..config import read_dotenv
    from ..redaction import Redactor

    return Redactor(os.environ, read_dotenv())
