"""Text helpers that any room may use without the terminal: a count with its noun, a step's changed files in one
line. (JSON lines are read by memory/jsonl.py, which the memory shares.)"""

from __future__ import annotations


def plural(count: int, noun: str, many: str | None = None) -> str:
    return f"{count} {noun}" if count == 1 else f"{count:,} {many or noun + 's'}"


def files_changed_line(files: dict[str, str], shown: int = 5) -> str:
    """One line for a step's `files`: `2 files changed: a.txt, d.txt (new)`. Inside a folder that was made or
    deleted whole, only the folder is named."""
    whole = {p for p, change in files.items() if p.endswith("/") and change != "modified"}

    def inside_whole(path: str) -> bool:
        parts = path.rstrip("/").split("/")
        return any("/".join(parts[:i]) + "/" in whole for i in range(1, len(parts)))

    named = [p for p in files if (not p.endswith("/") or p in whole) and not inside_whole(p)]
    count = sum(not p.endswith("/") for p in files)
    what = f"{count} file{'s' if count != 1 else ''}" if count or not named else \
        f"{len(named)} folder{'s' if len(named) != 1 else ''}"
    words = {"added": " (new)", "deleted": " (deleted)", "modified": ""}
    names = [p + words[files[p]] for p in named[:shown]]
    more = f", … {len(named) - shown} more" if len(named) > shown else ""
    return f"{what} changed: {', '.join(names)}{more}"
