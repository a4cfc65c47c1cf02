"""Memory benchmark: prompt size against step number, model calls per step by role, and vector memory latency.

    python scripts/bench_memory.py                 # 300-step run + memory latency at 10k and 100k items
    python scripts/bench_memory.py --steps 100 --sizes 10000

The model is a scripted OpenAI-compatible server on 127.0.0.1 answering instantly, driven by the real openai
client; commands really run. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchlib import TOPICS, fill_store, run_agent, sample_texts


def bench_agent(steps: int, budget: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run = run_agent(steps, budget, Path(tmp))
    sizes, result = run.sizes, run.result
    print(f"\n== {steps}-step run, --max-context-tokens {budget} ({result.status}, {run.elapsed:.1f} s)")
    print("prompt tokens per agent call, by step:")
    for step in sorted({1, 2, 5, 10, 25, 50, 100, 150, 200, 250, 300, steps} & set(range(1, len(sizes) + 1))):
        print(f"  step {step:4d}: {sizes[step - 1]:6d}")
    print(f"  largest: {max(sizes)} = {100 * max(sizes) / budget:.1f} % of the budget")
    print("model calls per step, by role: " + ", ".join(
        f"{role} {count / result.steps:.3f}" for role, count in run.roles.items())
          + f" · all roles {sum(run.roles.values()) / result.steps:.3f}")
    print(f"total prompt tokens: {sum(sizes)} (first 100 steps: {sum(sizes[:100])})")


def bench_store(sizes: list[int]) -> None:
    from memory.embeddings import MiniLMEmbedder
    from memory.store import MemoryItem, VectorMemory

    embedder = MiniLMEmbedder()
    texts = sample_texts()
    started = time.perf_counter()
    base = embedder.embed(texts)
    print(f"\n== embedder: {len(texts) / (time.perf_counter() - started):.0f} texts/s ({len(texts)} short texts)")
    query_times = []
    for i in range(50):
        started = time.perf_counter()
        embedder.embed([f"what was the {TOPICS[i % 10]} value in report {i}"])
        query_times.append(time.perf_counter() - started)
    print(f"   one query embedded: {statistics.median(query_times) * 1000:.2f} ms median")
    print("== vector memory (chromadb, persistent, cosine)")
    print(f"  {'items':>8}  {'fill s':>7}  {'add 1 step now (embed+write) ms':>32}  {'query (embed+search) ms':>24}")
    with tempfile.TemporaryDirectory() as tmp:
        stored = 0
        memory = VectorMemory(Path(tmp), embedder)
        for size in sorted(sizes):
            started = time.perf_counter()
            stored = fill_store(Path(tmp), size, stored, base)
            fill = time.perf_counter() - started
            adds, queries = [], []
            for i in range(30):
                started = time.perf_counter()
                memory.add([MemoryItem(f"timed:{size}:{i}", f"Thought: check {TOPICS[i % 10]}\nResult: value {i}",
                                       "bench", "step", i)])
                adds.append(time.perf_counter() - started)
                started = time.perf_counter()
                memory.search(f"{TOPICS[i % 10]} report value", 12)
                queries.append(time.perf_counter() - started)
            stored += 30
            print(f"  {size:>8}  {fill:7.1f}  {statistics.median(adds) * 1000:32.2f}  "
                  f"{statistics.median(queries) * 1000:24.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--budget", type=int, default=8000)
    parser.add_argument("--sizes", default="10000,100000", help="stored-item counts for the latency figures")
    args = parser.parse_args()
    bench_agent(args.steps, args.budget)
    bench_store([int(s) for s in args.sizes.split(",") if s])


if __name__ == "__main__":
    main()
