"""JSON lines, the form of every append-only file of the house (a run's trace, the store's journals, prompts.jsonl,
a batch's records): read here, once, for both miniagi and the memory (which imports nothing of miniagi)."""

from __future__ import annotations

import json
from typing import Iterable, Iterator


def json_lines(lines: Iterable[str | bytes]) -> Iterator:
    """The JSON value of each line; a line that is none (torn by a crash mid-write, blank, of a newer format) is
    skipped. Split a text with .split("\\n"), not splitlines(): U+2028 may sit inside a string."""
    for line in lines:
        try:
            yield json.loads(line)
        except ValueError:
            continue
