"""The workbench's pages: what a run's page offers (the question it waits for, Stop, follow up, Resume) and the
actions, each a POST from the UI's own pages (auth.py has refused any other; here the form's csrf field is checked).
Status codes say what happened: 400 a form that cannot be used, 403 refused (a forged form, a work directory this
UI may not use), 404 no such run or session, 409 no longer applies (answered already, not driven here, still
running)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from starlette.requests import Request
from starlette.responses import RedirectResponse
from starlette.routing import Route

from ..config import ConfigError
from .auth import checked_form
from .context import UIContext
from .workbench import PROTOCOLS, Options

YES_WORDS = ("1", "true", "on", "yes")


def said_yes(value) -> bool:
    """A form's yes (a checkbox sends "on"): 1, true, on or yes, in any case; anything else, or nothing, is no."""
    return str(value or "").strip().lower() in YES_WORDS


class Refused(Exception):
    """An action that cannot be done: its status code and why."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def controls(ui: UIContext, run_id: str, result: dict) -> dict:
    """What the page offers for a run: the question it waits for, Stop, follow up, resume."""
    status = result.get("status", "running")
    session = ui.bench.driving(run_id)
    question = session.channel.question() if session is not None else None
    if question is not None and question.get("run_id") not in ("", run_id):
        question = None
    known = result.get("workdir") and ui.bench.workdir(str(result["workdir"])) is not None
    values = {"run_id": run_id, "status": status, "session": session, "question": question,
              "stop": session is not None and status == "running",
              "chat_next": session is not None and session.kind == "chat" and status != "running",
              "follow": session is None and status != "running" and known and not result.get("continued_in"),
              "continued_in": result.get("continued_in"), "asked_above": result.get("asked_above"),
              "resume_yes": result.get("ran_without_asking"),
              "resume": session is None and status not in ("running", "done") and known}
    key = "|".join(str(v) for v in (status, session and session.id, question and question.get("id"),
                                    values["follow"], values["resume"], values["chat_next"]))
    return {"html": ui.templates.get_template("control.html").render(**values), "key": key,
            "live": session is not None,
            "stream": session.channel.streaming() if session is not None and status == "running" else None}


async def form_of(ui: UIContext, request: Request):
    form = await checked_form(request, ui.token)
    if form is None:
        raise Refused(403, "refused: this form did not come from this UI's page (its csrf field is missing or "
                           "wrong); reload the page")
    return form


def options_of(form) -> Options:
    protocol = str(form.get("protocol") or "")
    if protocol and protocol not in PROTOCOLS:
        raise Refused(400, f"protocol: one of {', '.join(PROTOCOLS)}")
    steps = str(form.get("max_steps") or "").strip()
    if steps and not (steps.isdigit() and int(steps) > 0):
        raise Refused(400, "max steps: a whole number above 0")
    return Options(model=str(form.get("model") or "").strip(), protocol=protocol,
                   max_steps=int(steps) if steps else None, critic=said_yes(form.get("critic")),
                   yes=said_yes(form.get("yes")))


def run_result(ui: UIContext, run_id: str) -> dict:
    try:
        return ui.store.open(run_id).read_result()
    except ConfigError as exc:
        raise Refused(404, str(exc)) from None


def allowed_workdir(ui: UIContext, result: dict) -> Path:
    workdir = ui.bench.workdir(str(result.get("workdir") or ""))
    if workdir is None:
        raise Refused(403, f"this run worked in {result.get('workdir')}, not a work directory this UI may use "
                           "(start `miniagi ui --workdir DIR` to allow it)")
    return workdir


async def start(ui: UIContext, request: Request):
    form = await form_of(ui, request)
    objective = str(form.get("objective") or "").strip()
    if not objective:
        raise Refused(400, "the objective is empty: say what the agent should do")
    workdir = ui.bench.workdir(str(form.get("workdir") or ui.bench.workdirs[0]))
    if workdir is None:
        raise Refused(403, "that work directory is not one this UI may use (`miniagi ui --workdir DIR` adds one)")
    options = options_of(form)
    typed = ui.start_form(typed={"objective": objective, "model": options.model})
    if typed["setup_problem"]:  # the form again, as it was typed, saying what to fix
        return ui.page("runs.html", _status=409, runs=ui.store.results(), status=None, query="", statuses=(),
                    **typed)
    session = ui.bench.start(objective, workdir, options, chat=bool(form.get("chat")))
    return RedirectResponse(f"/sessions/{session.id}", status_code=303)


async def answer(ui: UIContext, request: Request):
    form = await form_of(ui, request)
    session = ui.bench.sessions.get(request.path_params["session"])
    if session is None:
        raise Refused(404, "no such session in this UI")
    decision = str(form.get("decision") or "")
    reply = {"answer": str(form.get("answer") or "")} if "answer" in form else {
        "run": decision == "approve", "feedback": str(form.get("feedback") or "")}
    if not session.channel.answer(str(form.get("qid") or ""), reply):
        raise Refused(409, "that question is no longer waiting (answered already, or the run stopped)")
    back = session.current()
    return RedirectResponse(f"/runs/{back}" if back else f"/sessions/{session.id}", status_code=303)


async def stop(ui: UIContext, request: Request):
    await form_of(ui, request)
    run_id = request.path_params["run_id"]
    run_result(ui, run_id)
    session = ui.bench.driving(run_id)
    if session is None:
        raise Refused(409, "this run is not driven by this UI (a run started in a terminal stops there)")
    session.interrupt()
    return RedirectResponse(f"/runs/{run_id}", status_code=303)


async def resume(ui: UIContext, request: Request):
    form = await form_of(ui, request)
    run_id = request.path_params["run_id"]
    result = run_result(ui, run_id)
    if ui.bench.driving(run_id) is not None or result.get("status") in ("running", "done"):
        raise Refused(409, f"run {run_id} is {result.get('status')}: only a stopped run resumes")
    session = ui.bench.resume(run_id, allowed_workdir(ui, result), yes=said_yes(form.get("yes")))
    return RedirectResponse(f"/sessions/{session.id}", status_code=303)


async def followup(ui: UIContext, request: Request):
    form = await form_of(ui, request)
    run_id = request.path_params["run_id"]
    result = run_result(ui, run_id)
    text = str(form.get("followup") or "").strip()
    if not text:
        raise Refused(400, "the follow-up is empty: say what the agent should do next")
    session = ui.bench.driving(run_id)
    if session is not None:  # a chat waiting for its next objective
        before = len(session.runs())
        if result.get("status") == "running" or not session.say(text):
            raise Refused(409, f"run {run_id} is still going: follow it up once it has ended")
        return RedirectResponse(f"/sessions/{session.id}?after={before}", status_code=303)
    if result.get("status") == "running":
        raise Refused(409, f"run {run_id} is still going: follow it up once it has ended")
    session = ui.bench.start(text, allowed_workdir(ui, result), options_of(form), chat=bool(form.get("chat")),
                             follows=run_id)
    return RedirectResponse(f"/sessions/{session.id}", status_code=303)


def session_page(ui: UIContext, request: Request):
    """A session just started: on to its run once it has one; meanwhile what it asks, or why it ended."""
    session = ui.bench.sessions.get(request.path_params["session"])
    if session is None:
        raise Refused(404, "no such session in this UI (sessions last as long as `miniagi ui`)")
    try:
        after = max(0, int(request.query_params.get("after", "0") or 0))
    except ValueError:
        after = 0
    runs = session.runs()
    if len(runs) > after:
        return RedirectResponse(f"/runs/{runs[-1]}", status_code=303)
    return ui.page("session.html", session=session, question=session.channel.question(), alive=session.alive(),
                   log=ui.redact(session.log_tail()), code=session.process.returncode)


def steering_routes(ui: UIContext) -> list[Route]:
    """The routes of the actions and of a session's page."""
    return [
        Route("/start", partial(start, ui), methods=["POST"]), Route("/sessions/{session}", partial(session_page, ui)),
        Route("/sessions/{session}/answer", partial(answer, ui), methods=["POST"]),
        Route("/runs/{run_id}/stop", partial(stop, ui), methods=["POST"]),
        Route("/runs/{run_id}/resume", partial(resume, ui), methods=["POST"]),
        Route("/runs/{run_id}/followup", partial(followup, ui), methods=["POST"])]
