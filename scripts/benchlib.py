"""Shared by the benchmarks: a scripted agent on an instant local OpenAI-compatible server, timed runs, and a
vector store filled to a given size."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from memory.context import MESSAGE_OVERHEAD, REPLY_PRIMING  # noqa: E402
from memory.tokens import counter_for  # noqa: E402
from tests.fake_llm import FakeLLM  # noqa: E402

TOPICS = ["weather", "prices", "logs", "users", "files", "network", "builds", "tests", "metrics", "errors"]
OBJECTIVE = "Collect reports on many topics, then finish"


@contextmanager
def checkout(rev: str | None) -> Iterator[Path | None]:
    """An earlier commit checked out in a temporary worktree (None when no rev is given), removed afterwards."""
    if rev is None:
        yield None
        return
    worktree = Path(tempfile.mkdtemp(prefix="miniagi-before-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), rev], check=True,
                   capture_output=True)
    try:
        yield worktree
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)], capture_output=True)


def common_prefix(previous: list[int], current: list[int]) -> int:
    """How many tokens `current` shares with the start of `previous` (what a prefix cache would serve)."""
    n = 0
    for a, b in zip(previous, current):
        if a != b:
            break
        n += 1
    return n


def scripted_agent(steps: int, agent_prompts: list):
    """Step n prints a ~300-number report on a topic; the last step says done. Summaries are canned."""

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


class TimedModel:
    """Wraps the real client and records when each call started, how long it took and which thread made it; and,
    with `waits_for_summaries`, when the loop waited for a summary made in the background."""

    def __init__(self, model):
        self.model = model
        self.calls: list[tuple[float, float, str, int]] = []  # (start, duration, role, thread)
        self.waits: list[tuple[float, float, int]] = []  # (start, duration, thread): a summary waited for
        self.cpu: list[tuple[float, float, str, int]] = []  # (the thread's CPU time at the start, CPU used, …)

    def complete(self, messages, *, model, role="agent", **options):
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            return self.model.complete(messages, model=model, role=role, **options)
        finally:
            self.calls.append((started, time.perf_counter() - started, role, threading.get_ident()))
            self.cpu.append((cpu, time.thread_time() - cpu, role, threading.get_ident()))

    def step_cpu(self) -> list[float]:
        """Per agent step: the CPU time the loop's thread used from one agent call to the next, less what it used
        inside model calls (the client's side of a call: building the request, reading the reply). CPU time hardly
        changes with what else a shared machine is doing; the loop's waits (for a summary, a lookup) use none."""
        agent = [call for call in self.cpu if call[2] == "agent"]
        loop = agent[0][3] if agent else None
        return [following[0] - this[0] - sum(used for start, used, _, thread in self.cpu
                                             if thread == loop and this[0] <= start < following[0])
                for this, following in zip(agent, agent[1:])]

    @contextmanager
    def waits_for_summaries(self) -> Iterator[None]:
        """Times the loop's waits for a summary prepared in another thread (memory.run_memory.Preparation.wait)."""
        from memory.run_memory import Preparation

        original = Preparation.wait

        def wait(preparation):
            started = time.perf_counter()
            try:
                return original(preparation)
            finally:
                self.waits.append((started, time.perf_counter() - started, threading.get_ident()))

        Preparation.wait = wait
        try:
            yield
        finally:
            Preparation.wait = original

    def step_overheads(self) -> list[float]:
        """Per agent step: wall time from one agent call to the next, minus the model's time as the loop met it:
        the calls the loop's own thread made, and the part of its waits for a summary during which another
        thread's model call was under way. A summary made in the background while the loop works is not
        subtracted: the loop did not wait for it."""
        agent = [call for call in self.calls if call[2] == "agent"]
        loop = agent[0][3] if agent else None
        others = _union([(start, start + took) for start, took, _, thread in self.calls if thread != loop])
        overheads = []
        for this, following in zip(agent, agent[1:]):
            begin, end = this[0], following[0]
            model = sum(took for start, took, _, thread in self.calls if thread == loop and begin <= start < end)
            waited = sum(_overlap((start, start + took), others) for start, took, thread in self.waits
                         if thread == loop and begin <= start < end)
            overheads.append(end - begin - model - waited)
        return overheads


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _overlap(span: tuple[float, float], spans: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(span[1], end) - max(span[0], start)) for start, end in spans)


