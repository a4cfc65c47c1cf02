"""Noticing when the agent goes round in circles.

A step is *stale* when it brings nothing new: the same action with the same result as a recent step (a plain
repeat, or an A-B-A-B alternation), or an error the agent has already met recently, whatever it did to get it.
A run of stale steps is a loop: the agent is warned at WARN_AFTER (and the critic called, if enabled) and the run
is stopped as stuck at STOP_AFTER.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

WARN_AFTER = 3  # steps in the loop (the first occurrence included) before the model is warned
STOP_AFTER = 5  # … before the run is stopped as stuck
RECENT = 8  # how many recent steps count as "already seen"

ERROR = re.compile(r"Traceback \(most recent call last\)|\b\w*Error\b|exit code [1-9]|command not found|"
                   r"No such file|could not|cannot|failed|Timed out|Not run", re.I)


# where an error happened, not what it is: "line 189", "file.py:12:", "<step 7>" differ between the same errors
# (only error lines are compared this way: in plain output such numbers are what tells two results apart)
_PLACE = re.compile(r"\b(line|step) \d+|:\d+(:\d+)?(?=[:\s]|$)|<step \d+>", re.I)


def _key(text: str) -> str:
    return " ".join(text.split())[:4000]


def _where_removed(line: str) -> str:
    return _PLACE.sub(_placeholder, " ".join(line.split()))


def _placeholder(match: re.Match) -> str:
    if match.group(1):
        return match.group(1) + " N"
    return "<step N>" if match.group(0).startswith("<") else ":N"


def error_signature(observation: str) -> str | None:
    """What an error is, apart from where it happened: a Python exception line, else the last line of output that
    is not just an exit code. None when the observation reports no error."""
    if not ERROR.search(observation):
        return None
    lines = [_where_removed(line) for line in observation.splitlines() if line.strip()]
    for line in reversed(lines):
        if re.match(r"^[\w.]*(Error|Exception|Interrupt|Exit)\b", line):
            return line
    meaningful = [line for line in lines if not re.fullmatch(r"exit code \d+", line)]
    return meaningful[-1] if meaningful else None


@dataclass
class LoopDetector:
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT))  # (action, observation, error) keys
    stale_run: int = 0
    kind: str = ""  # what the current loop is made of, for the warning

    def observe(self, command: str, arg: str, observation: str) -> int:
        """Record one step; returns the length of the current loop (1 when this step brought something new)."""
        action, seen, error = f"{command}\0{_key(arg)}", _key(observation), error_signature(observation)
        repeated_step = any(a == action and o == seen for a, o, _ in self.recent)
        repeated_error = error is not None and any(e == error for _, _, e in self.recent)
        self.recent.append((action, seen, error))
        if repeated_step or repeated_error:
            self.stale_run += 1
            self.kind = "the same action with the same result" if repeated_step else "the same error"
        else:
            self.stale_run = 0
        return self.stale_run + 1

    def warning(self, length: int) -> str:
        return (f"WARNING: you are going round in circles — {self.kind} {length} times in the last steps, with no "
                f"progress. Do not do it again: step back, question your assumptions, and try a different approach "
                f"(or finish with what you have). The run is stopped after {STOP_AFTER} such steps.")
