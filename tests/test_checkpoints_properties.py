"""The checkpoints' promise on generated inputs: whatever a run's steps do to a tree — create, edit, delete and
rename files and folders, change modes, write binary files, make and replace symbolic links — undo to step k
leaves exactly the tree as it was after step k, byte for byte and mode for mode, for every k, in any order."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from miniagi.checkpoints import Checkpoints
from miniagi.checkpoints.history import apply_undo, plan_undo, run_changes
from miniagi.checkpoints.store import Store

NAMES = st.sampled_from(["a", "b", "c.txt", "d", "e.bin"])
PATHS = st.lists(NAMES, min_size=1, max_size=3).map("/".join)
CONTENT = st.one_of(st.binary(max_size=300), st.text(max_size=200).map(str.encode),
                    st.sampled_from([b"", b"same size 1", b"same size 2", b"\x00\xff" * 700]))
FILE_MODES = st.sampled_from([0o644, 0o600, 0o755, 0o700, 0o444, 0o4755])
FOLDER_MODES = st.sampled_from([0o755, 0o700, 0o555])
OPERATIONS = st.one_of(
    st.tuples(st.just("write"), PATHS, CONTENT),
    st.tuples(st.just("append"), PATHS, CONTENT),
    st.tuples(st.just("delete"), PATHS),
    st.tuples(st.just("rename"), PATHS, PATHS),
    st.tuples(st.just("chmod"), PATHS, FILE_MODES, FOLDER_MODES),
    st.tuples(st.just("mkdir"), PATHS),
    st.tuples(st.just("link"), PATHS, st.sampled_from(["a", "../outside", "d/c.txt", "/etc/passwd", "nowhere"])),
)
STEPS = st.lists(st.lists(OPERATIONS, max_size=6), min_size=1, max_size=6)


def _rename(path: Path, target: Path) -> None:
    if target.is_relative_to(path):
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    os.replace(path, target)


def apply_operation(root: Path, operation: tuple) -> None:
    """One operation, as code would do it; one that makes no sense for the tree as it is does nothing."""
    kind, path = operation[0], root / operation[1]
    try:
        if kind in ("write", "append"):
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.is_symlink():
                path.unlink()
            with open(path, "ab" if kind == "append" else "wb") as handle:
                handle.write(operation[2])
        elif kind == "delete":
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        elif kind == "rename":
            _rename(path, root / operation[2])
        elif kind == "chmod":
            if not path.is_symlink():
                path.chmod(operation[3] if path.is_dir() else operation[2])
        elif kind == "mkdir":
            path.mkdir(parents=True)
        elif kind == "link":
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif os.path.lexists(path):
                path.unlink()
            os.symlink(operation[2], path)
    except (FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError, OSError):
        pass


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path → its kind, mode and bytes (a link: its target), links never followed."""
    found = {}
    stack = [root]
    while stack:
        folder = stack.pop()
        for item in os.scandir(folder):
            info = item.stat(follow_symlinks=False)
            relative = os.path.relpath(item.path, root)
            if stat.S_ISLNK(info.st_mode):
                found[relative] = ("link", os.readlink(item.path))
            elif stat.S_ISDIR(info.st_mode):
                found[relative] = ("folder", stat.S_IMODE(info.st_mode))
                stack.append(Path(item.path))
            else:
                found[relative] = ("file", stat.S_IMODE(info.st_mode), Path(item.path).read_bytes())
    return found


def work_and_run(scratch: Path, start) -> tuple[Path, Path]:
    """A work directory made by the operations `start`, and an empty run folder beside it."""
    root, run = scratch / "work", scratch / "run"
    root.mkdir()
    run.mkdir()
    for operation in start:
        apply_operation(root, operation)
    return root, run


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(start=st.lists(OPERATIONS, max_size=6), steps=STEPS, order=st.randoms(use_true_random=False))
def test_undo_to_any_step_restores_exactly_the_tree_after_it(start, steps, order):
    with tempfile.TemporaryDirectory() as scratch:
        root, run = work_and_run(Path(scratch), start)
        after = {0: snapshot(root)}
        checkpoints = Checkpoints(root, run, file_limit_bytes=2**20)
        for number, operations in enumerate(steps, start=1):
            with checkpoints.step(number, "execute_shell"):
                for operation in operations:
                    apply_operation(root, operation)
            after[number] = snapshot(root)
            changed = checkpoints.files(number)
            assert (changed == {}) == (after[number] == after[number - 1])
        checkpoints.close()

        store = Store(run / "checkpoints")
        try:
            # what each step's diff names is what changed in it
            for number in after.keys() - {0}:
                named = {change.path for change in run_changes(store, number)}
                moved = {p for p in after[number].keys() | after[number - 1].keys()
                         if after[number].get(p) != after[number - 1].get(p)}
                assert named == moved
            targets = list(after)
            order.shuffle(targets)
            for k in targets:
                plan = plan_undo(store, str(root), k)
                assert plan.left == []
                assert apply_undo(store, str(root), plan, len(steps)) == []
                assert snapshot(root) == after[k], f"undo --to-step {k}"
        finally:
            store.close()
            for folder, _, _ in os.walk(root):  # read-only folders made by the steps
                os.chmod(folder, 0o755)


