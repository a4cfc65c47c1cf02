"""Start-up of a run, as a user waits for it: from launching `miniagi` to the model's first request, and the whole
of a one-step run, against an instant scripted OpenAI-compatible server on 127.0.0.1 (median of N launches).

Measured with vector memory off, on with an empty home, and on with a home that already holds memories of this
work directory (what recall has to search before the first request).

    python scripts/bench_startup.py                   # 10 launches each
    python scripts/bench_startup.py -n 5
    python scripts/bench_startup.py --before a2d0978  # and the same for an earlier commit, case by case
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchlib import ROOT, checkout
from tests.fake_llm import FakeLLM

REPLY = "<r>Simple arithmetic.</r><c>done</c>\n42"


def launch(server: FakeLLM, home: Path, work: Path, memory: str, root: Path) -> tuple[float, float]:
    """(seconds to the first model request, seconds for the whole run)."""
    first = threading.Event()
    arrived: list[float] = []

    def respond(request):
        if not arrived:
            arrived.append(time.perf_counter())
            first.set()
        return REPLY

    server.responder = respond
    env = dict(os.environ, OPENAI_BASE_URL=server.url, OPENAI_API_KEY="sk-bench", MINIAGI_HOME=str(home),
               MINIAGI_MEMORY_SCOPE=memory, PYTHONPATH=str(root))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "miniagi", "-y", "What is six times seven?"], cwd=work, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True)
    ended = time.perf_counter()
    if done.returncode != 0 or not arrived:
        raise SystemExit(f"the run failed (exit {done.returncode}): {done.stderr[-500:]}")
    return arrived[0] - started, ended - started


def measure(label: str, runs: int, memory: str, warm: bool, root: Path = ROOT) -> None:
    with tempfile.TemporaryDirectory() as tmp, FakeLLM() as server:
        home, work = Path(tmp) / "home", Path(tmp) / "work"
        work.mkdir()
        if warm:  # memories of this work directory, so recall has something to search for step 1
            launch(server, home, work, memory, root)
        firsts, totals = [], []
        for number in range(runs):
            if not warm:  # every launch with an empty home, as the label says
                home = Path(tmp) / f"home-{number}"
            first, total = launch(server, home, work, memory, root)
            firsts.append(first)
            totals.append(total)
    print(f"{label:<43} first request {statistics.median(firsts):5.2f} s   whole 1-step run "
          f"{statistics.median(totals):5.2f} s   (median of {runs}; first request min {min(firsts):.2f} "
          f"max {max(firsts):.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=10, help="launches per case (default 10)")
    parser.add_argument("--before", metavar="REV", help="also measure this earlier commit, for comparison")
    args = parser.parse_args()
    cases = [("memory off", "off", False), ("memory on, empty home", "workdir", False),
             ("memory on, memories of this folder", "workdir", True)]
    with checkout(args.before) as worktree:
        for label, memory, warm in cases:
            if worktree:
                measure(f"{label} (before)", args.n, memory, warm, worktree)
            measure(label, args.n, memory, warm)


if __name__ == "__main__":
    main()
