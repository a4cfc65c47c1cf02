"""Whole pieces of a memory for recall: a recalled item is shown whole when it fits, else as whole sentences around
the one that matters most; never a head and a tail with its middle cut out.

- `collapse_repeats`: a line or sentence said again and again in a row (a log's routine entry, a progress line) is
  shown once, with how many times it came (a line that recurs apart, such as a JSON record's field, stays);
- `excerpt`: the sentence that best matches the query (its words, then what is distinctive: words found in no other
  sentence and not in the prompt already, such as names and numbers), widened with its neighbours while they fit;
  "…" marks where text was left out, always between sentences;
- `novelty`: how much of a memory the prompt does not show already (recall skips what it would only repeat);
- `same_note`: two notes that are versions of one (the newer one wins in recall).
"""

from __future__ import annotations

import difflib
import functools
import re

from .tokens import TokenCounter

SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")
WORD = re.compile(r"[A-Za-z0-9_]+")
STOPWORDS = frozenset(
    "a an and are as at be but by can did do does for from had has have how i if in into is it its me my no not of on "
    "or our so than that the their then there these this those to up was we were what when where which who why will "
    "with you your".split())
GAP = "…"
LABELS = frozenset({"thought", "command", "result"})  # how a stored step labels its parts: not its content


def units(text: str) -> list[str]:
    """The text's lines, long lines split into sentences."""
    return [unit for line in text.split("\n") for unit in _sentences(line)]


def _sentences(line: str) -> list[str]:
    return SENTENCE_END.split(line) if len(line) > 200 else [line]


def collapse_repeats(text: str) -> str:
    """The text with each run of one line or sentence said again and again in a row (a log's routine entry, a
    progress line) kept once, where it came, marked with its count. Only repeats in a row: a line that recurs
    apart (a JSON record's `"status": "shipped",`, a table's cell) stays where it is, so every record keeps its
    fields."""
    lines_in = text.split("\n")
    units_in: list[tuple[int, str, str]] = [(number, unit, " ".join(unit.split()))
                                            for number, line in enumerate(lines_in) for unit in _sentences(line)]
    if not any(a[2] == b[2] and len(a[2]) > 3 for a, b in zip(units_in, units_in[1:])):
        return text
    lines: list[list[str]] = [[] for _ in lines_in]
    i = 0
    while i < len(units_in):
        number, unit, key = units_in[i]
        run = 1
        while len(key) > 3 and i + run < len(units_in) and units_in[i + run][2] == key:
            run += 1
        lines[number].append(f"{unit} [×{run}]" if run > 1 else unit)
        i += run
    return "\n".join(" ".join(kept) for kept, line in zip(lines, lines_in) if kept or not line.strip())


def terms(text: str) -> set[str]:
    """The words that carry meaning: no stop words, no one- or two-letter words but numbers."""
    return {w for w in (m.lower() for m in WORD.findall(text)) if w not in STOPWORDS and (len(w) > 2 or w.isdigit())}


def novelty(text: str, known: set[str]) -> float:
    """The share of the text's words that are not known (not in the prompt already)."""
    found = _meaning(text)
    return len(found - known) / len(found) if found else 0.0


@functools.lru_cache(maxsize=512)
def _meaning(text: str) -> frozenset:
    """A memory's words but its labels: recall weighs the same stored items step after step."""
    return frozenset(terms(text) - LABELS)


def terms_of_lines(text: str) -> set[str]:
    """terms(text), from the terms of each of its lines (kept for the lines seen lately: a prompt repeats most of
    the one before it)."""
    found: set[str] = set()
    for line in text.split("\n"):
        found |= _line_terms(line)
    return found


@functools.lru_cache(maxsize=8192)
def _line_terms(line: str) -> frozenset:
    return frozenset(terms(line))


# what excerpt reads of a text that does not depend on the query, kept for the texts seen lately: recall shows the
# same stored items step after step, each with another query
@functools.lru_cache(maxsize=512)
def _collapsed(text: str, counter: TokenCounter) -> tuple[str, int]:
    collapsed = collapse_repeats(text.strip())
    return collapsed, counter.count(collapsed)


def prepare_excerpt(text: str, counter: TokenCounter) -> None:
    """What excerpt first reads of a text whatever the query (the text, repeats collapsed, and its count), worked
    out now (kept for the texts seen lately)."""
    _collapsed(text, counter)


@functools.lru_cache(maxsize=512)
def _pieces(text: str) -> tuple[tuple[str, ...], tuple[frozenset, ...], tuple[frozenset, ...]]:
    """The text's lines and sentences, the meaningful words of each, and those of each found in no other piece."""
    pieces = tuple(piece for piece in units(text) if piece.strip())
    words = tuple(frozenset(terms(piece)) for piece in pieces)
    frequency: dict[str, int] = {}
    for found in words:
        for word in found:
            frequency[word] = frequency.get(word, 0) + 1
    return pieces, words, tuple(frozenset(w for w in found if frequency[w] == 1) for found in words)


@functools.lru_cache(maxsize=16)
def _query_terms(query: str) -> frozenset:
    return frozenset(terms(query))  # recall asks the same query of every memory it weighs


@functools.lru_cache(maxsize=4096)
def _piece_tokens(piece: str, counter: TokenCounter) -> int:
    return counter.count(piece) + 1  # with its line break


