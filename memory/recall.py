"""The `recall` command's lookup: the run's archive searched by exact words (FTS5, bm25) beside the vector store by
meaning (chromadb), the two rankings fused; whole items, each labelled with its step (`step N`, or the run for an
earlier run) and, where a later step replaced a fact it states, `superseded by step M`.

It is handed a query and returns text: it knows nothing of the view or of when steps leave it.
"""

from __future__ import annotations

import queue
import re
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .archive import (
    Archive,
    Archived,
    archive_path,
    earlier_archives,
    fact_text,
    is_value,
    line_coverage,
    query_phrases,
    words_of,
)
from .context import StepRecord, fence_untrusted
from .excerpt import LABELS, SENTENCE_END, excerpt, novelty, prepare_excerpt, same_note, terms, terms_of_lines, units
from .store import RUN_NAME, Hit, MemoryItem

if TYPE_CHECKING:
    from .store import VectorMemory
    from .tokens import TokenCounter

NOVELTY = 0.15  # of a memory's words, at least, that the prompt does not show already, for it to be recalled
RECALL_CANDIDATES = 8
RECENT = 3  # requests: an item recalled in one of the last this many is not recalled again
RECALL_ITEM_TOKENS = 200  # at most, for one recalled memory
MIN_ITEM_TOKENS = 30  # less is no use
OBJECTIVE_REFRESH = 8  # steps between lookups of what is near the objective
QUERY_ARG_CHARS = 80  # of a command's argument, in what recall asks about a step (not for code)
LOOKUP_IDLE_S = 10.0  # the lookup thread (recall's prefetch) ends after this long without work
WORD_RECALLED = frozenset({"step", "search", "document", "answer"})  # what recall by words brings back
EARLIER_RECALLED = WORD_RECALLED | {"note"}  # of an earlier run (this run's notes are in view)
# automatic recall by words searches the newest of the earlier runs' archives in scope, this many candidates each
# (~1 ms of CPU an archive of 300 steps; the recall command searches EARLIER_RUNS of them)
EARLIER_AUTO_RUNS = 5
# a word more than this share of the run's archived items hold (and more than COMMON_AT_LEAST of them) tells no item
# apart: recall by words does not count it (measured on bench_cache's peers' run and bench_long's shapes)
COMMON_SHARE = 0.2
COMMON_AT_LEAST = 4
EARLIER_CANDIDATES = 4


@dataclass(frozen=True)
class Recalled:
    """A memory as one prompt showed it."""

    id: str
    label: str
    text: str

    def to_json(self) -> dict:
        return asdict(self)

CANDIDATES = 12  # of each kind of search, fused
THIS_RUN_UNSHOWN = ("objective", "summary")  # of this run, what the command never shows: the prompt holds them
FUSION_K = 60  # reciprocal rank fusion's constant (Cormack et al.): ranks matter, scores of two searches are not alike
EARLIER_RUNS = 50  # archives of earlier runs searched by words, newest first
MARKS = re.compile(r"\[×\d+\]|… \(\d+ lines? not shown\)|…")  # what excerpts add: not the memory's words
EXCERPT_TOKENS = 150  # left in the room, at least, to show part of an item too big to show whole


@dataclass(frozen=True)
class Found:
    """An item recall found, and how it is labelled."""

    item: Archived
    label: str
    rank: float


def label(item: Archived, run: str) -> str:
    """`step N` (with its kind, when not a step), the run for an earlier run's item, a document's source; and
    `superseded by step M` when a later step replaced a fact it states."""
    if item.kind == "document":
        where = f"document {item.source}, part {item.step + 1}"
    elif item.kind == "objective":
        where = "the objective"
    elif item.kind == "summary":
        where = f"summary of steps 1-{item.step}"
    else:
        where = f"step {item.step}" + ("" if item.kind == "step" else f", {item.kind}")
    if item.run != run:
        where = f"run {item.run}, {where}"
    if item.superseded_by:
        where += f", superseded by step {item.superseded_by}"
    return where


