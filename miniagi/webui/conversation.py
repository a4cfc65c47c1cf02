"""A run as one turn of a conversation: a run and its follow-ups (and a chat's objectives, each a run that follows
the one before) read as one thread, each objective, its steps and its answer, on the page of any of them."""

from __future__ import annotations

from typing import Callable

from .. import events as ev

THREAD_RUNS = 20  # runs of a conversation shown on either side of a run's page


def conversation(run_id: str, follows: str | None, results: Callable[[], list[dict]],
                 turn: Callable[[str], dict | None]) -> tuple[list[dict], list[dict]]:
    """The runs before this one in its conversation (each a follow-up or a chat's next objective of the one
    before), oldest first, and those after it, each the newest run that follows the one before; each as `turn`
    shows a run (None: it cannot be read, and the thread stops there). `results`: every run's result.json."""
    earlier, seen = [], {run_id}
    while follows and follows not in seen and len(earlier) < THREAD_RUNS:
        seen.add(follows)
        found = turn(follows)
        if found is None:
            break
        earlier.insert(0, found)
        follows = found["follows"]
    after: dict[str, str] = {}
    for result in reversed(results()):  # oldest first: the newest follow-up of each run wins
        if result.get("follows"):
            after[str(result["follows"])] = result["run_id"]
    later, current = [], run_id
    while current in after and after[current] not in seen and len(later) < THREAD_RUNS:
        current = after[current]
        seen.add(current)
        found = turn(current)
        if found is None:
            break
        later.append(found)
    return earlier, later


def once_per_step(events: list[ev.Event]) -> list[ev.Event]:
    """Each step once: a step begun again after a resume (its action interrupted before it was observed) is shown
    as it was done, the first attempt left out with its replies."""
    last = {}
    for index, event in enumerate(events):
        if isinstance(event, (ev.Action, ev.FormatError)):
            last[event.step] = index
    kept, dropping = [], None
    for index, event in enumerate(events):
        if isinstance(event, (ev.Action, ev.FormatError)):
            dropping = event.step if last[event.step] != index else None
        elif not isinstance(event, (ev.ModelCall, ev.Recall)):
            dropping = None
        if dropping is None or getattr(event, "step", None) != dropping:
            kept.append(event)
    return kept
