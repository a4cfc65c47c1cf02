"""What the sandbox costs, per kind: opening it (the probe that starts `true` in it), a Python worker's start-up,
the execute_python round trip of print(1) with a warm worker, and one execute_shell `echo`; and the CPU time (this
process and every process it started and reaped: the sandbox, its init, the worker) of one whole cycle — open,
start a worker, one round trip, one echo, close — which a loaded machine does not inflate as it does wall time.

    python scripts/bench_sandbox.py              # every kind that works here
    python scripts/bench_sandbox.py --repeats 50

Figures are medians, printed, never asserted.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from miniagi.config import ConfigError, Settings  # noqa: E402
from miniagi.execution import CodeRunner  # noqa: E402


def timed(action, *args) -> float:
    started = time.perf_counter()
    action(*args)
    return time.perf_counter() - started


def measure(kind: str, repeats: int) -> dict[str, float] | str:
    """Median seconds of each operation under one sandbox kind, or why the kind cannot be used here."""
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(workdir=f"{tmp}/work", home=f"{tmp}/home", sandbox=kind, exec_timeout=30)
        opens, starts, trips, shells, cpu = [], [], [], [], []
        for _ in range(max(3, repeats // 10)):
            before = cpu_time()
            started = time.perf_counter()
            try:
                runner = CodeRunner(settings, {"PATH": "/usr/local/bin:/usr/bin:/bin"}, 4000)
            except ConfigError as exc:
                return str(exc)
            opens.append(time.perf_counter() - started)
            try:
                starts.append(timed(runner.run_python, "pass"))
                trips += [timed(runner.run_python, "print(1)") for _ in range(repeats)]
                shells += [timed(runner.run_shell, "echo 1") for _ in range(max(3, repeats // 10))]
            finally:
                runner.close()
            cpu.append(cpu_time() - before)
    return {"open": statistics.median(opens), "start": statistics.median(starts),
            "python": statistics.median(trips), "shell": statistics.median(shells), "cpu": statistics.median(cpu)}


def cpu_time() -> float:
    """User and system seconds of this process and of the children it has reaped."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=100)
    args = parser.parse_args()
    print(f"{'sandbox':<10} {'open':>9} {'worker start':>13} {'python round trip':>18} {'shell echo':>11} "
          f"{'CPU per cycle':>14}")
    for kind in ("bwrap", "namespace", "none"):
        figures = measure(kind, args.repeats)
        if isinstance(figures, str):
            print(f"{kind:<10} not available: {figures}")
            continue
        print(f"{kind:<10} {figures['open'] * 1000:>6.1f} ms {figures['start'] * 1000:>10.1f} ms "
              f"{figures['python'] * 1000:>15.2f} ms {figures['shell'] * 1000:>8.1f} ms "
              f"{figures['cpu'] * 1000:>11.1f} ms")


if __name__ == "__main__":
    main()