@dataclass
class AgentRun:
    result: object
    sizes: list[int]
    roles: dict
    elapsed: float
    overheads: list[float] = field(default_factory=list)
    model_call_s: list[float] = field(default_factory=list)
    step_cpu_s: list[float] = field(default_factory=list)  # the loop's own CPU per step (TimedModel.step_cpu)
    model_call_cpu_s: list[float] = field(default_factory=list)  # the client's CPU per agent call


def _serve(steps: int, connection) -> None:
    """The scripted model, in a process of its own (as a real endpoint is): prompt sizes and calls per role
    are counted here and sent back when the run is over."""
    prompts: list = []
    with FakeLLM(responder=scripted_agent(steps, prompts)) as llm:
        connection.send(llm.url)
        connection.recv()  # the run is over
        roles = {"agent": 0, "summarizer": 0, "critic": 0}
        for request in llm.requests:
            roles["agent" if request["model"] == "agent-model" else "summarizer"] += 1
    counter = counter_for("gpt-4o-mini")
    connection.send(([sum(counter.count(m["content"]) + MESSAGE_OVERHEAD for m in p) + REPLY_PRIMING
                      for p in prompts], roles))


def run_agent(steps: int, budget: int, home: Path, memory_scope: str = "global", **options) -> AgentRun:
    """A run of the scripted agent, timed step by step (`options`: more settings)."""
    import multiprocessing

    from miniagi import Agent, OpenAIModel, Settings
    from miniagi.cli import compact_malloc
    from miniagi.config import Endpoint
    from miniagi.terminal import Terminal

    compact_malloc()  # as `miniagi` does at start
    ours, theirs = multiprocessing.Pipe()
    server = multiprocessing.get_context("spawn").Process(target=_serve, args=(steps, theirs), daemon=True)
    server.start()
    try:
        url = ours.recv()
        settings = Settings(model="agent-model", summarizer_model="summarizer-model", yes=True, unattended=True,
                            max_steps=steps + 5, max_cost=0, max_context_tokens=budget,
                            max_memory_item_tokens=600, workdir=str(home / "work"), home=str(home),
                            memory_scope=memory_scope, **options)
        model = TimedModel(OpenAIModel(Endpoint(api_key="k", base_url=url)))
        agent = Agent(settings, model=model, ui=Terminal(interactive=False, quiet=True))
        started = time.perf_counter()
        with model.waits_for_summaries():
            result = agent.run(OBJECTIVE)
        elapsed = time.perf_counter() - started
        ours.send("done")
        sizes, roles = ours.recv()
    finally:
        server.join(timeout=10)
    return AgentRun(result, sizes, roles, elapsed, model.step_overheads(), [c[1] for c in model.calls],
                    model.step_cpu(), [c[1] for c in model.cpu if c[2] == "agent"])


def recycled_embedder(base):
    """Vectors derived from real embeddings plus noise, so 100k stored items load in a minute or two; queries and
    timed adds still go through the real embedder."""
    import numpy as np

    from memory.embeddings import MiniLMEmbedder

    class Recycled:
        name = MiniLMEmbedder.name

        def __init__(self):
            self.rng = np.random.default_rng(0)

        def embed(self, batch):
            rows = base[self.rng.integers(0, len(base), len(batch))] + self.rng.normal(0, 0.02, (len(batch), 384))
            return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)

    return Recycled()


def sample_texts(count: int = 2000) -> list[str]:
    return [f"step {i}: {TOPICS[i % 10]} report number {i}, value {i * 37 % 1000}" for i in range(count)]


def fill_store(path: Path, target: int, already: int = 0, base=None) -> int:
    """Store items until the memory under `path` holds `target` (counting `already`); returns the new count."""
    from memory.embeddings import MiniLMEmbedder
    from memory.store import MemoryItem, VectorMemory

    texts = sample_texts()
    if base is None:
        base = MiniLMEmbedder().embed(texts)
    filler = VectorMemory(path, recycled_embedder(base))
    stored = already
    while stored < target:
        batch = min(4000, target - stored)
        filler.add([MemoryItem(f"fill:{n}", texts[n % len(texts)], f"run{n // 300}", "step", n % 300)
                    for n in range(stored, stored + batch)])
        stored += batch
    return stored