def excerpt(text: str, query: str, counter: TokenCounter, max_tokens: int, known: set[str] = frozenset()) -> str:
    """The text within max_tokens: whole when it fits (repeats collapsed), else whole sentences around the one that
    matters most: the query's words, then words found in no other sentence and not `known` (names, numbers).
    "" when even that one sentence does not fit."""
    text, total = _collapsed(text, counter)
    if total <= max_tokens:
        return text
    pieces, words, unique = _pieces(text)
    wanted = _query_terms(query)
    # the query's words first, then what is distinctive (a line of 300 unique tokens must not outweigh the match)
    scores = [(len(found & wanted), len(only - known)) for found, only in zip(words, unique)]

    def size(i: int) -> int:  # counted only for the pieces widening reaches (encoding is the costly part)
        return _piece_tokens(pieces[i], counter)

    room = max_tokens - 2 * _piece_tokens(f" {GAP} ", counter) + 2
    fitting = [i for i in sorted(range(len(pieces)), key=lambda i: (scores[i], -i), reverse=True)[:8]
               if size(i) <= room]
    if not fitting:
        return ""
    best = fitting[0]
    start = end = best
    used = size(best)
    while True:  # widen by whole neighbours, the following one first (it usually completes the matching one)
        grown = False
        for candidate in (end + 1, start - 1):
            if 0 <= candidate < len(pieces) and used + size(candidate) <= room:
                used += size(candidate)
                start, end = min(start, candidate), max(end, candidate)
                grown = True
        if not grown:
            break
    shown = "\n".join(pieces[start:end + 1])
    return (f"{GAP} " if start > 0 else "") + shown + (f" {GAP}" if end < len(pieces) - 1 else "")


def same_note(a: str, b: str) -> bool:
    """Whether two notes are versions of one: one repeats the other, or they share most of their wording."""
    a, b = " ".join(a.lower().split()), " ".join(b.lower().split())
    if a in b or b in a:
        return True
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio() >= 0.6


def pick(text: str, query: str, counter: TokenCounter, max_tokens: int) -> str:
    """The text within max_tokens as the whole lines or sentences that matter to the query, wherever they are (a
    program's result line and the line its step asked about may lie far apart): the rarest matches first, then
    each widened with its neighbours while room lasts (a record keeps its fields); then the first lines. In their
    order, "… (N lines not shown)" where lines were left out. With nothing that matches: sentences around the
    most distinctive one (excerpt). "" when none fits."""
    text, total = _collapsed(text, counter)
    if total <= max_tokens:
        return text
    if "\n" not in text and len(_sentences(text)) < 2:  # one piece, longer than the room: no whole piece fits
        return ""
    pieces, words, _ = _pieces(text)
    anchors = _anchors(words, query)
    if not anchors:
        return excerpt(text, query, counter, max_tokens)
    chosen, gap = set(), counter.count(f"\n{_left_out(1000)}")
    used = gap  # the last gap

    def take(i: int) -> bool:
        nonlocal used
        if i in chosen or not 0 <= i < len(pieces) or _is_gap(pieces[i]):  # (an earlier cut's gap: marked anew)
            return False
        size = _piece_tokens(pieces[i], counter) + gap
        if used + size > max_tokens:
            return False
        chosen.add(i)
        used += size
        return True

    for i in anchors:  # the best matches first
        take(i)
    for radius in range(1, len(pieces)):  # then lines around each (a record's other fields), a line each way per
        # round, so that every match keeps its nearest lines before any keeps more
        grown = [take(i + radius) | take(i - radius) for i in anchors if i in chosen]
        if not any(grown):
            break
    for i in range(len(pieces)):  # room left: the first lines
        if not take(i) and used + gap >= max_tokens:
            break
    return _joined(pieces, chosen)


def _anchors(words: tuple[frozenset, ...], query: str) -> list[int]:
    """The pieces that match the query, best first: a match is weighed by how rare its words are among the pieces,
    and one far weaker than the best (a word in most records) is no anchor of its own."""
    wanted = {_stem(word) for word in terms(query)}
    found = [{_stem(word) for word in piece_words} & wanted for piece_words in words]
    spread: dict[str, int] = {}  # in how many pieces each of the query's words is: a word in every record tells
    for stems in found:  # little about which record matters
        for stem in stems:
            spread[stem] = spread.get(stem, 0) + 1
    matches = [sum(1 / spread[stem] for stem in stems) for stems in found]
    best = max(matches)
    return sorted((i for i in range(len(words)) if matches[i] and matches[i] >= best / 4),
                  key=lambda i: (-matches[i], i))


def _joined(pieces: tuple[str, ...], chosen: set[int]) -> str:
    """The chosen pieces in their order, "… (N lines not shown)" where pieces were left out."""
    lines, last = [], -1
    for i in sorted(chosen):
        if i != last + 1:
            lines.append(_left_out(i - last - 1))
        lines.append(pieces[i])
        last = i
    if chosen and last < len(pieces) - 1:
        lines.append(_left_out(len(pieces) - 1 - last))
    return "\n".join(lines)


def _is_gap(piece: str) -> bool:
    piece = piece.strip()
    return piece == GAP or (piece.startswith(f"{GAP} (") and piece.endswith(" not shown)"))


def _left_out(count: int) -> str:
    return f"{GAP} ({count} {'line' if count == 1 else 'lines'} not shown)"


@functools.lru_cache(maxsize=16384)
def _stem(word: str) -> str:
    """A word without its commonest English ending, so that "manifolds" finds "manifold"."""
    for ending in ("ing", "ed", "es", "s"):
        if word.endswith(ending) and len(word) - len(ending) >= 3 and not word.isdigit():
            return word[:-len(ending)]
    return word
