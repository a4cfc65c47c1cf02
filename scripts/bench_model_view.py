"""What keeping "what the model saw" costs: a scripted run (the shared one of benchlib: each step prints a report, the
summary folds old steps) against an instant local server, then the size of prompts.jsonl beside the trace and beside
the bytes of every agent prompt as sent, and the CPU time the run spent writing it.

    python scripts/bench_model_view.py                    # 60 steps, an 8000-token budget
    python scripts/bench_model_view.py --steps 150 --budget 16000
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from benchlib import run_agent

from miniagi import model_view


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--budget", type=int, default=8000)
    args = parser.parse_args()

    spent = [0.0, 0]
    add = model_view.PromptLog.add

    def timed_add(self, step, messages, covers):
        started = time.process_time()
        add(self, step, messages, covers)
        spent[0] += time.process_time() - started
        spent[1] += 1

    model_view.PromptLog.add = timed_add
    with tempfile.TemporaryDirectory() as folder:
        home = Path(folder)
        (home / "work").mkdir()
        run = run_agent(args.steps, args.budget, home, memory_scope="off")
        (directory,) = (home / "runs").iterdir()
        kept = (directory / "prompts.jsonl").stat().st_size
        trace = (directory / "trace.jsonl").stat().st_size
        prompts = model_view.read_prompts(directory)
        sent = sum(len(json.dumps([{"role": p.role, "content": p.content} for p in prompt.parts], ensure_ascii=False))
                   for prompt in prompts)
    print(f"{run.result.steps} steps, {len(prompts)} agent prompts kept ({spent[1]} writes), budget {args.budget}")
    print(f"every agent prompt as sent: {sent / 1e6:.2f} MB")
    per_step = kept / max(1, len(prompts)) / 1e3
    print(f"prompts.jsonl: {kept / 1e6:.2f} MB ({100 * kept / sent:.0f}% of that; {per_step:.1f} kB per step) · "
          f"trace.jsonl: {trace / 1e6:.2f} MB")
    print(f"CPU time writing it: {1e3 * spent[0]:.1f} ms in all, {1e3 * spent[0] / max(1, spent[1]):.2f} ms per prompt")


if __name__ == "__main__":
    main()
