"""Start-up of a run, as a user waits for it: from launching `miniagi` to the model's first request, and the whole
of a one-step run, and its peak memory (RSS), against an instant scripted OpenAI-compatible server on 127.0.0.1
(median of N launches).

Measured with vector memory off, on with an empty home, and on with a home that already holds memories of this
work directory (what recall has to search before the first request). The `openai` SDK's own import time is measured
in the same invocation (a fresh interpreter per launch), and each case says how far its first request comes after
it, in CPU time: the budget is +0.15 s with memory off, +0.3 s with memory on and an empty home. Besides the
wall-clock times, the CPU time a launch had used when its first request arrived (read from /proc), which hardly
changes with what else a shared machine is doing. The code measured is compiled first (its .pyc files, as an
installed package has them), so that no launch compiles it, whatever PYTHONDONTWRITEBYTECODE says.

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
import time
from pathlib import Path

from benchlib import ROOT, checkout

from tests.fake_llm import FakeLLM

REPLY = "<r>Simple arithmetic.</r><c>done</c>\n42"


def cpu_s(pid: int) -> float:
    """The CPU time (user + system) a process has used so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def launch(server: FakeLLM, home: Path, work: Path, memory: str, root: Path) -> tuple[float, float, float, float]:
    """(seconds to the first model request, seconds for the whole run, the run's peak RSS in MB, the CPU seconds it
    had used when its first request arrived). The CPU time hardly changes with what else the machine is doing."""
    arrived: list[float] = []
    process = None

    def respond(request):
        if not arrived:
            arrived.append(time.perf_counter())
            arrived.append(cpu_s(process.pid))
        return REPLY

    server.responder = respond
    env = dict(os.environ, OPENAI_BASE_URL=server.url, OPENAI_API_KEY="sk-bench", MINIAGI_HOME=str(home),
               MINIAGI_MEMORY_SCOPE=memory, PYTHONPATH=str(root))
    with tempfile.TemporaryFile() as stderr:
        started = time.perf_counter()
        process = subprocess.Popen([sys.executable, "-m", "miniagi", "-y", "What is six times seven?"], cwd=work,
                                   env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
        _, status, usage = os.wait4(process.pid, 0)  # the resources of this process alone
        ended = time.perf_counter()
        code = os.waitstatus_to_exitcode(status)
        if code != 0 or not arrived:
            stderr.seek(0)
            raise SystemExit(f"the run failed (exit {code}): {stderr.read()[-500:].decode(errors='replace')}")
    return arrived[0] - started, ended - started, usage.ru_maxrss / 1024, arrived[1]


def sdk_import(runs: int) -> float:
    """The median time a fresh interpreter takes to `import openai` (the SDK alone, nothing of miniagi), in wall
    and in CPU time; the CPU time is returned."""
    code = ("import time; t, c = time.perf_counter(), time.process_time(); import openai; "
            "print(time.perf_counter() - t, time.process_time() - c)")
    times = [tuple(map(float, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                             check=True).stdout.split())) for _ in range(runs)]
    walls, cpus = [wall for wall, _ in times], [cpu for _, cpu in times]
    print(f"{'import openai (the SDK alone)':<43} {statistics.median(walls):5.2f} s   CPU "
          f"{statistics.median(cpus):5.2f} s   (median of {runs}; min {min(walls):.2f} max {max(walls):.2f})")
    return statistics.median(cpus)


def compiled(root: Path) -> None:
    """The tree's .pyc files written, as installing the package writes them."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(root / "miniagi"), str(root / "memory")],
                   check=True, capture_output=True)


def measure(label: str, runs: int, memory: str, warm: bool, root: Path = ROOT, sdk_s: float = 0.0) -> None:
    compiled(root)
    with tempfile.TemporaryDirectory() as tmp, FakeLLM() as server:
        home, work = Path(tmp) / "home", Path(tmp) / "work"
        work.mkdir()
        if warm:  # memories of this work directory, so recall has something to search for step 1
            launch(server, home, work, memory, root)
        firsts, totals, peaks, cpus = [], [], [], []
        for number in range(runs):
            if not warm:  # every launch with an empty home, as the label says
                home = Path(tmp) / f"home-{number}"
            first, total, peak, cpu = launch(server, home, work, memory, root)
            firsts.append(first)
            totals.append(total)
            peaks.append(peak)
            cpus.append(cpu)
    cpu = statistics.median(cpus)
    print(f"{label:<43} first request {statistics.median(firsts):5.2f} s (CPU {cpu:4.2f} s, {cpu - sdk_s:+.2f} s past "
          f"the SDK's import)   whole 1-step run {statistics.median(totals):5.2f} s   peak RSS "
          f"{statistics.median(peaks):4.0f} MB   (median of {runs}; first request min {min(firsts):.2f} "
          f"max {max(firsts):.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=10, help="launches per case (default 10)")
    parser.add_argument("--before", metavar="REV", help="also measure this earlier commit, for comparison")
    args = parser.parse_args()
    cases = [("memory off", "off", False), ("memory on, empty home", "workdir", False),
             ("memory on, memories of this folder", "workdir", True)]
    sdk_s = sdk_import(args.n)
    with checkout(args.before) as worktree:
        for label, memory, warm in cases:
            if worktree:
                measure(f"{label} (before)", args.n, memory, warm, worktree, sdk_s)
            measure(label, args.n, memory, warm, sdk_s=sdk_s)


if __name__ == "__main__":
    main()
