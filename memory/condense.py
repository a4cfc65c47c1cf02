"""Splitting texts by tokens on natural boundaries, and condensing large texts hierarchically with a model.

`condense` maps a prompt over token-bounded chunks, then reduces the partial results level by level until one
text fits, and always ends with a single merged text rather than a concatenation of fragments.
"""

from __future__ import annotations

from typing import Callable

from .context import truncate_middle
from .tokens import TokenCounter

Ask = Callable[[str], str]  # one prompt in, the model's text out
SEPARATORS = ("\n\n", "\n", ". ", " ")


def split_by_tokens(text: str, counter: TokenCounter, max_tokens: int, overlap: int = 0) -> list[str]:
    """Chunks of at most max_tokens, cut at paragraphs, else lines, else sentences, else words; with `overlap`,
    each chunk after the first begins with the last `overlap` tokens of the one before."""
    pieces = _pieces(text, counter, max_tokens, 0)
    chunks: list[str] = []
    current, current_tokens = "", 0
    for piece, tokens in pieces:
        if current and current_tokens + tokens > max_tokens:
            chunks.append(current)
            current, current_tokens = "", 0
        current += piece
        current_tokens += tokens
    if current.strip():
        chunks.append(current)
    chunks = [chunk.strip() for chunk in chunks if chunk.strip()]
    if overlap and len(chunks) > 1:
        ids = [counter.encoding.encode(chunk, disallowed_special=()) for chunk in chunks]
        chunks = [chunks[0]] + [counter.encoding.decode(ids[i - 1][-overlap:]) + " " + chunks[i]
                                for i in range(1, len(chunks))]
    return chunks


def _pieces(text: str, counter: TokenCounter, max_tokens: int, level: int) -> list[tuple[str, int]]:
    tokens = counter.count(text)
    if tokens <= max_tokens:
        return [(text, tokens)]
    if level >= len(SEPARATORS):  # no boundary left: cut by tokens
        ids = counter.encoding.encode(text, disallowed_special=())
        step = max(1, int(max_tokens / counter.margin))
        return [(counter.encoding.decode(ids[i:i + step]), max_tokens) for i in range(0, len(ids), step)]
    separator = SEPARATORS[level]
    parts = text.split(separator)
    result: list[tuple[str, int]] = []
    for index, part in enumerate(parts):
        part = part + (separator if index < len(parts) - 1 else "")
        if part:
            result.extend(_pieces(part, counter, max_tokens, level + 1))
    return result


MAP_PROMPT = """{instruction}

Condense the text below to at most {words} words. Keep every fact, number, name, date, file path, URL, error \
message and result that matters; drop repetition and filler. Reply with the condensed text only.

TEXT (part {part} of {parts}):
{text}"""

MERGE_PROMPT = """{instruction}

Below are condensed parts of one longer text, in order. Merge them into ONE coherent text of at most {words} \
words. Keep every fact, number, name and result that matters; remove repetition. Reply with the merged text only.

PARTS:
{text}"""


def condense(text: str, ask: Ask, counter: TokenCounter, target_tokens: int, *, chunk_tokens: int = 3000,
             instruction: str = "You condense texts for an autonomous agent's memory.") -> str:
    """One text within target_tokens that keeps what matters of `text`."""
    if counter.count(text) <= target_tokens:
        return text
    chunk_tokens = max(chunk_tokens, target_tokens * 2)
    pieces = split_by_tokens(text, counter, chunk_tokens)
    while len(pieces) > 1:
        # each level must shrink: partials get a share of the chunk size, however many there are
        share = max(64, min(target_tokens, chunk_tokens // 3))
        partials = [truncate_middle(ask(MAP_PROMPT.format(instruction=instruction, words=_words(share),
                                                          part=i + 1, parts=len(pieces), text=piece)),
                                    counter, share) for i, piece in enumerate(pieces)]
        combined = "\n\n".join(f"[part {i + 1}]\n{p}" for i, p in enumerate(partials))
        if counter.count(combined) <= chunk_tokens:
            merged = ask(MERGE_PROMPT.format(instruction=instruction, words=_words(target_tokens), text=combined))
            return truncate_middle(merged.strip(), counter, target_tokens)
        pieces = split_by_tokens(combined, counter, chunk_tokens)
    single = ask(MAP_PROMPT.format(instruction=instruction, words=_words(target_tokens), part=1, parts=1,
                                   text=pieces[0]))
    return truncate_middle(single.strip(), counter, target_tokens)


def _words(tokens: int) -> int:
    return max(20, int(tokens * 0.7))  # English runs ~1.3 tokens a word; ask for a little less
