"""Everything around the model, measured: one command prints every figure of the performance table.

    python scripts/bench.py            # the full set (a few minutes: it fills a 100k-item memory)
    python scripts/bench.py --quick    # smaller sizes, for a quick look
    python scripts/bench.py --loop     # only the 30-step run with memory off (the loop's own time)

The model is a scripted OpenAI-compatible server on 127.0.0.1 answering instantly, through the real openai
client; commands really run; memory is the real chromadb with the real embedder. Figures are printed, never
asserted. "Agent overhead per step" is the wall time of a step minus the time the loop's own thread spent inside
model calls (the openai client's own request building included) or waiting for a summary while the summarizer's
call was under way; summaries made in the background while the loop works are not subtracted.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import ROOT, TOPICS, fill_store, run_agent

TARGETS = {
    "loop": "≤ +0.5 s",
    "step": "≤ 5 ms",
    "overhead": "≤ 10 ms median, ≤ 2× growth from step 10 to step 500",
    "calls": "≤ 1.25",
    "largest": "≤ 100 %",
    "ratio": "≤ 3.2×",
    "exec": "≤ 5 ms median",
    "help": "≤ 0.4 s",
    "query": "≤ 10 ms median",
    "rss": "≤ 400 MB",
}


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def bench_help(repeats: int = 10) -> float:
    command = [shutil.which("miniagi")] if shutil.which("miniagi") else [sys.executable, "-m", "miniagi"]
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run([*command, "--help"], capture_output=True, check=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def bench_exec(repeats: int = 300) -> float:
    """The execute_python round trip under the sandbox a run would pick here (scripts/bench_sandbox.py: per kind)."""
    from miniagi.config import Settings
    from miniagi.execution import CodeRunner

    with tempfile.TemporaryDirectory() as tmp:
        runner = CodeRunner(Settings(workdir=tmp, home=f"{tmp}/home", exec_timeout=30), {"PATH": "/usr/bin:/bin"},
                            4000)
        try:
            runner.run_python("print(0)")  # warm: the worker is started
            times = []
            for _ in range(repeats):
                started = time.perf_counter()
                runner.run_python("print(1)")
                times.append(time.perf_counter() - started)
        finally:
            runner.close()
    return statistics.median(times)


def bench_query(home: Path, repeats: int = 60) -> float:
    from memory.embeddings import MiniLMEmbedder
    from memory.store import VectorMemory

    memory = VectorMemory(home / "memory", MiniLMEmbedder())
    memory.search("warm up", 12)
    times = []
    for i in range(repeats):
        started = time.perf_counter()
        memory.search(f"what was the {TOPICS[i % 10]} value in report {i}", 12)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def child_run(steps: int, budget: int) -> None:
    """A run in a fresh process (its model in another), reporting the process's own peak RSS (VmHWM)."""
    with tempfile.TemporaryDirectory() as tmp:
        run = run_agent(steps, budget, Path(tmp))
    peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
    print(json.dumps({"steps": run.result.steps, "status": run.result.status, "peak_rss_mb": peak / 1024}))


def child_loop(steps: int, budget: int) -> None:
    """A run with memory off in a fresh process (its model in another), as `miniagi` runs one: the process's CPU
    time from its start (the SDK's import included), and the loop's time per step."""
    import resource

    with tempfile.TemporaryDirectory() as tmp:
        run = run_agent(steps, budget, Path(tmp), memory_scope="off")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"steps": run.result.steps, "status": run.result.status, "cpu_s": usage.ru_utime + usage.ru_stime,
                      "peak_rss_mb": usage.ru_maxrss / 1024, "overheads": run.overheads, "step_cpu": run.step_cpu_s,
                      "call_cpu": run.model_call_cpu_s}))


def bench_loop(steps: int, budget: int, runs: int) -> dict:
    """`runs` runs of `steps` steps with memory off, each in a fresh process; and the SDK's own import, measured
    the same way, to say what the run costs beyond it."""
    from bench_startup import compiled, sdk_import

    compiled(ROOT)  # no run compiles miniagi's modules (PYTHONDONTWRITEBYTECODE or not), as when installed
    sdk_s = sdk_import(runs)
    reports = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, __file__, "--child-loop", str(steps), "--budget", str(budget)],
                             capture_output=True, text=True, cwd=ROOT, check=True).stdout
        reports.append(json.loads(out.strip().splitlines()[-1]))
    cpus = sorted(report["cpu_s"] for report in reports)
    pooled = {key: [value for report in reports for value in report[key]]
              for key in ("overheads", "step_cpu", "call_cpu")}
    figures = {"cpu": statistics.median(cpus), "beyond": statistics.median(cpus) - sdk_s,
               "step_wall": median_ms(pooled["overheads"]), "step_cpu": median_ms(pooled["step_cpu"]),
               "call_cpu": median_ms(pooled["call_cpu"])}
    print(f"   whole run, CPU time of the process: median {figures['cpu']:.2f} s (min {cpus[0]:.2f}, max "
          f"{cpus[-1]:.2f}; {runs} runs, {reports[0]['steps']} steps, {reports[0]['status']}), "
          f"{figures['beyond']:+.2f} s beyond the SDK's import; peak RSS "
          f"{statistics.median(r['peak_rss_mb'] for r in reports):.0f} MB")
    print(f"   a step's own time (the loop, model calls taken out): median {figures['step_wall']:.2f} ms wall, "
          f"{figures['step_cpu']:.2f} ms CPU of the loop's thread · one model call, the client's side: median "
          f"{figures['call_cpu']:.2f} ms CPU")
    return figures


