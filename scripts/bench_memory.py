"""Memory benchmark: prompt size against step number, model calls per step by role, and vector memory latency.

    python scripts/bench_memory.py                 # 300-step run + memory latency at 10k and 100k items
    python scripts/bench_memory.py --steps 100 --sizes 10000

The model is a scripted OpenAI-compatible server on 127.0.0.1 answering instantly, driven by the real openai
client; commands really run. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memory.context import MESSAGE_OVERHEAD, REPLY_PRIMING  # noqa: E402
from memory.tokens import counter_for  # noqa: E402
from tests.fake_llm import FakeLLM  # noqa: E402

TOPICS = ["weather", "prices", "logs", "users", "files", "network", "builds", "tests", "metrics", "errors"]


def scripted_agent(steps: int, agent_prompts: list):
    def respond(request):
        if request["model"] != "agent-model":
            return "Summary: the agent has been collecting reports on " + ", ".join(TOPICS) + "."
        agent_prompts.append(request["messages"])
        n = len(agent_prompts)
        if n >= steps:
            return "<r>all done</r><c>done</c>\nfinished"
        topic = TOPICS[n % len(TOPICS)]
        code = f"print('report {n} on {topic}: ' + ' '.join(str(i * {n}) for i in range(300)))"
        return f"<r>collect report {n} on {topic}</r><c>execute_python</c>\n{code}"

    return respond


def run_agent(steps: int, budget: int, home: Path) -> dict:
    from miniagi import Agent, OpenAIModel, Settings
    from miniagi.config import Endpoint
    from miniagi.ui import Terminal

    prompts: list = []
    with FakeLLM(responder=scripted_agent(steps, prompts)) as llm:
        settings = Settings(model="agent-model", summarizer_model="summarizer-model", yes=True, unattended=True,
                            max_steps=steps + 5, max_cost=0, max_context_tokens=budget,
                            max_memory_item_tokens=600, workdir=str(home / "work"), home=str(home))
        started = time.perf_counter()
        agent = Agent(settings, model=OpenAIModel(Endpoint(api_key="k", base_url=llm.url)),
                      ui=Terminal(interactive=False, quiet=True))
        result = agent.run(
            "Collect reports on many topics, then finish")
        elapsed = time.perf_counter() - started
        roles = {"agent": 0, "summarizer": 0}
        for request in llm.requests:
            roles["agent" if request["model"] == "agent-model" else "summarizer"] += 1
    counter = counter_for("gpt-4o-mini")
    sizes = [sum(counter.count(m["content"]) + MESSAGE_OVERHEAD for m in p) + REPLY_PRIMING for p in prompts]
    return {"result": result, "sizes": sizes, "roles": roles, "elapsed": elapsed}


def bench_agent(steps: int, budget: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run = run_agent(steps, budget, Path(tmp))
    sizes, result = run["sizes"], run["result"]
    print(f"\n== {steps}-step run, --max-context-tokens {budget} ({result.status}, {run['elapsed']:.1f} s)")
    print("prompt tokens per agent call, by step:")
    for step in sorted({1, 2, 5, 10, 25, 50, 100, 150, 200, 250, 300, steps} & set(range(1, len(sizes) + 1))):
        print(f"  step {step:4d}: {sizes[step - 1]:6d}")
    print(f"  largest: {max(sizes)} = {100 * max(sizes) / budget:.1f} % of the budget")
    total_steps = result.steps
    print("model calls per step, by role: " + ", ".join(
        f"{role} {count / total_steps:.3f}" for role, count in run["roles"].items())
          + f", critic 0.000 · all roles {sum(run['roles'].values()) / total_steps:.3f}")
    print(f"total prompt tokens: {sum(sizes)} (first 100 steps: {sum(sizes[:100])})")


def bench_store(sizes: list[int]) -> None:
    import numpy as np

    from memory.embeddings import MiniLMEmbedder
    from memory.store import MemoryItem, VectorMemory

    embedder = MiniLMEmbedder()
    texts = [f"step {i}: {TOPICS[i % 10]} report number {i}, value {i * 37 % 1000}" for i in range(2000)]
    started = time.perf_counter()
    base = embedder.embed(texts)
    rate = len(texts) / (time.perf_counter() - started)
    print(f"\n== embedder: {rate:.0f} texts/s (batch of {len(texts)} short texts)")
    query_times = []
    for i in range(50):
        started = time.perf_counter()
        embedder.embed([f"what was the {TOPICS[i % 10]} value in report {i}"])
        query_times.append(time.perf_counter() - started)
    print(f"   one query embedded: {statistics.median(query_times) * 1000:.2f} ms median")

    class Recycled:
        """Stored vectors derived from real embeddings plus noise, so 100k items load in seconds; queries and
        timed adds still go through the real embedder."""

        name = embedder.name

        def __init__(self):
            self.rng = np.random.default_rng(0)

        def embed(self, batch):
            rows = base[self.rng.integers(0, len(base), len(batch))] + self.rng.normal(0, 0.02, (len(batch), 384))
            return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)

    print("== vector memory (chromadb, persistent, cosine)")
    print(f"  {'items':>8}  {'fill s':>7}  {'add 1 step (embed+write) ms':>28}  {'query (embed+search) ms':>24}")
    with tempfile.TemporaryDirectory() as tmp:
        filler = VectorMemory(Path(tmp), Recycled())
        timed = VectorMemory(Path(tmp), embedder)
        stored = 0
        for size in sorted(sizes):
            started = time.perf_counter()
            while stored < size:
                batch = min(4000, size - stored)
                filler.add([MemoryItem(f"fill:{n}", texts[n % len(texts)], f"run{n // 300}", "step", n % 300)
                            for n in range(stored, stored + batch)])
                stored += batch
            fill = time.perf_counter() - started
            adds, queries = [], []
            timed._collection = filler.collection
            for i in range(30):
                started = time.perf_counter()
                timed.add([MemoryItem(f"timed:{size}:{i}", f"Thought: check {TOPICS[i % 10]}\nResult: value {i}",
                                      "bench", "step", i)])
                adds.append(time.perf_counter() - started)
                started = time.perf_counter()
                timed.search(f"{TOPICS[i % 10]} report value", 12)
                queries.append(time.perf_counter() - started)
            stored += 30
            print(f"  {size:>8}  {fill:7.1f}  {statistics.median(adds) * 1000:28.2f}  "
                  f"{statistics.median(queries) * 1000:24.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--budget", type=int, default=8000)
    parser.add_argument("--sizes", default="10000,100000", help="stored-item counts for the latency figures")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    bench_agent(args.steps, args.budget)
    bench_store([int(s) for s in args.sizes.split(",") if s])


if __name__ == "__main__":
    main()