def adds_to(text: str, known: set[str], shown: str, asked: frozenset = frozenset()) -> bool:
    """Whether a recalled text adds to the prompt (`known`: its words; `shown`: its text, blanks collapsed): one of
    its lines that states values (numbers, codes) is not in the prompt already, whole or by all its words — of the
    lines that hold words of the question (`asked`), when some do: what it was recalled for is what must be new; a
    text that states none, when some of its lines' words are new (what `novelty` weighs, line by line)."""
    stating, other_new = [], False
    for unit in (sentence for line in units(text) for sentence in SENTENCE_END.split(MARKS.sub(" ", line))):
        unit = unit.strip()
        found = terms(unit) - LABELS
        if not found or unit.startswith(("Thought:", "Command:")):  # a step's own lines: what it did, not found
            continue
        if any(is_value(token) for token in unit.split()):
            stating.append((unit, found))
        elif found - known:
            other_new = True
    if not stating:
        return other_new
    stating = [(unit, found) for unit, found in stating if found & asked] or stating
    return any(" ".join(unit.split()) not in shown and not found <= known for unit, found in stating)


class Recaller:
    """What the `recall` command searches: this run's archive, earlier runs' archives (by `scope`: `workdir`, `global`;
    `run` or `off`: this run only) and the vector store (None: words alone)."""

    def __init__(self, archive: Archive, store: "VectorMemory | None", *, scope: str, workdir: str,
                 runs_root: Path | None, counter: "TokenCounter", where: dict | None = None,
                 relevant_distance: float = 0.72):
        self.archive, self.store, self.scope, self.workdir = archive, store, scope, workdir
        self.runs_root, self.counter, self.where = runs_root, counter, where
        self.relevant_distance = relevant_distance

    def _archives(self) -> list[Archive]:
        if self.scope in ("run", "off") or self.runs_root is None:
            return [self.archive]
        return [self.archive, *earlier_archives(self.runs_root, self.archive.run,
                                                self.workdir if self.scope == "workdir" else None, EARLIER_RUNS)]

    def lookup(self, query: str, limit: int = CANDIDATES) -> list[Found]:
        """The items best matching `query`, by words and by meaning, best first."""
        archives = self._archives()
        ranks: dict[str, float] = {}
        items: dict[str, Archived] = {}
        try:
            # each archive's best first, then each one's second, …: its own order weighs more than bm25's scores
            # this run's objective and summaries are never shown (see _worth_showing): left out of the search, not
            # after its limit, or a long run's many short summaries fill it and the steps they restate are not found
            worded = sorted(((position, found) for archive in archives
                             for position, found in enumerate(archive.search(
                                 query, limit, skip=THIS_RUN_UNSHOWN if archive is self.archive else ()))),
                            key=lambda pair: (pair[0], pair[1].score))
            worded = [found for _, found in worded][:limit]
        finally:
            for archive in archives[1:]:
                archive.close()
        for rank, found in enumerate(worded):
            ranks[found.id] = ranks.get(found.id, 0.0) + 1 / (FUSION_K + rank)
            items[found.id] = found
        for rank, hit in enumerate(self._meaning(query, limit)):
            archived = items.get(hit.id) or (self.archive.get(hit.id) if hit.run == self.archive.run else None)
            if archived is None:  # an earlier run's item, or one the archive does not hold (from before archives)
                archived = Archived(hit.id, hit.run, hit.kind, hit.step, hit.text, hit.metadata.get("source", ""))
            ranks[hit.id] = ranks.get(hit.id, 0.0) + 1 / (FUSION_K + rank)
            items[hit.id] = archived
        best = sorted((i for i in items if self._worth_showing(items[i], items.values())),
                      key=lambda item_id: -ranks[item_id])[:limit]
        return [Found(items[i], label(items[i], self.archive.run), ranks[i]) for i in best]

    def _worth_showing(self, item: Archived, found) -> bool:
        """Not what the prompt holds already, nor a restatement of what is found: this run's objective and summaries
        (the newest is in view; an older one restates steps the archive keeps whole), and an earlier run's summary
        older than another of that run found beside it."""
        if item.run == self.archive.run:
            return item.kind not in THIS_RUN_UNSHOWN
        return item.kind != "summary" or not any(other.kind == "summary" and other.run == item.run
                                                 and other.step > item.step for other in found)

    def _meaning(self, query: str, limit: int) -> list:
        store = self.store
        if store is None or not query.strip():
            return []
        try:
            hits = store.search(query, limit, self.where)
        except Exception:  # words alone, then: the archive holds everything the run saw
            return []
        return [hit for hit in hits if hit.distance <= self.relevant_distance]

    def answer(self, query: str, room: int) -> str:
        """What the `recall` command shows: the best items whole, as many as `room` tokens hold (the first one cut to
        the sentences around what matched when it alone is bigger), each under its label."""
        if not query.strip():
            return "recall needs words to search for: a name, a number, a code, a file name, or what it was about."
        found = self.lookup(query)
        if not found:
            return (f"Nothing stored matches {query!r}. Try other words: the exact name, number or code, or what it "
                    "was about.")
        parts, used, left_out = [], 0, 0
        for found_item in found:
            block = f"[{found_item.label}]\n{found_item.item.text.strip()}"
            size = self.counter.count(block) + 2
            if used + size <= room:
                parts.append(block)
                used += size
                continue
            if room - used >= EXCERPT_TOKENS or not parts:  # too big for the room left: what matched, in its sentences
                head = f"[{found_item.label}; too long to show whole here: the part around what matched]\n"
                text = excerpt(found_item.item.text, query, self.counter, room - used - self.counter.count(head) - 2)
                if text:
                    parts.append(head + text)
                    used += self.counter.count(head + text) + 2
                    continue
            left_out += 1
        more = (f"\n\n({left_out} more item{'s' if left_out != 1 else ''} matched: recall with more precise words "
                "to see them)") if left_out else ""
        return (f"Recalled for {query!r}, best match first:\n"
                + fence_untrusted("recalled items", "\n\n".join(parts)) + more)


