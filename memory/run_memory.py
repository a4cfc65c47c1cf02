"""What one run remembers, and how it reaches the agent's context within the budget and cache-friendly.

- the steps in view, verbatim and append-only: each prompt begins with all of the one before but its tail, so the
  endpoint's prompt cache serves it;
- a rolling summary of the steps out of view, in the head, saying which steps it covers. By construction, a step
  leaves the view only when a summary made from it is adopted: the view is every step after the summary's last.
  Once room for the next steps runs out, the summary of every step in view is prepared in the background (through
  `ask`, each step read whole; when the summarizer is the agent's model, as the agent's own prompt and an
  instruction, which its prompt cache serves) early enough to be ready in time, and adopted in the first prompt
  built once it is; if room runs out first, the loop waits for it (saying so on the terminal), or makes one there
  and then;
- every note the model memorized, whole: in its own step while that is in view, then in the head, newest first.
  If the notes outgrow their share of the budget, the oldest are condensed by the summarizer into a digest, and
  the head says so;
- memories recalled from the vector store for this step (other runs' steps, answers, notes and documents; this
  run's steps out of view) that are relevant to the objective and the latest thought, in the room the prompt has
  left (up to their share), each whole or as whole sentences around what matters; nothing the prompt shows already.
"""

from __future__ import annotations

import threading
from functools import cached_property
from typing import Callable

from .archive import Archive
from .context import NOTE_COMMAND, Context, ContextBuilder, Note, StepRecord, Summary, head_notes, message_text
from .recall import AutoRecall, Recalled, Recaller
from .store import MemoryItem, VectorMemory
from .summarizer import Ask, Cancelled, Summarizer
from .tokens import TokenCounter

RECALL_COMMAND = "recall"
FOLD_KEEP = 0.3  # of the room for steps: the newest steps that stay in view, verbatim, when older ones leave
RECALL_RESERVE = 0.5  # of the recall share: kept free for recall when deciding whether steps must leave


class Layout:
    """A prompt measured before its tail's recall is chosen. The fixed part and the tail are counted when first
    needed: a first prompt that recalls nothing is sent without counting them (see ContextBuilder.assemble)."""

    def __init__(self, view: list[StepRecord], head: str, pairs: list[list[dict]], counts: list[int],
                 count_fixed: Callable[[], int], count_tail: Callable[[], int]):
        self.view, self.head, self.pairs, self.counts = view, head, pairs, counts
        self._count_fixed, self._count_tail = count_fixed, count_tail

    @cached_property
    def fixed(self) -> int:  # system and head
        return self._count_fixed()

    @cached_property
    def tail(self) -> int:  # the tail without recalled memories
        return self._count_tail()

    @property
    def tokens(self) -> int:
        return self.fixed + sum(self.counts) + self.tail


class Preparation:
    """A summary made in a thread of its own, from `base`, while the steps it covers are still in view. Cancelled
    (at the run's end), it makes no further model call."""

    def __init__(self, base: Summary, make: Callable[[threading.Event], Summary], span: str = "the oldest steps",
                 through: int = 0):
        self.base, self.span, self.through = base, span, through  # through: the last step it covers
        self.summary: Summary | None = None
        self.error: BaseException | None = None
        self.cancelled = threading.Event()
        self.thread = threading.Thread(target=self._make, args=(make,), name="summary", daemon=True)
        self.thread.start()

    def _make(self, make: Callable[[threading.Event], Summary]) -> None:
        try:
            self.summary = make(self.cancelled)
        except BaseException as exc:  # raised in the run's thread, by wait()
            self.error = exc

    def wait(self) -> Summary | None:
        self.thread.join()
        if self.error is not None and not isinstance(self.error, Cancelled):
            raise self.error
        return self.summary


