"""The `recall` command's lookup: the run's archive searched by exact words (FTS5, bm25) beside the vector store by
meaning (chromadb), the two rankings fused; whole items, each labelled with its step (`step N`, or the run for an
earlier run) and, where a later step replaced a fact it states, `superseded by step M`.

It is handed a query and returns text: it knows nothing of the view or of when steps leave it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .archive import Archive, Archived, earlier_archives, is_value
from .context import fence_untrusted
from .excerpt import LABELS, SENTENCE_END, excerpt, terms, units

if TYPE_CHECKING:
    from .store import VectorMemory
    from .tokens import TokenCounter

CANDIDATES = 12  # of each kind of search, fused
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


def adds_to(text: str, known: set[str], shown: str) -> bool:
    """Whether a recalled text adds to the prompt (`known`: its words; `shown`: its text, blanks collapsed): one of
    its lines that states values (numbers, codes) is not in the prompt already, whole or by all its words; a text
    that states none, when some of its lines' words are new (what `novelty` weighs, line by line)."""
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
            worded = sorted(((position, found) for archive in archives
                             for position, found in enumerate(archive.search(query, limit))),
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
        # this run's objective is always in view: found, it would only crowd out what is not
        best = sorted((i for i in items if not (items[i].kind == "objective" and items[i].run == self.archive.run)),
                      key=lambda item_id: -ranks[item_id])[:limit]
        return [Found(items[i], label(items[i], self.archive.run), ranks[i]) for i in best]

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
