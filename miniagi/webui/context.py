"""What the UI's pages share (one UIContext per app, handed to each route): the run store, the workbench, the
templates, the vector memory once opened, and the ways a page reads a run and renders its steps."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Callable

from jinja2 import Environment
from markupsafe import Markup
from starlette.responses import HTMLResponse

from .. import events as ev
from ..config import ConfigError
from ..run_store import RunStore
from .conversation import once_per_step
from .setup import EndpointView
from .workbench import Workbench

RECALLED_CHARS = 400  # of each recalled text on a run page
UI_TRACE_MAX_BYTES = 64 * 2**20  # a larger trace is not shown (`miniagi show` reads it)


def in_step_order(events: list[ev.Event], running: bool) -> tuple[list[ev.Event], int]:
    """The events with each step's model replies and recall shown after its action, not above it. While the run
    goes on, a step's replies whose action has not come yet are held back: returned is how many events were used."""
    ordered, waiting = [], []
    for event in events:
        if isinstance(event, (ev.ModelCall, ev.Recall)):
            if waiting and waiting[0].step != event.step:
                ordered, waiting = ordered + waiting, []
            waiting.append(event)
            continue
        if waiting and isinstance(event, (ev.Action, ev.FormatError)) and event.step == waiting[0].step:
            ordered += [event, *waiting]
        else:
            ordered += [*waiting, event]
        waiting = []
    if running:
        return ordered, len(events) - len(waiting)
    return ordered + waiting, len(events)


class UIContext:
    """One app's shared state; its routes are functions of (this, the request)."""

    def __init__(self, home: Path, store: RunStore, bench: Workbench, templates: Environment, token: str,
                 redact: Callable[[str], str]):
        self.home, self.store, self.bench, self.templates, self.token, self.redact = (home, store, bench, templates,
                                                                                     token, redact)
        self.setup = EndpointView(bench)
        self.memory: list = []  # the vector memory, opened (with its embedder) on first use and kept

    def page(self, name: str, _status: int = 200, **values) -> HTMLResponse:
        return HTMLResponse(self.templates.get_template(name).render(**values), status_code=_status)

    def refused(self, status: int, message: str) -> HTMLResponse:
        return self.page("missing.html", _status=status, message=message)

    def read_events(self, run_id: str) -> tuple[object, list[ev.Event]]:
        record = self.store.open(run_id)
        try:
            return record, ev.read(record.events(UI_TRACE_MAX_BYTES))
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ConfigError(f"run {record.run_id} cannot be read: {getattr(exc, 'strerror', None) or exc}") from None

    def vector_memory(self):
        """The memory, when there is one: the UI never creates it (a GET writes nothing)."""
        if not self.memory:
            if not (Path(self.home) / "memory" / "chroma.sqlite3").is_file():
                return None
            from ..agent import open_vector_memory
            from ..config import Settings

            found = open_vector_memory(Settings(home=str(self.home), memory_scope="global"), {}, None, self.redact)
            found.read_only = True  # it stores no journal, makes no collection: a view stores nothing
            self.memory.append(found)
        return self.memory[0]

    def recalled(self, events: list[ev.Event]) -> dict[str, str]:
        """id → text of every item the run's steps recalled (the ids alone say nothing to a reader)."""
        ids = sorted({i for event in events if isinstance(event, ev.Recall) for i in event.ids})
        if not ids:
            return {}
        try:
            store_ = self.vector_memory()
            found = store_.collection.get(ids=ids, include=["documents"]) if store_ is not None else {}
        except Exception:  # a store that cannot be opened: the ids are shown
            return {}
        return {i: self.redact(text or "")[:RECALLED_CHARS] for i, text in zip(found.get("ids", []),
                                                                                found.get("documents", []))}

    def render_events(self, run_id: str, events: list[ev.Event], running: bool,
                      anchors: bool = True) -> tuple[str, int]:
        """The events as the page shows them; `anchors`: each step with its id (step-N), for the run the page is
        about (not for the other runs of its conversation)."""
        ordered, used = in_step_order(events, running)
        return self.templates.get_template("events.html").render(run_id=run_id, events=once_per_step(ordered),
                                                                 recalled=self.recalled(ordered),
                                                                 anchors=anchors), used

    def turn(self, run_id: str) -> dict | None:
        """A run as one turn of a conversation: its objective, its steps (folded), its answer."""
        try:
            record, events = self.read_events(run_id)
        except ConfigError:
            return None
        result = record.read_result()
        start = next((e for e in events if isinstance(e, ev.RunStart)), None)
        html, _ = self.render_events(record.run_id, [e for e in events if not isinstance(e, ev.RunStart)], False,
                                     anchors=False)
        return {"run_id": record.run_id, "objective": start.objective if start else result.get("objective", ""),
                "follows": start.follows if start else None, "status": result.get("status", "running"),
                "steps": result.get("steps") or 0, "answer": result.get("answer"), "events_html": Markup(html)}

    def start_form(self, **values) -> dict:
        """What the start form says of the model: no endpoint (and how to fix it), the model in use, the models the
        endpoint lists."""
        return {"setup_problem": self.setup.problem(), "default_model": self.setup.model(),
                "models": self.setup.models(), **values}

    def live_view(self, run_id: str, result: dict, events: list[ev.Event], stream: dict | None) -> str:
        """What the run is doing now: the reply streaming in; what its command prints as it prints it, with the
        time it has run; and, once stopped, what it printed until then (no observation records it)."""
        running = result.get("status", "running") == "running"
        printed = self.bench.printed(run_id)
        if printed is not None:
            observed = any(isinstance(e, ev.Observation) and e.step == printed.get("step") for e in events)
            printed = dict(printed, running=running and printed.get("running"))
            if observed or (running and not printed["running"]) or result.get("status") == "done":
                printed = None
            elif printed["running"]:
                printed["elapsed"] = f"{max(0.0, time.time() - float(printed.get('started') or 0)):.0f} s"
        return self.templates.get_template("live.html").render(stream=stream, printed=printed)

    def not_found(self, run_id: str, exc: ConfigError) -> tuple[str, str]:
        """Why a run cannot be found, and, when this UI started it, what its process said: a run refused at its
        first request is not kept (its folder is gone), and the page that followed it says why."""
        for session in reversed(list(self.bench.sessions.values())):
            if run_id in session.runs():
                try:  # its folder is removed just before it says why and exits
                    code = session.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    code = None
                ended = f" (exit {code})" if code is not None else ""
                return (f"run {run_id} was not kept: it ended before its first model reply{ended}",
                        self.redact(session.log_tail()))
        return str(exc), ""
