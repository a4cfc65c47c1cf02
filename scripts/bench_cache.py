"""How cache-friendly the agent's prompts are, measured from the requests a scripted OpenAI-compatible server on
127.0.0.1 received from a real `miniagi` process (vector memory on, the local embedder).

The reports run (--steps, --budget): agent prompt tokens sent, the share of them that repeats the beginning of the
previous agent prompt (what a prefix cache serves), the tokens read afresh, the largest prompt against the budget,
and model calls per step. Then the wall time of a 100-step run against a server that spends 1 ms on every prompt
token it has not cached (a local model's prefill), with the loop's waits for a summary.

The peers' run (--peers N steps at --peers-budget tokens; 0 skips it): ~1,300 characters of varied output a step
(file listings, code, grep hits, test output, logs, diffs: what a coding agent reads), the way the peers were
measured. Every request counts, summarizer and critic included: under a perfect prefix cache per model, a request
reads afresh its tokens less the longest beginning it shares with any earlier request to the same model. Beside it,
what an append-only agent (the peers' way: each step's reply and observation appended to one conversation) reads
afresh over the same steps: the system prompt and every message once. Measured with the default configuration (the
summarizer is the agent's model) and with a summarizer model of its own; --wall also times each against the 1 ms per
uncached token server (its cache: one slot per model, as llama.cpp's) and counts the loop's waits for a summary.

    python scripts/bench_cache.py                   # this checkout
    python scripts/bench_cache.py --before 73129cf  # and the same for an earlier commit, side by side
    python scripts/bench_cache.py --budget 8000 --steps 100 --no-wall --root /work/main   # another checkout
    python scripts/bench_cache.py --steps 0 --no-wall --wall   # the peers' run only, timed
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import ROOT, common_prefix

from memory.tokens import counter_for
from tests.fake_llm import FakeLLM, rendered_prompt
from tests.fake_llm import common_prefix as char_prefix

ENCODING = counter_for("gpt-4o").encoding
BUDGET = 4000


def scripted(steps: int, agent_requests: list):
    """Odd steps print ~2,000 characters of text from Python, even steps memorize a note; the last step says
    done."""

    def respond(request):
        if request["model"] != "agent-model" or is_summary_request(request):
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


WAITED = "(waiting for the summary)"  # RunMemory's line when the loop waits for a summary being made
MADE_THEN = re.compile(r"summarizing steps? [0-9-]+ before (?:it leaves|they leave) the view$", re.M)  # made then


def waits(output: str) -> tuple[int, int]:
    """The loop's waits for a summary, from the run's terminal: for one being made in the background, and for one
    made there and then (none was prepared)."""
    return output.count(WAITED), len(MADE_THEN.findall(output))


def measure(steps: int, package_root: Path, prefill_s: float = 0.0, budget: int = BUDGET,
            own_summarizer: bool = True) -> dict:
    agent_requests: list = []
    with tempfile.TemporaryDirectory() as tmp, FakeLLM(responder=scripted(steps, agent_requests),
                                                       prefill_s_per_token=prefill_s) as llm:
        work = Path(tmp) / "work"
        work.mkdir()
        env = dict(os.environ, OPENAI_BASE_URL=llm.url, OPENAI_API_KEY="bench", MINIAGI_HOME=str(Path(tmp) / "home"),
                   MINIAGI_MODEL="agent-model", MINIAGI_SUMMARIZER_MODEL="summarizer",
                   MINIAGI_MAX_CONTEXT_TOKENS=str(budget), MINIAGI_MAX_STEPS=str(steps + 5), MINIAGI_MAX_COST="0",
                   PYTHONPATH=str(package_root), COLUMNS="1000")
        if not own_summarizer:  # miniagi's default: the agent's model summarizes
            del env["MINIAGI_SUMMARIZER_MODEL"]
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
            "wall_s": wall, "budget": budget, "waits": waits(done.stdout + done.stderr)}

# --- the peers' run ----------------------------------------------------------------------------------------------
PEERS_OBJECTIVE = "Find why the parser's tests fail in this project and fix it"
MODULES = ["parser", "lexer", "config", "cache", "cli", "render", "store", "net", "auth", "jobs", "report", "util"]
STEP_KINDS = ["listing", "code", "grep", "tests", "log", "diff"]


def peers_output(n: int) -> str:
    """Step n's output, ~1,300 characters, of one of the kinds a coding agent reads, all different."""
    kind, module = STEP_KINDS[n % len(STEP_KINDS)], MODULES[n % len(MODULES)]
    lines: list[str] = []
    i = 0
    while len("\n".join(lines)) < 1250:
        name = MODULES[(n * 5 + i) % len(MODULES)]
        if kind == "listing":
            lines.append(f"-rw-r--r-- 1 dev dev {(n * 7919 + i * 613) % 40000:6d} Mar {1 + (n + i) % 28:2d} "
                         f"{9 + i % 12:02d}:{(n * 13 + i * 7) % 60:02d} src/{module}/{name}_{n}_{i}.py")
        elif kind == "code":
            lines.append(f"    def {name}_step_{n}_{i}(self, value: int) -> int:" if i % 3 == 0 else
                         f"        total = self.{name}_{i} * {n + i} + value  # {module} rule {n}.{i}" if i % 3 == 1
                         else f"        return total if total < {1000 * n + i} else self.reset_{name}()")
        elif kind == "grep":
            lines.append(f"src/{name}/core.py:{10 + (n * 31 + i * 17) % 900}:    "
                         f"result = {module}.lookup(key_{n}_{i}, default=None)")
        elif kind == "tests":
            status = "FAILED" if (n + i) % 7 == 0 else "PASSED"
            lines.append(f"tests/test_{name}.py::test_{module}_case_{n}_{i} {status} "
                         f"[{min(100, (i + 1) * 4):3d}%]")
        elif kind == "log":
            lines.append(f"2026-03-{1 + n % 28:02d}T{i % 24:02d}:{(n * 11 + i) % 60:02d}:{i * 7 % 60:02d}Z "
                         f"{'WARN' if i % 5 == 0 else 'INFO'} {name}: handled request {n * 1000 + i} "
                         f"in {(n * 37 + i * 11) % 500} ms")
        else:
            lines.append(f"@@ -{n + i * 9},7 +{n + i * 9},8 @@ def {name}_{n}():" if i % 4 == 0 else
                         f"-    limit = {n * 10 + i}" if i % 4 == 1 else
                         f"+    limit = {n * 10 + i + 1}  # was off by one" if i % 4 == 2 else
                         f"     return {module}.check(limit, {i})")
        i += 1
    return "\n".join(lines)


