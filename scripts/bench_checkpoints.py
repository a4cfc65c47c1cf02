"""What a step's checkpoint costs (miniagi/checkpoints/): the walk before and the walk after a step's command, on a
work directory of 1,000 files and 50 MB, when the step changed nothing, one file, 100 files; a step that makes
10,000 files; the tree kept before the run (done once, while the model thinks of the first step); and
`miniagi undo` of the 10,000 files.

    python scripts/bench_checkpoints.py
    python scripts/bench_checkpoints.py --files 1000 --megabytes 50 --repeats 50
    python scripts/bench_checkpoints.py --loop 6   # + the loop's time per step, checkpoints on and off in turn

Each figure is the median of its repeats, in milliseconds: CPU time of this process (what the loop pays; the
machine is shared, so wall time is printed beside it, for what it is worth). Printed, never asserted.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from miniagi.checkpoints import Checkpoints  # noqa: E402
from miniagi.checkpoints.history import apply_undo, plan_undo  # noqa: E402
from miniagi.checkpoints.store import Store  # noqa: E402


def make_tree(root: Path, files: int, total_bytes: int) -> None:
    """`files` files in folders of 50, `total_bytes` in all (random bytes: nothing compresses)."""
    size = total_bytes // files
    for n in range(files):
        folder = root / f"pkg{n // 50}" / ("sub" if n % 2 else "")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"file{n}.dat").write_bytes(os.urandom(size))


class Timer:
    def __init__(self):
        self.cpu: list[float] = []
        self.wall: list[float] = []

    def __enter__(self):
        self.started = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.cpu.append((time.process_time() - self.started[0]) * 1000)
        self.wall.append((time.perf_counter() - self.started[1]) * 1000)

    def line(self, label: str) -> str:
        return (f"{label:<52} {statistics.median(self.cpu):9.2f} ms CPU  {statistics.median(self.wall):9.2f} ms wall"
                f"  (n={len(self.cpu)})")


def rewrite(paths: list[Path]) -> None:
    for path in paths:
        with open(path, "r+b") as handle:
            handle.write(os.urandom(16))


def step(checkpoints: Checkpoints, number: int, change) -> None:
    with checkpoints.step(number, "execute_shell"):
        change()
    checkpoints.files(number)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--megabytes", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--loop", type=int, default=0, metavar="N", help="also N pairs of 100-step scripted runs "
                        "(bench.py's, memory off), checkpoints on and off in turn: the loop's time per step")
    args = parser.parse_args()
    if args.loop:
        loop_time(args.loop)
    with tempfile.TemporaryDirectory() as scratch:
        root, run = Path(scratch) / "work", Path(scratch) / "run"
        root.mkdir()
        run.mkdir()
        make_tree(root, args.files, args.megabytes * 2**20)
        print(f"work directory: {args.files:,} files, {args.megabytes} MB, "
              f"{sum(1 for _ in root.rglob('*')) - args.files} folders")

        with tempfile.TemporaryDirectory() as empty:  # bench.py's runs work in an empty folder
            bare, bare_run = Path(empty) / "work", Path(empty) / "run"
            bare.mkdir()
            bare_run.mkdir()
            quiet = Checkpoints(bare, bare_run, file_limit_bytes=50 * 2**20)
            bare_step = Timer()
            for n in range(1, args.repeats + 1):
                with bare_step:
                    step(quiet, n, lambda: None)
            quiet.close()
        print(bare_step.line("a step in an empty work directory (bench.py's runs)"))

        first = Timer()
        with first:
            checkpoints = Checkpoints(root, run, file_limit_bytes=50 * 2**20)
            checkpoints.first.join()
        print(first.line("the tree kept before the run (once, in a thread)"))

        number = 0
        time.sleep(0.1)  # past the window in which a file just written is read again (tree.RACY_NS)
        nothing = Timer()
        for _ in range(args.repeats):
            number += 1
            with nothing:
                step(checkpoints, number, lambda: None)
        print(nothing.line("a step that changed nothing (both walks)"))

        files = sorted(root.rglob("*.dat"))
        for count in (1, 100):
            changed = Timer()
            for _ in range(args.repeats):
                number += 1
                with changed:
                    step(checkpoints, number, functools.partial(rewrite, files[:count]))
                time.sleep(0.06)  # the next step's walk then reads only what it changed
            print(changed.line(f"a step that rewrote {count} of them ({count * args.megabytes // args.files or 1} MB"
                               f" or less)"))

        many = Timer()
        number += 1
        around = checkpoints.step(number, "execute_shell")
        around.__enter__()
        for folder in range(100):
            (root / f"new{folder}").mkdir()
            for name in range(100):
                (root / f"new{folder}" / f"{name}.txt").write_text(f"{folder}/{name}\n")
        with many:  # the walk after the command: what the step's checkpoint costs
            around.__exit__(None, None, None)
            checkpoints.files(number)
        print(many.line("a step that made 10,000 files (the walk after it)"))
        checkpoints.close()

        undo = Timer()
        store = Store(run / "checkpoints")
        with undo:
            plan = plan_undo(store, str(root), number - 1)
            apply_undo(store, str(root), plan, number)
        store.close()
        print(undo.line(f"undo of those 10,000 files ({len(plan.changes):,} paths)"))
        size = sum(f.stat().st_size for f in (run / "checkpoints").iterdir())
        print(f"checkpoints on disk: {size / 2**20:.1f} MB")


def loop_time(pairs: int) -> None:
    """The loop's own time per step (bench.py's measure: a step's wall time less the model's), runs with checkpoints
    on and off taken in turn, so that the machine's load falls on both alike."""
    from benchlib import run_agent

    medians: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(pairs):
        for on in (True, False):
            with tempfile.TemporaryDirectory() as home:
                run = run_agent(100, 8000, Path(home), memory_scope="off", checkpoints=on)
            medians[on].append(statistics.median(run.overheads) * 1000)
    for on, values in medians.items():
        print(f"the loop's time per step, 100-step runs, checkpoints {'on ' if on else 'off'}: medians "
              + ", ".join(f"{v:.2f}" for v in values) + f" ms (median of runs {statistics.median(values):.2f})")


if __name__ == "__main__":
    main()
