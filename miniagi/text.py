"""Text helpers that any room may use without the terminal: a count with its noun. (JSON lines are read by
memory/jsonl.py, which the memory shares.)"""

from __future__ import annotations


def plural(count: int, noun: str, many: str | None = None) -> str:
    return f"{count} {noun}" if count == 1 else f"{count:,} {many or noun + 's'}"