def fake_summary(prompt: str) -> str:
    """What a summarizer writes: a line per step it is asked to cover (the newest kept), within the words it is
    told."""
    covered = re.search(r"summary of steps (\d+)-(\d+)", prompt, re.I)  # 1-N, or a part to append: K-N
    words = re.search(r"at most (\d+) words", prompt)
    first, last = (int(covered.group(1)), int(covered.group(2))) if covered else (1, 1)
    lines = [f"- step {k}: read the {STEP_KINDS[k % len(STEP_KINDS)]} of {MODULES[k % len(MODULES)]}; "
             f"noted limit {k * 10 + 1} in {MODULES[k % len(MODULES)]}.py." for k in range(first, last + 1)]
    limit = int(words.group(1)) if words else 200
    while lines and len(" ".join(lines).split()) > limit:
        lines.pop(0)
    return "Progress so far, step by step:\n" + "\n".join(lines)


def is_summary_request(request: dict) -> bool:
    """A summarizer call (a fold, a digest, a condensing), whatever model makes it."""
    return any(marker in (message.get("content") or "") for message in request.get("messages", [])[-1:] +
               request.get("messages", [])[:1] for marker in ("running summary", "Condense"))


def peers_scripted(steps: int, agent_requests: list):
    def respond(request):
        if is_summary_request(request):
            return fake_summary((request["messages"][-1].get("content") or ""))
        agent_requests.append(request)
        n = len(agent_requests)
        if n >= steps:
            return "<r>the failing test is fixed; report it</r><c>done</c>\nThe parser's limit was off by one."
        kind = STEP_KINDS[n % len(STEP_KINDS)]
        return (f"<r>look at the {kind} of {MODULES[n % len(MODULES)]} for the failing parser test</r>"
                f"<c>execute_shell</c>\ncat out/{n:03d}.txt")

    return respond


