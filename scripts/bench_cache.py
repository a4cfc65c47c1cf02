"""How cache-friendly the agent's prompts are, measured from the requests a scripted OpenAI-compatible server on
127.0.0.1 received from a real `miniagi` process (vector memory on, the local embedder).

For each run: agent prompt tokens sent, the share of them that repeats the beginning of the previous agent prompt
(what a prefix cache serves), the tokens read afresh, the largest prompt against the budget, and model calls per
step. Then the wall time of a 100-step run against a server that spends 1 ms on every prompt token it has not
cached (a local model's prefill).

    python scripts/bench_cache.py                   # this checkout
    python scripts/bench_cache.py --before 73129cf  # and the same for an earlier commit, side by side
    python scripts/bench_cache.py --budget 8000 --steps 100 --no-wall --root /work/main   # another checkout
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import ROOT, common_prefix

from memory.tokens import counter_for
from tests.fake_llm import FakeLLM, rendered_prompt

ENCODING = counter_for("gpt-4o").encoding
BUDGET = 4000


def scripted(steps: int, agent_requests: list):
    """Odd steps print ~2,000 characters of text from Python, even steps memorize a note; the last step says
    done."""

    def respond(request):
        if request["model"] != "agent-model":
            return "Summary: the agent printed reports and noted facts about them; it is still going."
        agent_requests.append(request)
        n = len(agent_requests)
        if n >= steps:
            return "<r>all done</r><c>done</c>\nfinished"
        if n % 2:  # ~2,000 characters of report text (~420 tokens)
            return (f"<r>print report {n}</r><c>execute_python</c>\n"
                    f"print(''.join(f'Reading {{i}} of report {n}: the pressure held steady near the valve. ' "
                    f"for i in range(28)))")
        return (f"<r>keep what report {n - 1} showed</r><c>memorize_thoughts</c>\n"
                f"Report {n - 1}: the pressure held steady in all 28 readings.")

    return respond


def measure(steps: int, package_root: Path, prefill_s: float = 0.0, budget: int = BUDGET) -> dict:
    agent_requests: list = []
    with tempfile.TemporaryDirectory() as tmp, FakeLLM(responder=scripted(steps, agent_requests),
                                                       prefill_s_per_token=prefill_s) as llm:
        work = Path(tmp) / "work"
        work.mkdir()
        env = dict(os.environ, OPENAI_BASE_URL=llm.url, OPENAI_API_KEY="bench", MINIAGI_HOME=str(Path(tmp) / "home"),
                   MINIAGI_MODEL="agent-model", MINIAGI_SUMMARIZER_MODEL="summarizer",
                   MINIAGI_MAX_CONTEXT_TOKENS=str(budget), MINIAGI_MAX_STEPS=str(steps + 5), MINIAGI_MAX_COST="0",
                   PYTHONPATH=str(package_root))
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "miniagi", "-y", "--unattended", "Report and take notes"],
                              cwd=work, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"the run failed ({done.returncode}): {done.stderr[-800:]}")
        total_requests = len(llm.requests)
    prompts = [ENCODING.encode(rendered_prompt(request), disallowed_special=()) for request in agent_requests]
    sent = sum(len(p) for p in prompts)
    reused = sum(common_prefix(a, b) for a, b in zip(prompts, prompts[1:]))
    return {"steps": len(agent_requests), "sent": sent, "reused": reused, "fresh": sent - reused,
            "largest": max(len(p) for p in prompts), "calls_per_step": total_requests / len(agent_requests),
            "wall_s": wall, "budget": budget}


def report(label: str, figures: dict) -> None:
    print(f"  {label}: {figures['sent']:,} agent prompt tokens sent, {figures['reused'] / figures['sent']:.0%} "
          f"repeat the previous prompt's beginning, {figures['fresh']:,} read afresh; largest prompt "
          f"{figures['largest']:,} of {figures['budget']:,} (o200k count of the rendered messages); "
          f"{figures['calls_per_step']:.2f} model calls per step")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", metavar="REV", help="also measure this earlier commit, for comparison")
    parser.add_argument("--root", metavar="DIR", help="measure the package in this directory instead of this one")
    parser.add_argument("--budget", type=int, default=BUDGET, help="--max-context-tokens")
    parser.add_argument("--steps", default="31,300", help="comma-separated run lengths")
    parser.add_argument("--no-wall", action="store_true", help="skip the timed 100-step run")
    args = parser.parse_args()
    versions = [("now", Path(args.root) if args.root else ROOT)]
    worktree = None
    if args.before:
        worktree = Path(tempfile.mkdtemp(prefix="miniagi-before-"))
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), args.before],
                       check=True, capture_output=True)
        versions.insert(0, (f"before ({args.before})", worktree))
    try:
        for steps in (int(n) for n in args.steps.split(",")):
            print(f"{steps}-step run, budget {args.budget} tokens:")
            for label, root in versions:
                report(label, measure(steps, root, budget=args.budget))
        if args.no_wall:
            return
        print("100-step run, the server spending 1 ms per uncached prompt token:")
        for label, root in versions:
            figures = measure(100, root, prefill_s=0.001, budget=args.budget)
            print(f"  {label}: {figures['wall_s']:.1f} s wall ({figures['fresh']:,} tokens read afresh)")
    finally:
        if worktree is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)],
                           capture_output=True)


if __name__ == "__main__":
    main()