def test_many_changed_files_in_one_step_are_kept_and_undone(tmp_path):
    root, run = tmp_path / "tree", tmp_path / "run"
    root.mkdir()
    run.mkdir()
    checkpoints = Checkpoints(root, run, file_limit_bytes=2**20)
    with checkpoints.step(1, "execute_shell"):
        for folder in range(100):
            (root / f"f{folder}").mkdir()
            for name in range(100):
                (root / f"f{folder}" / f"{name}.txt").write_text(f"{folder}/{name}\n")
    assert len(checkpoints.files(1)) == 10_100
    checkpoints.close()
    store = Store(run / "checkpoints")
    plan = plan_undo(store, str(root), 0)
    assert apply_undo(store, str(root), plan, 1) == []
    assert os.listdir(root) == []
    store.close()


def test_a_link_is_kept_as_a_link_and_never_followed(tmp_path):
    root, run, outside = tmp_path / "tree", tmp_path / "run", tmp_path / "outside"
    for folder in (root, run, outside):
        folder.mkdir()
    (outside / "private.txt").write_text("not the run's business\n")
    (root / "own.txt").write_text("the tree's own\n")
    checkpoints = Checkpoints(root, run, file_limit_bytes=2**20)
    with checkpoints.step(1, "execute_shell"):
        os.symlink(outside, root / "out")
        os.symlink("out/private.txt", root / "through")
    assert checkpoints.files(1) == {"out": "added", "through": "added"}
    checkpoints.close()
    kept = (run / "checkpoints" / "blobs").read_bytes()
    assert b"the tree's own" in kept and b"not the run's business" not in kept
    store = Store(run / "checkpoints")
    assert apply_undo(store, str(root), plan_undo(store, str(root), 0), 1) == []
    store.close()
    assert os.listdir(root) == ["own.txt"] and (outside / "private.txt").exists()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(start=st.lists(OPERATIONS, max_size=5), steps=STEPS, outside=st.lists(OPERATIONS, min_size=1, max_size=4),
       to_step=st.integers(min_value=0, max_value=6))
def test_undo_never_changes_what_was_changed_outside_the_run_since(start, steps, outside, to_step):
    with tempfile.TemporaryDirectory() as scratch:
        root, run = work_and_run(Path(scratch), start)
        checkpoints = Checkpoints(root, run, file_limit_bytes=2**20)
        for number, operations in enumerate(steps, start=1):
            with checkpoints.step(number, "execute_shell"):
                for operation in operations:
                    apply_operation(root, operation)
        checkpoints.close()
        run_left = snapshot(root)
        for operation in outside:  # the person, after the run
            apply_operation(root, operation)
        theirs = snapshot(root)
        touched = {p for p in run_left.keys() | theirs.keys() if run_left.get(p) != theirs.get(p)}
        store = Store(run / "checkpoints")
        try:
            plan = plan_undo(store, str(root), min(to_step, len(steps)))
            apply_undo(store, str(root), plan, len(steps))
            after = snapshot(root)
            assert {p: after.get(p) for p in touched} == {p: theirs.get(p) for p in touched}
            assert all(change.path not in touched for change in plan.changes)
        finally:
            store.close()
            for folder, _, _ in os.walk(root):
                os.chmod(folder, 0o755)


def test_a_record_torn_by_a_crash_is_skipped_and_the_next_one_stands(tmp_path):
    root, run = tmp_path / "tree", tmp_path / "run"
    root.mkdir()
    run.mkdir()
    (root / "a.txt").write_text("1\n")
    checkpoints = Checkpoints(root, run, file_limit_bytes=2**20)
    with checkpoints.step(1, "execute_shell"):
        (root / "a.txt").write_text("2\n")
    checkpoints.close()
    with open(run / "checkpoints" / "log.jsonl", "ab") as log:
        log.write(b'{"kind":"step","step":2,"chan')  # the process was killed mid-write
    resumed = Checkpoints(root, run, file_limit_bytes=2**20, completed_step=1)
    with resumed.step(2, "execute_shell"):
        (root / "a.txt").write_text("3\n")
    assert resumed.files(2) == {"a.txt": "modified"}
    resumed.close()
    store = Store(run / "checkpoints")
    assert [(r.kind, r.step) for r in store.records] == [("start", 0), ("step", 1), ("step", 2)]
    assert apply_undo(store, str(root), plan_undo(store, str(root), 1), 2) == []
    store.close()
    assert (root / "a.txt").read_text() == "2\n"


def test_a_file_written_just_before_the_last_walk_is_read_again_whatever_its_stat(tmp_path):
    """On kernels whose timestamps are coarse (before Linux 6.13's fine-grained ones), a file rewritten right after
    a walk, at the same size, can keep its stat: such a file is read again at the next walk."""
    from miniagi.checkpoints.tree import RACY_NS, Entry, walk

    root = tmp_path / "tree"
    root.mkdir()
    (root / "a.txt").write_text("same size 1")

    def keep(descriptor, info, path):
        return Entry("file", info.st_mode & 0o7777, info.st_size, os.read(descriptor, 100).decode())

    first = walk(str(root), {}, keep)
    signature, _ = first.entries["a.txt"]
    stale = {"a.txt": (signature, Entry("file", 0o644, 11, "what a coarse clock hid"))}
    written = os.stat(root / "a.txt").st_ctime_ns
    again = walk(str(root), stale, keep, racy_before=written + RACY_NS // 2)  # the walk before: just after
    assert again.entries["a.txt"][1].digest == "same size 1" and again.fresh == ["a.txt"]
    settled = walk(str(root), stale, keep, racy_before=written + 2 * RACY_NS)  # long after: the stat decides
    assert settled.entries["a.txt"][1].digest == "what a coarse clock hid" and settled.fresh == []