def fresh_tokens(requests: list[dict]) -> list[int]:
    """Each request's tokens read afresh under a perfect prefix cache per model: its tokens less the longest
    beginning it shares with any earlier request to the same model (found by characters, counted in tokens)."""
    fresh, earlier = [], {}
    for request in requests:
        text = rendered_prompt(request)
        seen = earlier.setdefault(request["model"], [])
        best = max(seen, key=lambda other: char_prefix(other, text), default="")
        shared = common_prefix(encode(best), encode(text)) if best else 0
        fresh.append(len(encode(text)) - shared)
        seen.append(text)
    return fresh


def encode(text: str) -> list[int]:
    return ENCODING.encode(text, disallowed_special=())


RECALLED = re.compile(r"\n\nRELEVANT MEMORIES.*?<<<END UNTRUSTED DATA>>>", re.S)


def append_only(agent_requests: list[dict], replies: list[str]) -> int:
    """What an agent appending each step's reply and observation to one conversation reads afresh over these steps
    under a perfect prefix cache: its system prompt, its first message and every later message, once. The
    observations are taken from the run's own prompts (each step's, whole, in the prompt after it, with its
    request for the next action)."""
    first = agent_requests[0]["messages"]
    conversation = [first[0], first[1]]
    for request, reply in zip(agent_requests[1:], replies):
        observation = RECALLED.sub("", request["messages"][-1]["content"])  # recall is miniagi's, not theirs
        conversation += [{"role": "assistant", "content": reply}, {"role": "user", "content": observation}]
    return len(encode(rendered_prompt({"messages": conversation})))


def measure_peers(steps: int, package_root: Path, budget: int, separate_summarizer: bool,
                  prefill_s: float = 0.0) -> dict:
    agent_requests: list = []
    respond = peers_scripted(steps, agent_requests)
    replies: list[str] = []

    def recorded(request):
        reply = respond(request)
        if agent_requests and request is agent_requests[-1]:
            replies.append(reply)
        return reply

    with tempfile.TemporaryDirectory() as tmp, FakeLLM(responder=recorded, prefill_s_per_token=prefill_s) as llm:
        work = Path(tmp) / "work"
        (work / "out").mkdir(parents=True)
        for n in range(1, steps + 1):
            (work / "out" / f"{n:03d}.txt").write_text(peers_output(n) + "\n")
        env = dict(os.environ, OPENAI_BASE_URL=llm.url, OPENAI_API_KEY="bench", MINIAGI_HOME=str(Path(tmp) / "home"),
                   MINIAGI_MODEL="agent-model", MINIAGI_MAX_CONTEXT_TOKENS=str(budget),
                   MINIAGI_MAX_STEPS=str(steps + 5), MINIAGI_MAX_COST="0", PYTHONPATH=str(package_root),
                   COLUMNS="1000")
        env.pop("MINIAGI_SUMMARIZER_MODEL", None)
        if separate_summarizer:
            env["MINIAGI_SUMMARIZER_MODEL"] = "summarizer"
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "miniagi", "-y", "--unattended", PEERS_OBJECTIVE],
                              cwd=work, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"the run failed ({done.returncode}): {done.stderr[-800:]}")
        requests = list(llm.requests)
    fresh = fresh_tokens(requests)
    summarizer = [f for f, r in zip(fresh, requests) if is_summary_request(r)]
    sizes = [len(encode(rendered_prompt(r))) for r in requests]
    recalled = sum(len(encode(found)) for r in agent_requests
                   for found in RECALLED.findall(r["messages"][-1].get("content") or ""))
    return {"steps": len(agent_requests), "fresh": sum(fresh), "summarizer_fresh": sum(summarizer),
            "recalled": recalled,
            "summarizer_calls": len(summarizer), "append_only": append_only(agent_requests, replies),
            "largest": max(sizes), "largest_agent": max(len(encode(rendered_prompt(r))) for r in agent_requests),
            "calls_per_step": len(requests) / len(agent_requests), "budget": budget, "wall_s": wall,
            "waits": waits(done.stdout + done.stderr)}