def peak_rss_of_run(steps: int, budget: int) -> tuple[float, dict]:
    out = subprocess.run([sys.executable, __file__, "--child-run", str(steps), "--budget", str(budget)],
                         capture_output=True, text=True, cwd=ROOT, check=True).stdout
    report = json.loads(out.strip().splitlines()[-1])
    return report["peak_rss_mb"], report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10k memories, 200-step long run")
    parser.add_argument("--budget", type=int, default=8000)
    parser.add_argument("--loop", action="store_true", help="only the 30-step run with memory off")
    parser.add_argument("--loop-runs", type=int, default=5, help="runs of the 30-step run with memory off")
    parser.add_argument("--child-run", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-loop", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_run:
        child_run(args.child_run, args.budget)
        return
    if args.child_loop:
        child_loop(args.child_loop, args.budget)
        return
    if args.loop:
        print(f"== 30-step run, memory off, each in a fresh process ({args.loop_runs} runs)")
        bench_loop(30, args.budget, args.loop_runs)
        return
    memories = 10_000 if args.quick else 100_000
    long_steps = 200 if args.quick else 500
    figures = {}

    print("== miniagi --help")
    figures["help"] = bench_help()
    print(f"   {figures['help']:.3f} s median wall time")

    print("== execute_python round trip, print(1), warm worker")
    figures["exec"] = bench_exec()
    print(f"   {ms(figures['exec'])} median")

    print(f"== 30-step run, memory off, each in a fresh process ({args.loop_runs} runs)")
    figures["loop"] = bench_loop(30, args.budget, args.loop_runs)

    print("== 100-step and 300-step runs (memory on, fresh store)")
    with tempfile.TemporaryDirectory() as tmp:
        hundred = run_agent(100, args.budget, Path(tmp) / "a")
        three_hundred = run_agent(300, args.budget, Path(tmp) / "b")
    calls = sum(hundred.roles.values()) / hundred.result.steps
    figures["calls"] = calls
    print(f"   model calls per step, 100-step run: {calls:.3f} (" + ", ".join(
        f"{role} {count / hundred.result.steps:.3f}" for role, count in hundred.roles.items()) + ")")
    largest = max(three_hundred.sizes)
    figures["largest"] = 100 * largest / args.budget
    print(f"   largest agent prompt, 300-step run: {largest} tokens = {figures['largest']:.1f} % of "
          f"--max-context-tokens {args.budget}")
    ratio = sum(three_hundred.sizes) / sum(hundred.sizes)
    figures["ratio"] = ratio
    print(f"   total prompt tokens: 300 steps {sum(three_hundred.sizes):,} vs 100 steps {sum(hundred.sizes):,} "
          f"= {ratio:.2f}×")
    print(f"   agent overhead per step, 300-step run with a fresh store: median "
          f"{median_ms(three_hundred.overheads):.2f} ms, mean {statistics.mean(three_hundred.overheads) * 1000:.2f} ms")

    print(f"== agent overhead per step with {memories:,} memories stored, {long_steps}-step run")
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        started = time.perf_counter()
        fill_store(home / "memory", memories)
        print(f"   (store filled in {time.perf_counter() - started:.0f} s)")
        figures["query"] = bench_query(home)
        long = run_agent(long_steps, args.budget, home)
    early, late = long.overheads[4:15], long.overheads[-11:]
    figures["overhead"] = (median_ms(early), median_ms(late))
    print(f"   at step 10 (steps 5-15): median {median_ms(early):.2f} ms · at step {long_steps} (last 11 steps): "
          f"median {median_ms(late):.2f} ms · growth {median_ms(late) / median_ms(early):.2f}×")
    print(f"   over the whole run: median {median_ms(long.overheads):.2f} ms, mean "
          f"{statistics.mean(long.overheads) * 1000:.2f} ms, 95th percentile "
          f"{sorted(long.overheads)[int(len(long.overheads) * 0.95)] * 1000:.2f} ms")
    print(f"   (one model call through the openai client to the instant server: median "
          f"{median_ms(long.model_call_s):.2f} ms — counted as the model's wait)")
    print(f"== memory query (embed + search), {memories:,} items stored: {figures['query'] * 1000:.2f} ms median")

    print("== peak RSS of a 300-step run (child process)")
    rss, child = peak_rss_of_run(300, args.budget)
    figures["rss"] = rss
    print(f"   {rss:.0f} MB ({child['steps']} steps, {child['status']})")

    print("\n== summary (target in brackets)")
    loop = figures["loop"]
    print(f"30 steps, memory off: CPU {loop['cpu']:.2f} s, {loop['beyond']:+.2f} s beyond the SDK's import "
          f"({TARGETS['loop']}); a step's own time {loop['step_wall']:.2f} ms wall / {loop['step_cpu']:.2f} ms CPU "
          f"({TARGETS['step']})")
    early_ms, late_ms = figures["overhead"]
    print(f"agent overhead per step, step 10 / step {long_steps}: {early_ms:.1f} / {late_ms:.1f} ms "
          f"({TARGETS['overhead']})")
    print(f"model calls per step, 100 steps: {figures['calls']:.3f} ({TARGETS['calls']})")
    print(f"largest prompt / budget, 300 steps: {figures['largest']:.1f} % ({TARGETS['largest']})")
    print(f"prompt tokens 300 vs 100 steps: {figures['ratio']:.2f}× ({TARGETS['ratio']})")
    print(f"execute_python print(1) round trip: {figures['exec'] * 1000:.2f} ms ({TARGETS['exec']})")
    print(f"miniagi --help: {figures['help']:.3f} s ({TARGETS['help']})")
    print(f"memory query at {memories:,} items: {figures['query'] * 1000:.2f} ms ({TARGETS['query']})")
    print(f"peak RSS, 300-step run: {figures['rss']:.0f} MB ({TARGETS['rss']})")


if __name__ == "__main__":
    main()