class RunMemory:
    def __init__(self, *, builder: ContextBuilder, summarizer_counter: TokenCounter, ask_summarizer: Ask,
                 store: VectorMemory | None, scope: str, run_id: str, state, workdir: str = "",
                 code_commands: frozenset[str] = frozenset(), archive: Archive | None = None, runs_root=None,
                 notify: Callable[[str], None] = lambda text: None, summarizer_shares_prefix: bool = False):
        """`state`: the run's state (`RunState`), which owns the objective, the background (a follow-up's account of
        the run it continues) and the summary: the memory reads them there, and the run records a new summary,
        which `context` returns, as an event that its state applies. `archive`: where everything the run sees is
        kept whole, for the recall command (`runs_root`: the folder of every run's folder, for earlier runs'
        archives). `notify`: a line on the terminal (the loop waits for a summary before steps leave the view).
        `code_commands`: commands whose argument is code: it says little about intent and costs much to embed, so
        recall's queries leave it out. `summarizer_shares_prefix`: the summarizer is the agent's model, so a fold can
        be the agent's prompt and an instruction (its cache serves the prompt; see Summarizer.make_summary)."""
        self.builder = builder
        self.counter = builder.counter
        self.summarizer_counter = summarizer_counter
        self.scope = scope
        self.run_id = run_id
        self.state = state
        self._folding: Summary | None = None  # the summary a context is being built with, until it returns
        self.workdir = workdir
        self.summarizer = Summarizer(builder=builder, counter_in=summarizer_counter, ask=ask_summarizer,
                                     objective=lambda: self.objective)
        self.summary_cap = self.summarizer.summary_cap
        self.recall_budget = builder.budget.recall
        self.code_commands = code_commands
        self.recaller = AutoRecall(store, run_id=run_id, scope=scope, workdir=workdir, counter=self.counter,
                                   code_commands=code_commands, objective=lambda: self.objective,
                                   view=lambda: (self.summary.through_step, self.summary.notes_through),
                                   archive=lambda: self.archive, runs_root=runs_root)
        self.last_recalled: list[Recalled] = []
        self.preparing: Preparation | None = None
        self.prepared: Summary | None = None  # made from the one in the prompt (or the one before it prepared)
        self.rendered: dict[int, tuple[list[dict], int]] = {}  # step in view → its messages and their tokens
        self._squeezed: StepRecord | None = None  # the newest step, shown cut in the last prompt
        # a fold begins with the agent's prompt when the summarizer is its model and no tool schemas precede it
        self.shares_prefix = summarizer_shares_prefix and not builder.reserved
        self.ahead = 1  # steps before room runs out that a summary starts (see _prepare)
        self.collected = 0  # summaries made in the background and collected
        self.notify = notify
        self._failure = ""  # why the archive was turned off mid-run
        self._deferred: list[MemoryItem] | None = None  # items kept back from the store (see defer_vectors)
        self._store_holds = False  # while they are: whether the store may hold items this run could recall
        self.archive = archive
        self.runs_root = runs_root

    @property
    def store(self) -> VectorMemory | None:
        """The vector store recall searches and the run's items go to (None: off, or turned off by a failure)."""
        return self.recaller.store

    def defer_vectors(self, store_holds: bool = False) -> None:
        """Automatic recall goes by words (this run's archive, and earlier runs' by scope: a keyword index needs no
        model): the run's items are kept back from the store (chromadb and the embedder stay unloaded) and written
        to its journal at the end, for later runs. What needs meaning brings the store in (`vectors_needed`): an
        ingest, and the recall command when the store may hold items this run could recall (`store_holds`, known
        without opening it); in a store that holds none, the command goes by words too."""
        if self.store is not None:
            self._deferred = []
            self._store_holds = store_holds
            self.recaller.deferred = True

    def vectors_needed(self) -> None:
        """The store is needed now (an ingest, a recall by meaning): what was kept back goes to it (it is in the
        archive already), and recall searches it again."""
        if self._deferred is None:
            return
        items, self._deferred = self._deferred, None
        self.recaller.deferred = False
        if items and self.store is not None:
            try:
                self.store.add_later(items)
            except Exception as exc:  # chromadb or the embedder failing must not end the run
                self.drop_store(f"{type(exc).__name__}: {exc}")

    def drop_store(self, why: str = "") -> None:
        """Go on without the vector store (it failed: `why`, reported by `take_failure`)."""
        self.recaller.store = None
        if why:
            self.recaller.failure = f"vector memory disabled for this run: {why}"

    def take_failure(self) -> str:
        """Why the vector store or the archive was turned off since last asked ("" when neither was)."""
        failure = "; ".join(f for f in (self.recaller.failure, self._failure) if f)
        self.recaller.failure = self._failure = ""
        return failure

    @property
    def recall_filter(self) -> dict | None:
        return self.recaller.recall_filter

    def prefetch(self, thought: str, command: str, arg: str) -> bool:
        return self.recaller.prefetch(thought, command, arg)

    def prefetch_early(self, thought: str, command: str, arg: str) -> bool:
        return self.recaller.prefetch_early(thought, command, arg)

    def asking(self) -> None:
        """The loop is about to wait for the model: recall's work that can be done meanwhile is done (see
        AutoRecall.asking), up to the steps a summary being made or made will take out of view."""
        self.recaller.asking(max(self.summary.through_step, self.prepared.through_step if self.prepared else 0,
                                 self.preparing.through if self.preparing else 0))

    @property
    def objective(self) -> str:
        return self.state.objective

    @property
    def background(self) -> str:
        return self.state.background

    @property
    def summary(self) -> Summary:
        """The summary in the head: the state's, or while a context is built, the one that takes its place."""
        return self._folding if self._folding is not None else self.state.summary

    # --- building the context ---------------------------------------------------------------------------------
    def context(self, *, system: str, steps: list[StepRecord], next_step: int,
                alerts: str = "", advice: str = "", recall: bool = True) -> tuple[Context, Summary | None]:
        """The agent's next prompt; also returns the new summary when steps left the view to make it. `alerts`
        and `advice` (the critic's labelled block) are for this prompt's tail only.

        The rule, by construction: the view is every step after the summary's `through_step`, and that only moves
        when a summary made from those very steps is adopted. A summary made in the background is adopted in the
        first prompt built once it is ready; if room runs out before it is, the loop waits for it (saying so); with
        none prepared it makes one there and then."""
        limit, self._folding = self.builder.max_tokens, None
        try:
            layout = self._layout(system, steps, next_step, alerts, advice)
            self._collect(wait=False)
            if self.prepared is not None and layout.view and self.prepared.through_step < layout.view[-1].step:
                self._adopt(self.prepared)  # made in the background and ready: in this very prompt
                layout = self._layout(system, steps, next_step, alerts, advice)
            while len(layout.view) > 1 and self._needed(layout) > limit:
                if self.prepared is None and self.preparing is not None:
                    self._collect(wait=True)
                prepared, newest = self.prepared, layout.view[-1].step
                if prepared is not None and prepared.through_step < newest:
                    self._adopt(prepared)  # made in the background: no wait, and perhaps enough
                else:
                    if prepared is not None:  # it would take the newest step out of view too: not that one
                        self.prepared = None
                    last = layout.view[self._leaving(layout) - 1].step
                    leaving = [s for s in steps if self.summary.through_step < s.step <= last]
                    self.notify(f"summarizing {_span(leaving)} before {_they(_span(leaving))} the view")
                    self._adopt(self.make_summary(self.summary, leaving, list(steps)))
                layout = self._layout(system, steps, next_step, alerts, advice)
            squeezed = None
            if layout.view and self._needed(layout) > limit:  # the newest step alone is too big: it is cut to
                squeezed = layout.view[-1]  # fit, so a summary made from it, whole, is in the prompt first
                self._cover(steps, squeezed.step, "read whole, as it is too big for the context and is shown to the "
                            "model cut")
                layout = self._layout(system, steps, next_step, alerts, advice)
            else:
                self._prepare(system, layout, steps)
            context = self._finish(system, steps, layout, next_step, alerts, advice, squeezed, recall)
        finally:
            folded, self._folding = self._folding, None
        if folded is not None:
            self.archive_items([self.item("summary", folded.text, folded.through_step)])
        # a step shown cut in the last prompt and not in this one: this prompt does not extend it either
        context.reshaped = folded is not None or self._squeezed is not None
        self._squeezed = squeezed
        return context, folded

    def _view(self, steps: list[StepRecord]) -> list[StepRecord]:
        return [s for s in steps if s.step > self.summary.through_step]

    def _layout(self, system: str, steps: list[StepRecord], next_step: int, alerts: str, advice: str) -> Layout:
        view = self._view(steps)
        head = self.builder.head(self.objective, self.summary, self.head_notes(steps), self.background)
        pairs, counts = [], []
        for record in view:
            pair, tokens = self._rendering(record)
            pairs.append(pair)
            counts.append(tokens)
        fixed = [{"role": "system", "content": system}, {"role": "user", "content": head}]
        return Layout(view, head, pairs, counts, lambda: self.builder.message_tokens(fixed) + 3,
                      lambda: self.counter.count(self.builder.tail(next_step, "", alerts, advice)) + 2)

    def _needed(self, layout: Layout) -> int:
        return layout.tokens + int(self.recall_budget * RECALL_RESERVE)

    def _rendering(self, record: StepRecord) -> tuple[list[dict], int]:
        """A step as first sent, so every prompt shows it the same way while it is in view."""
        if record.step not in self.rendered:
            pair = self.builder.render(record)
            self.rendered[record.step] = (pair, self.builder.message_tokens(pair))
        return self.rendered[record.step]

    def _leaving(self, layout: Layout, coming: int = 0) -> int:
        """How many of the oldest steps in view leave it: the newest step (or, when preparing, the step `coming`,
        of about that many tokens) and as many before it as fit FOLD_KEEP of the room for steps stay in view."""
        room = self.builder.max_tokens - (self._needed(layout) - sum(layout.counts))
        older = layout.counts if coming else layout.counts[:-1]
        kept, keep = (coming or layout.counts[-1]), 0
        for tokens in reversed(older):
            if kept + tokens > room * FOLD_KEEP:
                break
            kept, keep = kept + tokens, keep + 1
        return max(1, len(older) - keep)

    def _cover(self, steps: list[StepRecord], last: int, why: str) -> None:
        """Adopt a summary that covers every step up to `last` at least: the one prepared, when it does (waited
        for, saying so, while it is being made), else one made there and then from it."""
        if self.preparing is not None and (self.prepared is None or self.prepared.through_step < last):
            self._collect(wait=True)
        base = self._base()
        if base.through_step < last:
            leaving = [s for s in steps if base.through_step < s.step <= last]
            self.notify(f"summarizing {_span(leaving)}: {why}")
            base = self.make_summary(base, leaving, list(steps))
        self._adopt(base)

    def _base(self) -> Summary:
        """What the next summary is made from: the latest one prepared, else the one in the prompt."""
        return self.prepared or self.summary

    def _collect(self, wait: bool) -> None:
        """A preparation that has ended (or, with `wait`, once it ends: the loop says it waits) becomes the latest
        summary prepared, if it was made from the latest."""
        preparing = self.preparing
        if preparing is None or (preparing.thread.is_alive() and not wait):
            return
        if preparing.thread.is_alive():
            self.notify(f"summarizing {preparing.span} before {_they(preparing.span)} the view (waiting for the "
                        "summary)")
            # the next one starts a step earlier; not for the first, which also loads what the run will reuse
            self.ahead += 1 if self.collected else 0
        self.collected += 1
        self.preparing = None
        summary = preparing.wait()
        if summary is not None and preparing.base == self._base():
            self.prepared = summary

    def _prepare(self, system: str, layout: Layout, steps: list[StepRecord]) -> None:
        """Summarize in the background every step in view, once room for the next `ahead` steps is running out (one
        step, and one more each time the loop had to wait for a summary but the run's first; at most half the
        steps in view: each step sooner is a fold sooner), and adopt it as soon as it
        is ready, so the view keeps only the steps that came meanwhile (the fewer steps re-read after a fold, and
        the fewer folds, the closer to what a prompt cache serves an agent that never folds). When the summarizer
        is the agent's model, the fold is this very prompt, up to the steps it folds, and an instruction (see
        Summarizer.make_summary)."""
        if self.preparing is not None or self.prepared is not None or not layout.view:
            return
        likely = max(layout.counts[-3:])  # the next step, judged by the last ones
        ahead = max(1, min(self.ahead, len(layout.view) // 2))
        if self._needed(layout) + likely * ahead <= self.builder.max_tokens:
            return
        base, leaving, shown = self.summary, list(layout.view), None
        # the fold's prompt within the budget: when the instruction does not fit after every step in view (a small
        # budget, where the system prompt takes much of it), a prompt of its own reads them all: one fold, not two
        if self.shares_prefix and (layout.fixed + sum(layout.counts) + self.summarizer.shared_room()
                                   <= self.builder.max_tokens):
            shown = [{"role": "system", "content": system}, {"role": "user", "content": layout.head}]
            shown += [message for pair in layout.pairs for message in pair]
        snapshot = list(steps)
        self.preparing = Preparation(base, lambda cancelled: self.make_summary(base, leaving, snapshot, cancelled,
                                                                               shown),
                                     _span(leaving), leaving[-1].step)

    def _adopt(self, summary: Summary) -> None:
        """The summary takes the place of the steps it covers. (They are stored for recall in the background; the
        loop does not wait for that: the summary made from them is in the prompt.)"""
        self._folding, self.prepared = summary, None
        for step in [s for s in self.rendered if s <= summary.through_step]:
            del self.rendered[step]

    def _finish(self, system: str, steps: list[StepRecord], layout: Layout, next_step: int, alerts: str,
                advice: str, squeezed: StepRecord | None, recall: bool = True) -> Context:
        """The prompt, with what recall finds in the room left; `squeezed`: the newest step, too big for the prompt
        and covered by the summary, shown cut to fit around what matters."""
        limit = self.builder.max_tokens
        pairs, counts = list(layout.pairs), list(layout.counts)
        if squeezed is not None:
            room = limit - layout.fixed - sum(counts) - layout.tail - int(self.recall_budget * RECALL_RESERVE)
            pairs.append(self.builder.render(squeezed, room, query=self.objective, notes=False))
            counts.append(self.builder.message_tokens(pairs[-1]))
        recalled: list[Recalled] = []
        if self.store is not None and recall:
            room = min(self.recall_budget, limit - layout.fixed - sum(counts) - layout.tail - 4)
            shown = "\n".join([layout.head] + [message_text(m) for pair in pairs for m in pair])
            recalled = self.recaller.recall(steps, room, shown)
        while True:
            text = "\n".join(f"- ({item.label}) {item.text}" for item in recalled)
            tail = self.builder.tail(next_step, text, alerts, advice)
            context = self.builder.assemble(system, layout.head, pairs, tail, pair_tokens=counts)
            if not recalled or context.tokens <= limit:  # counts of joined texts may differ by a token or two
                break
            recalled.pop()
        self.last_recalled = recalled
        return context

    def head_notes(self, steps: list[StepRecord]) -> list[Note]:
        """The notes the head shows whole: those of the steps out of view, less the digested ones."""
        return head_notes([Note(s.step, note) for s in steps
                           if self.summary.notes_through < s.step <= self.summary.through_step for note in s.notes])

    def make_summary(self, base: Summary, leaving: list[StepRecord], steps: list[StepRecord],
                     cancelled: threading.Event | None = None, agent_prompt: list[dict] | None = None) -> Summary:
        """The summary once `leaving` have left the view (see Summarizer.make_summary)."""
        return self.summarizer.make_summary(base, leaving, steps, cancelled, agent_prompt)

    def settle(self, wait: bool = True) -> None:
        """At the run's end: a summary still being made is called off (no further model call is made after the
        run ends); a call in flight is waited for, so that it is recorded, or (not `wait`) left behind."""
        preparing, self.preparing, self.prepared = self.preparing, None, None
        if preparing is not None:
            preparing.cancelled.set()
            if wait:
                preparing.thread.join()

    # --- storing ------------------------------------------------------------------------------------------------
    def remember(self, *items: MemoryItem) -> None:
        """Keep items in the archive, whole, at once, and store them for recall by meaning in the background (see
        VectorMemory.add_later)."""
        self.archive_items(items)
        if self._deferred is not None:
            self._deferred.extend(items)
        elif self.store is not None:
            try:
                self.store.add_later(items)
            except Exception as exc:  # chromadb or the embedder failing must not end the run
                self.drop_store(f"{type(exc).__name__}: {exc}")

    def archive_items(self, items) -> None:
        """Items kept whole in the run's archive (an archive that fails, a full disk, is reported and given up: the
        run goes on)."""
        if self.archive is None:
            return
        try:
            self.archive.add((item.id, item.kind, item.step, item.text, item.source) for item in items)
        except Exception as exc:
            self.archive = None
            self._failure = f"the run's archive (recall) disabled for this run: {type(exc).__name__}: {exc}"

    def forget_document(self, source: str) -> None:
        if self.archive is not None:
            self.archive.forget(source)

    def recall(self, query: str, room: int) -> str:
        """The recall command: what the archive (by words) and the vector store (by meaning) hold for `query`."""
        if self.archive is None:
            return "recall is unavailable: this run's archive could not be written."
        if self._deferred is not None and self._store_holds:  # recall by meaning too: the store is loaded now
            self.vectors_needed()
        store = None if self._deferred is not None else self.store  # kept back: words alone, no model loaded
        embedder = store.embedder if store is not None else None
        return Recaller(self.archive, store, scope=self.scope, workdir=self.workdir, runs_root=self.runs_root,
                        counter=self.counter, where=self.recall_filter,
                        relevant_distance=getattr(embedder, "relevant_distance", 2.0)).answer(query, room)

    def flush(self) -> None:
        if self.store is not None:
            self.store.flush()

    def finish(self, wait: bool = True) -> None:
        """The end of a run: its memories stored, or (not `wait`) journaled while the store is still loading (see
        VectorMemory.finish)."""
        if self.archive is not None:
            self.archive.close()
        self.recaller.close()
        if self._deferred and self.store is not None:  # kept back: stored now (wait), or by the next process
            deferred, self._deferred = self._deferred, []  # that opens the store (the CLI's run ends its process)
            if wait:
                self.store.add_later(deferred)
                self.store.flush()
            else:
                self.store.journal(deferred)
        elif self.store is not None and wait:
            self.store.flush()
        elif self.store is not None:
            self.store.finish()

    def step_items(self, record: StepRecord, output: str | None = None) -> list[MemoryItem]:
        """What a step leaves in the store: the step, except a memorize_thoughts step, whose note is stored as a
        note (recalling the step too would show the note twice beside YOUR NOTES), and a recall step (what it showed
        is stored already, where it came from: stored again, a later recall would find copies). `output`: the
        step's whole output, when the record holds it cut (the archive keeps it whole)."""
        if record.command in (NOTE_COMMAND, RECALL_COMMAND):  # what recall showed is kept where it came from
            return []
        result = record.observation if output is None else output
        text = (f"Thought: {record.thought}\nCommand: {record.command} {record.arg}\nResult:\n{result}"
                if record.command else f"Malformed reply: {record.raw_reply}\n{record.observation}")
        # embedded: the gist — intent, action and the head of the result — not the whole text
        # (no command name: it would make every step with that command look alike)
        detail = "" if record.command in self.code_commands else f" ({record.arg[:80]})"
        key = f"{record.thought[:80]}{detail}\n{record.observation[:100]}" if record.command else text
        return [MemoryItem(id=f"{self.run_id}:step:{record.step}", text=text, run=self.run_id, kind="step",
                           step=record.step, key=key, workdir=self.workdir)]

    def item(self, kind: str, text: str, step: int = 0, suffix: str = "") -> MemoryItem:
        return MemoryItem(id=f"{self.run_id}:{kind}:{step}" + (f":{suffix}" if suffix else ""), text=text,
                          run=self.run_id, kind=kind, step=step, workdir=self.workdir)

    def document_item(self, item_id: str, text: str, source: str, position: int) -> MemoryItem:
        """A part of an ingested document: one id per source and position, so ingesting again replaces it."""
        return MemoryItem(id=item_id, text=text, run=self.run_id, kind="document", step=position, source=source,
                          workdir=self.workdir)


def _they(span: str) -> str:
    """The verb for a span as _span names it."""
    return "it leaves" if span.startswith("step ") else "they leave"


def _span(steps: list[StepRecord]) -> str:
    first, last = steps[0].step, steps[-1].step
    return f"step {first}" if first == last else f"steps {first}-{last}"