def report_peers(label: str, figures: dict, timed: bool) -> None:
    ratio = figures["fresh"] / figures["append_only"]
    line = (f"  {label}: {figures['fresh']:,} tokens read afresh over every request ({figures['summarizer_fresh']:,} "
            f"of them by {figures['summarizer_calls']} summarizer calls, {figures['recalled']:,} in automatic recall's "
            f"tails); append-only {figures['append_only']:,}: "
            f"{ratio:.2f}x; largest prompt {figures['largest']:,} of {figures['budget']:,} (agent "
            f"{figures['largest_agent']:,}); {figures['calls_per_step']:.2f} model calls per step")
    if timed:
        waited, made = figures["waits"]
        line += (f"; 1 ms per uncached token: {figures['wall_s']:.1f} s wall, {waited} waits for a summary being "
                 f"made, {made} made there and then")
    print(line)


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
    parser.add_argument("--peers", type=int, default=100, metavar="N", help="steps of the peers' run (0: skip it)")
    parser.add_argument("--peers-budget", type=int, default=8000, help="--max-context-tokens of the peers' run")
    parser.add_argument("--wall", action="store_true", help="also time the peers' run at 1 ms per uncached token")
    args = parser.parse_args()
    versions = [("now", Path(args.root) if args.root else ROOT)]
    worktree = None
    if args.before:
        worktree = Path(tempfile.mkdtemp(prefix="miniagi-before-"))
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), args.before],
                       check=True, capture_output=True)
        versions.insert(0, (f"before ({args.before})", worktree))
    try:
        if args.peers:
            for separate in (False, True):
                print(f"peers' run, {args.peers} steps, budget {args.peers_budget} tokens, "
                      + ("a summarizer model of its own:" if separate else "the summarizer is the agent's model:"))
                for label, root in versions:
                    report_peers(label, measure_peers(args.peers, root, args.peers_budget, separate), False)
                    if args.wall:
                        report_peers(label + ", timed", measure_peers(args.peers, root, args.peers_budget, separate,
                                                                      prefill_s=0.001), True)
        for steps in (int(n) for n in args.steps.split(",") if int(n)):
            print(f"{steps}-step run, budget {args.budget} tokens:")
            for label, root in versions:
                report(label, measure(steps, root, budget=args.budget))
        if args.no_wall:
            return
        print("100-step run, the server spending 1 ms per uncached prompt token:")
        for own in (True, False):
            for label, root in versions:
                figures = measure(100, root, prefill_s=0.001, budget=args.budget, own_summarizer=own)
                waited, made = figures["waits"]
                print(f"  {label}, {'a summarizer model of its own' if own else 'the agent model summarizes'}: "
                      f"{figures['wall_s']:.1f} s wall ({figures['fresh']:,} agent tokens read afresh; the loop "
                      f"waited for {waited} summaries being made and {made} made there and then)")
    finally:
        if worktree is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)],
                           capture_output=True)


if __name__ == "__main__":
    main()
