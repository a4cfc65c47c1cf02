"""Text helpers that any room may use without the terminal: a count with its noun, the values of JSON lines."""

from __future__ import annotations

import json
from typing import Iterable, Iterator


def plural(count: int, noun: str, many: str | None = None) -> str:
    return f"{count} {noun}" if count == 1 else f"{count:,} {many or noun + 's'}"


def json_lines(lines: Iterable[str | bytes]) -> Iterator:
    """The JSON value of each line; a line that is none (torn by a crash mid-write, blank, of a newer format) is
    skipped. Split a text with .split("\\n"), not splitlines(): U+2028 may sit inside a string."""
    for line in lines:
        try:
            yield json.loads(line)
        except ValueError:
            continue