class AutoRecall:
    """What recall adds to each prompt's tail from the vector store: other runs' steps, answers, notes and documents,
    and this run's steps out of view, near the objective and near what the agent does now, each only if it earns its
    room (see `recall`). It looks ahead in a thread of its own (prefetch) and is handed what is in view (`view`: the
    last step the summary covers and the last whose notes the digest holds); it never decides what leaves it."""

    def __init__(self, store: "VectorMemory | None", *, run_id: str, scope: str, workdir: str,
                 counter: "TokenCounter", code_commands: frozenset[str], objective: Callable[[], str],
                 view: Callable[[], tuple[int, int]], archive: Callable[[], Archive | None], runs_root=None):
        self.store, self.run_id, self.scope, self.workdir = store, run_id, scope, workdir
        self.counter, self.code_commands, self.runs_root = counter, code_commands, runs_root
        self._objective, self.view, self.archive = objective, view, archive
        self._prefetch: tuple | None = None  # (query, view, done, box): recall looked up while a command runs
        self._lookups: queue.Queue = queue.Queue()  # for the lookup thread
        self._lookups_lock = threading.Lock()
        self._looker: threading.Thread | None = None
        self._objective_hits: list[Hit] | None = None
        self._objective_hits_at = 0
        self._recalled_at = 0  # steps the last recall saw
        self._requests = 0  # prompts recall was asked for
        self._shown: dict[str, tuple[int, frozenset]] = {}  # recalled item → the request that last showed it, and
        # the words of the question that found it then
        self.failure = ""  # why the vector store was turned off mid-run, for the run to report
        self.deferred = False  # recall goes by words: the run's vectors are kept back (RunMemory.defer_vectors)
        self._earlier: list[Archive] | None = None  # earlier runs' archives in scope, opened once
        self._earlier_lock = threading.Lock()
        self._words_ahead: tuple | None = None  # (query, done, box): earlier runs searched while a command runs

    @property
    def objective(self) -> str:
        return self._objective()

    def recall(self, steps: list[StepRecord], room: int, shown: str) -> list[Recalled]:
        """What earns its room in this prompt's tail: while the run's vectors are kept back (`deferred`), by words
        from the archives; once the store is needed (an ingest, the recall command), from the vector store."""
        if room < MIN_ITEM_TOKENS:
            return []
        if self.deferred:
            return self._recall_by_words(steps, room, shown)
        if self.store is None:
            return []
        try:
            return self._recall_from_store(steps, room, shown)
        except Exception as exc:  # a memory that fails (a server gone) must not end the run: go on without it
            self.store = None
            self.failure = f"vector memory disabled for this run: {type(exc).__name__}: {exc}"
            return []

    def _recall_by_words(self, steps: list[StepRecord], room: int, shown: str) -> list[Recalled]:
        """Items that hold, in one line of their output (not a step's own thought or command), at least half of the
        words of what the agent does now (two at least; before the first step, of the objective): this run's out of
        view, and earlier runs' (`scope`: of this work directory, or any), found by the archives, no model loaded.
        Best first: the most of those words in one line, this run's before earlier ones at equal coverage."""
        archive = self.archive()
        if archive is None:
            return []
        now = self._now(steps[-1].thought, steps[-1].command, steps[-1].arg) if steps else self.objective
        # the words that tell items apart: not those most of the run's items hold (its objective's, its vocabulary)
        phrases = query_phrases(now)
        common = archive.common(phrases, COMMON_SHARE, COMMON_AT_LEAST)
        wanted = [words_of(phrase) for phrase in phrases if phrase not in common]
        if len(wanted) < 2:
            return []
        need = max(2, (len(wanted) + 1) // 2)
        found = [item for item in (archive.search(now, RECALL_CANDIDATES, through=self.view()[0]) if steps else [])
                 if item.kind in WORD_RECALLED]
        ahead, self._words_ahead = self._words_ahead, None
        if ahead is not None and ahead[0] == now and ahead[1].wait() and "found" in ahead[2]:
            found.extend(ahead[2]["found"])  # searched while the command ran (prefetch)
        else:
            found.extend(self._earlier_found(now))
        covered = [(line_coverage(fact_text(item.kind, item.text), wanted), item) for item in found]
        hits = [Hit(item.id, item.text, {"run": item.run, "kind": item.kind, "step": item.step,
                                         "source": item.source}, 0.0)
                for coverage, item in sorted(covered, key=lambda pair: -pair[0]) if coverage >= need]
        flat, words = " ".join(shown.split()), terms_of_lines(shown)
        hits = [hit for hit in hits if not self._item_in_view(hit) and " ".join(hit.text.split()) not in flat
                and novelty(hit.text, words) >= NOVELTY]
        self._requests += 1
        return self._choose(hits, f"{now}\n{self.objective}", steps, room, flat, words, {hit.id for hit in hits},
                            frozenset(terms(now)))

    def _earlier_archives(self) -> list[Archive]:
        """Earlier runs' archives that automatic recall by words searches (by `scope`, the newest
        EARLIER_AUTO_RUNS), found and opened once a run."""
        with self._earlier_lock:
            if self._earlier is None:
                self._earlier = [] if self.scope not in ("workdir", "global") or self.runs_root is None else \
                    earlier_archives(Path(self.runs_root), self.run_id,
                                     self.workdir if self.scope == "workdir" else None, EARLIER_AUTO_RUNS)
            return self._earlier

    def _earlier_found(self, query: str) -> list[Archived]:
        return [item for earlier in self._earlier_archives() for item in earlier.search(query, EARLIER_CANDIDATES)
                if item.kind in EARLIER_RECALLED]

    def _prefetch_words(self, now: str) -> bool:
        """Earlier runs' archives searched for `now` in the lookup thread, while the command runs (the next recall
        by words then finds it done); True when under way."""
        if not self._earlier_archives():
            return False
        if self._words_ahead is not None and self._words_ahead[0] == now:
            return True
        box: dict = {}
        done = threading.Event()

        def look() -> None:
            try:
                box["found"] = self._earlier_found(now)
            except Exception:  # recall searches again itself
                pass
            finally:
                done.set()

        self._lookup(look)
        self._words_ahead = (now, done, box)
        return True

    def close(self) -> None:
        with self._earlier_lock:
            for archive in self._earlier or []:
                archive.close()
            self._earlier = None

    @property
    def recall_filter(self) -> dict | None:
        """What recall searches, as a store filter: this run, this work directory, or everything (None)."""
        return ({"run": self.run_id} if self.scope == "run" else {"workdir": self.workdir} if self.scope == "workdir"
                else None)

    def _recall_from_store(self, steps: list[StepRecord], room: int, shown: str) -> list[Recalled]:
        # this run's steps out of view are searchable at once: the store searches what its writer has not written
        # yet beside what it has (VectorMemory.search_by), so recall never waits for a write
        where = self.recall_filter
        embedder = self.store.embedder
        cut = getattr(embedder, "relevant_distance", 2.0)
        objective_cut = getattr(embedder, "objective_distance", cut)
        latest = steps[-1] if steps else None
        now = self._now(latest.thought, latest.command, latest.arg) if latest else ""
        flat, words = " ".join(shown.split()), terms_of_lines(shown)

        def wanted(found: list[Hit]) -> list[Hit]:
            return [hit for hit in found if hit.distance <= (objective_cut if hit.kind == "objective" else cut)
                    and not self._item_in_view(hit) and " ".join(hit.text.split()) not in flat
                    and novelty(hit.text, words) >= NOVELTY]

        # near the objective, so standing facts stay in view: what is near it changes slowly, so it is looked up
        # again only every few steps (by the prefetch, when it knew this one would); the hits kept from before are
        # weighed while the lookup for this step may still be under way
        due = self._objective_hits is None or len(steps) - self._objective_hits_at >= OBJECTIVE_REFRESH
        standing = [] if due else wanted(self._objective_hits)
        for hit in standing:
            prepare_excerpt(hit.text, self.counter)
            self._label_tokens(self._label(hit))
        vector, near, near_objective = self._prefetched(now) if latest else (None, None, None)
        if due:
            self._objective_hits = near_objective if near_objective is not None else self.store.search_by(
                [self.store.objective_vector(self.objective)], RECALL_CANDIDATES, where, self._item_in_view)
            self._objective_hits_at = len(steps)
            standing = wanted(self._objective_hits)
        self._recalled_at = len(steps)
        hits, query, known, asked = standing, self.objective, set(), frozenset()
        if latest:  # and near what the agent is doing now (a short query: embedding time grows with length)
            if near is None:
                vector = self.store.embed_one(now) if vector is None else vector
                near = self.store.search_by([vector], RECALL_CANDIDATES, where, self._item_in_view)
            known, asked = {hit.id for hit in near}, frozenset(terms(now))
            hits = sorted(wanted(near) + [hit for hit in hits if hit.id not in known], key=lambda hit: hit.distance)
            query = f"{now}\n{self.objective}"
        self._requests += 1
        return self._choose(hits, query, steps, room, flat, words, known, asked)

    def _choose(self, hits: list[Hit], query: str, steps: list[StepRecord], room: int, flat: str, words: set[str],
                known: set[str], asked: frozenset) -> list[Recalled]:
        """Of the hits, best first, those that earn their room (`known`: found by what the agent does now, whose
        words are `asked`), each whole or as whole sentences around what matters to `query`."""
        later = [(s.step, note) for s in steps for note in s.notes]  # this run's notes
        replaced = self._superseded(hits)
        chosen: list[Recalled] = []
        for hit in hits:
            if hit.kind == "note" and (
                    any(other.kind == "note" and _newer(other, hit) and same_note(other.text, hit.text)
                        for other in hits)
                    or (hit.run == self.run_id and any(step > hit.step and same_note(text, hit.text)
                                                       for step, text in later))):
                continue  # a newer version of this note is at hand, or in the prompt: it wins
            if hit.run == self.run_id and hit.id in replaced:
                continue  # a later step of this run replaced a fact it states: the newer is in view or recalled
            if self._shown_lately(hit.id, asked if hit.id in known else frozenset()):
                continue  # shown in one of the last few requests, for much the same question
            label = self._label(hit) + (f", superseded by step {replaced[hit.id]}" if hit.id in replaced else "")
            share = min(room if not chosen else room // 2, RECALL_ITEM_TOKENS) - self._label_tokens(label)
            if share < MIN_ITEM_TOKENS:
                break
            text = excerpt(hit.text, query, self.counter, share, words)
            if not text or not adds_to(text, words, flat, frozenset(terms(query)) - LABELS):
                continue  # what it would show the prompt holds already (in view, in the summary or the notes)
            # the label's and the text's counts, both known already (the prompt is counted whole at the end)
            cost = self._label_tokens(label) + self.counter.count(text) + 1
            if cost > room:
                continue
            chosen.append(Recalled(hit.id, label, text))
            self._shown[hit.id] = (self._requests, asked if hit.id in known else frozenset())
            room -= cost
        return chosen

    def _shown_lately(self, item: str, asked: frozenset) -> bool:
        """Whether recall showed the item in one of the last RECENT requests, for much the same question (`asked`:
        the words of what the agent does now, when that found it; empty when only the objective did). An item that
        a new question finds is shown again: the tail that showed it is gone from the prompt."""
        if item not in self._shown:
            return False
        request, before = self._shown[item]
        if self._requests - request > RECENT:
            return False
        return not asked or len(asked & before) * 2 >= len(asked | before)

    def _superseded(self, hits: list[Hit]) -> dict[str, int]:
        """Of the hits, those a later step replaced (a fact they state), by this run's archive or their own run's."""
        found: dict[str, int] = {}
        by_run: dict[str, list[str]] = {}
        for hit in hits:
            if hit.kind != "document":
                by_run.setdefault(hit.run, []).append(hit.id)
        for run, ids in by_run.items():
            archive = self.archive() if run == self.run_id else self._earlier_archive(run)
            if archive is None:
                continue
            try:
                found.update(archive.superseded(ids))
            except Exception:  # an earlier run's archive unreadable: its items go unlabelled, as before archives
                continue
            finally:
                if run != self.run_id:  # opened for this question only
                    archive.close()
        return found

    def _earlier_archive(self, run: str) -> Archive | None:
        if self.runs_root is None or not RUN_NAME.fullmatch(run):
            return None
        path = archive_path(Path(self.runs_root) / run)
        return Archive(path, run, read_only=True) if path.is_file() else None

    def _label_tokens(self, label: str) -> int:
        """What a recalled memory's label takes (the counter keeps it: the same labels come back step after step)."""
        return self.counter.count(f"- ({label}) ")

    def asking(self, soon: int) -> None:
        """The loop is about to wait for the model: what waits for the store's writer, unembedded, and that recall
        may soon search is embedded now, in the lookup thread: the steps out of view and those up to `soon` (that a
        summary being made or made will take out of it; steps in view are never recalled). A search then finds them
        ready rather than embedding them while the loop waits, when they leave the view. The rest is left to the
        writer, niced, which embeds each item as it comes (a step's key costs as much to embed as ~3 queries)."""
        store = self.store
        if store is None or getattr(store, "_collection", None) is None:
            return
        notes_through = self.view()[1]

        def in_view(item: MemoryItem) -> bool:
            return self._item_in_view(item, soon, notes_through)

        def embed() -> None:
            try:
                store.embed_pending(in_view)
            except Exception:  # the writer meets it too, and reports it
                pass

        if store.pending_beyond(in_view):
            self._lookup(embed)

    def _now(self, thought: str, command: str, arg: str) -> str:
        """What recall asks about the step: its thought, and the argument of a command that is not code (no command
        names: they would bring back every step of another run that used the same command)."""
        detail = "" if command in self.code_commands else f" ({arg[:QUERY_ARG_CHARS]})"
        return f"{thought[:120]}{detail}"

    def prefetch(self, thought: str, command: str, arg: str) -> bool:
        """Look up, in a thread, what is near the action the agent just chose (and near the objective, when the
        next recall looks that up again), while its command runs: the next prompt's recall then finds it ready
        (embedding and searching off the loop's path). Only once the store is open (opening it is the warm-up's
        work). While recall goes by words (`deferred`), earlier runs' archives are searched instead. True when the
        lookup is under way (or was made, while the reply streamed in)."""
        if self.deferred:
            return self._prefetch_words(self._now(thought, command, arg))
        if self.store is None or getattr(self.store, "_collection", None) is None:
            return False
        now, store, where, objective = self._now(thought, command, arg), self.store, self.recall_filter, self.objective
        view = (self.view()[0], self.view()[1])
        if self._prefetch is not None and self._prefetch[:2] == (now, view):
            return True
        due = self._objective_hits is None or self._recalled_at + 1 - self._objective_hits_at >= OBJECTIVE_REFRESH
        box: list = []
        done = threading.Event()

        def unwanted(item: MemoryItem) -> bool:  # in view as the lookup began (a fold since: looked up again)
            return self._item_in_view(item, *view)

        def look() -> None:
            try:
                vector = store.embed_one(now)
                box.append(vector)
                near = store.search_by([vector], RECALL_CANDIDATES, where, unwanted)
                box.extend([near, store.search_by([store.objective_vector(objective)], RECALL_CANDIDATES, where,
                                                  unwanted) if due else None])
            except Exception:  # recall looks again itself, and reports what fails
                pass
            finally:
                done.set()

        self._lookup(look)
        self._prefetch = (now, view, done, box)
        return True

    def prefetch_early(self, thought: str, command: str, arg: str) -> bool:
        """A reply still streaming in, as far as it came (a command named: its thought is over): when it tells all
        that recall will ask about the step (the thought; for a command that is not code, the argument's start too),
        the lookup starts now, while the rest of the reply comes, and True is returned. When the reply as read
        differs, `prefetch` looks up again."""
        if not thought.strip() or (command not in self.code_commands and len(arg) <= QUERY_ARG_CHARS):
            return False
        return self.prefetch(thought, command, arg)

    def _lookup(self, job: Callable[[], None]) -> None:
        """Run job in the lookup thread, started when there is none (starting a thread each step cost the loop
        ~1-3 ms: it waits for the new thread to run); the thread ends after LOOKUP_IDLE_S without work."""
        with self._lookups_lock:
            self._lookups.put(job)
            if self._looker is None:
                self._looker = threading.Thread(target=self._look_forever, name="memory-prefetch", daemon=True)
                self._looker.start()

    def _look_forever(self) -> None:
        while True:
            try:
                job = self._lookups.get(timeout=LOOKUP_IDLE_S)
            except queue.Empty:
                with self._lookups_lock:
                    if self._lookups.empty():
                        self._looker = None
                        return
                continue
            job()

    def _prefetched(self, now: str) -> tuple[object, list[Hit] | None, list[Hit] | None]:
        """What the prefetch found, if it asked about `now`: the query's vector, the hits near it (None when steps
        have left the view since: it left the steps then in view out of its search) and near the objective (None
        when not looked up)."""
        prefetch, self._prefetch = self._prefetch, None
        if prefetch is None or prefetch[0] != now:
            return None, None, None
        prefetch[2].wait()
        vector, near, objective = (prefetch[3] + [None, None, None])[:3]
        if prefetch[1] != (self.view()[0], self.view()[1]):
            near = None
        return vector, near, objective

    def _item_in_view(self, item: MemoryItem | Hit, through: int | None = None,
                      notes_through: int | None = None) -> bool:
        """Whether an item (stored or found) is shown already, by the view given or the current one."""
        if item.run != self.run_id or item.kind == "document":
            return False
        through = self.view()[0] if through is None else through
        notes_through = self.view()[1] if notes_through is None else notes_through
        return (item.kind == "objective" or item.step > through
                or (item.kind == "note" and item.step > notes_through))

    def _label(self, hit: Hit) -> str:
        """`step N` (with its kind, when not a step's output), after its run for an earlier run's item."""
        if hit.kind == "document":
            return f"document {hit.metadata.get('source', '')}"
        where = "" if hit.run == self.run_id else f"run {hit.run}, "
        if hit.kind == "objective":
            return f"{where}objective"
        return f"{where}step {hit.step}" + ("" if hit.kind == "step" else f", {hit.kind}")


def _newer(a: Hit, b: Hit) -> bool:
    return (a.metadata.get("time", 0), a.step) > (b.metadata.get("time", 0), b.step)
