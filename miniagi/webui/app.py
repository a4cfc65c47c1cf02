"""The web app over $MINIAGI_HOME: the runs, batches and memory, and a workbench that starts and steers runs
(workbench.py: each an ordinary `miniagi` process, asking through control.py's files).

Its pages only read: a GET writes nothing, not even an empty memory store. Everything shown passes the run files'
redaction again, and every text is escaped by the templates (observations and model replies are untrusted: a reply
holding <script> is shown as text). A run's page polls /runs/ID/events?after=N and appends the steps that came
since, rendered here, with what the run waits for; the page never reloads.
It is locked (auth.py): a token, then a cookie, for every request; actions are POSTs that only its own pages can
make. Only requests that name this machine (loopback, or --host) in their Host header are answered: a web page
elsewhere cannot reach the UI through a name it re-points at 127.0.0.1 (DNS rebinding).
The handlers are plain functions of (the app's UIContext, the request), which Starlette runs in a thread, and they
read run files only as bounded regular files (runs.open_regular): a FIFO, a huge file or a broken line in a run
folder makes that run unreadable, never a page hang.
"""

from __future__ import annotations

import threading
from functools import cache, partial
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .. import events as ev
from ..checkpoints.history import changes_text
from ..config import ConfigError
from ..report import cache_rate, folder, started, took
from ..run_store import STATUSES, RunStore
from ..text import files_changed_line
from .auth import TokenCheck, csrf_value, new_token
from .batches import batch_routes
from .context import UIContext
from .conversation import conversation
from .steering import Refused, controls, steering_routes
from .workbench import PROTOCOLS, Workbench

HERE = Path(__file__).parent
FOLD_LINES = 12  # an observation longer than this is folded
LOOPBACK = ("localhost", "127.0.0.1", "::1")
ANY_HOST = ("0.0.0.0", "::", "")  # listening on every interface: the names it is reached by are unknown
RATE_MIN_S = 0.5  # a tokens/s figure is shown for a reply generated over this long at least: a rate over less says
#                  little (an instant server's "4943 tokens/s")


def host_name(header: str) -> str:
    """The name in a Host header, without its port ("[::1]:8000" → "::1")."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class HostCheck:
    """Answers only requests whose Host header names this machine the way the UI was started."""

    def __init__(self, app, host: str):
        self.app = app
        self.allowed = None if host in ANY_HOST else {*LOOPBACK, host_name(host)}

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.allowed is not None:
            headers = dict(scope.get("headers") or [])
            if host_name(headers.get(b"host", b"").decode("latin-1")) not in self.allowed:
                response = PlainTextResponse("this UI answers only to its own host name (localhost, 127.0.0.1)",
                                             status_code=421)
                return await response(scope, receive, send)
        return await self.app(scope, receive, send)


def highlight(code: str, command: str) -> Markup:
    """Code of an action, highlighted (pygments escapes it)."""
    from pygments import highlight as pyg
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import BashLexer, PythonLexer, TextLexer

    lexer = PythonLexer() if command == "execute_python" else BashLexer() if command == "execute_shell" else TextLexer()
    return Markup(pyg(code, lexer, HtmlFormatter(nowrap=True)))


def chart(points: list[tuple[int, int, float]]) -> Markup:
    """Prompt tokens (bars) and cost so far (line) per step, as inline SVG: nothing fetched, works offline."""
    if not points:
        return Markup("")
    width, height, pad = 640, 140, 24
    most = max(p[1] for p in points) or 1
    total = max(p[2] for p in points) or 1.0
    step_w = (width - 2 * pad) / len(points)
    bars, line = [], []
    for i, (step, tokens, cost) in enumerate(points):
        h = (height - 2 * pad) * tokens / most
        x = pad + i * step_w
        bars.append(f'<rect x="{x:.1f}" y="{height - pad - h:.1f}" width="{max(1.0, step_w - 2):.1f}" '
                    f'height="{h:.1f}"><title>step {step}: {tokens} prompt tokens, ${cost:.4f} so far</title></rect>')
        line.append(f"{x + step_w / 2:.1f},{height - pad - (height - 2 * pad) * cost / total:.1f}")
    return Markup(f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="prompt tokens and cost '
                  f'per step">{"".join(bars)}<polyline points="{" ".join(line)}"/>'
                  f'<text x="{pad}" y="14">prompt tokens per step (max {most:,}) · cost so far (line, '
                  f'${total:.4f})</text></svg>')


def create_app(home: Path, redact=lambda text: text, host: str = "127.0.0.1", token: str | None = None,
               workdirs: list[Path] | None = None, environ: dict[str, str] | None = None):
    """The app, locked with `token` (made here when not given; the returned app's `.token`), able to start runs in
    `workdirs` (the current folder by default) with `environ` (this process's by default)."""
    store = RunStore(Path(home), redact)
    token = token or new_token()
    bench = Workbench(Path(home), list(workdirs or [Path.cwd()]), environ)
    templates = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(default=True))
    templates.globals.update(highlight=highlight, fold_lines=FOLD_LINES, cache_rate=cache_rate, csrf=csrf_value(token),
                             folder=folder, started=started, took=took,
                             workdirs=bench.workdirs, protocols=PROTOCOLS, rate_min_s=RATE_MIN_S)
    templates.globals["files_summary"] = files_changed_line  # a step's line: "2 files changed: a.txt, d.txt (new)"
    templates.filters["redact"] = lambda text: redact(str(text)) if text is not None else ""
    templates.filters["markdown"] = markdown
    ui = UIContext(Path(home), store, bench, templates, token, redact)
    app = Starlette(routes=[
        Route("/", partial(runs_list, ui)), Route("/runs/{run_id}", partial(run_page, ui)),
        Route("/runs/{run_id}/events", partial(run_events, ui)),
        Route("/runs/{run_id}/prompt/{step}", partial(prompt_page, ui)),
        Route("/runs/{run_id}/diff", partial(run_diff, ui)),
        *batch_routes(home, ui.page), Route("/memory", partial(memory_page, ui)),
        Route("/api/runs", partial(api_runs, ui)),
        *steering_routes(ui),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static")],
        exception_handlers={Refused: lambda request, exc: ui.refused(exc.status, exc.message)})
    locked = HostCheck(TokenCheck(app, token), host)
    locked.token, locked.workbench = token, bench
    return locked


def runs_list(ui: UIContext, request: Request):
    status, query = request.query_params.get("status") or None, request.query_params.get("q", "").strip()
    runs = [r for r in ui.store.results(status) if query.lower() in str(r.get("objective", "")).lower()]
    return ui.page("runs.html", runs=runs, status=status, query=query, statuses=STATUSES, **ui.start_form())


def run_page(ui: UIContext, request: Request):
    try:
        record, events = ui.read_events(request.path_params["run_id"])
    except ConfigError as exc:
        message, log = ui.not_found(request.path_params["run_id"], exc)
        return ui.page("missing.html", _status=404, message=message, log=log)
    result = live_result(record.read_result(), events)
    follows = next((e.follows for e in events if isinstance(e, ev.RunStart)), None)
    earlier, later = conversation(record.run_id, follows, ui.store.results, ui.turn)
    if later:  # the conversation goes on below: it is followed up from its newest run
        result = dict(result, continued_in=later[-1]["run_id"])
    html, used = ui.render_events(record.run_id, events, result.get("status", "running") == "running")
    control = controls(ui, record.run_id, result)
    return ui.page("run.html", run_id=record.run_id, result=result, events_html=Markup(html), count=used,
                   chart=chart(usage(events)), control=control, earlier=earlier, later=later,
                   live_html=Markup(ui.live_view(record.run_id, result, events, control["stream"])))


def run_events(ui: UIContext, request: Request):
    """What came since event N, rendered, for a page watching a running run."""
    try:
        record, events = ui.read_events(request.path_params["run_id"])
    except ConfigError as exc:
        message, log = ui.not_found(request.path_params["run_id"], exc)
        return JSONResponse({"error": message, "log": log}, status_code=404)
    try:
        after = max(0, int(request.query_params.get("after", "0") or 0))
    except ValueError:
        return JSONResponse({"error": "after: give the number of events already shown"}, status_code=400)
    result = live_result(record.read_result(), events)
    html, used = ui.render_events(record.run_id, events[after:], result.get("status", "running") == "running")
    control = controls(ui, record.run_id, result)
    return JSONResponse({"count": after + used, "html": html, "status": result.get("status", "running"),
                         "chart": str(chart(usage(events))),
                         "meta": ui.templates.get_template("meta.html").render(result=result),
                         "control": control["html"], "control_key": control["key"], "live": control["live"],
                         "now": ui.live_view(record.run_id, result, events, control["stream"]),
                         "answer": str(markdown(ui.redact(result["answer"]))) if result.get("answer") is not None
                         else None})


def prompt_page(ui: UIContext, request: Request):
    """What the model saw for a step: the messages sent, each with what it covers (model_view.py)."""
    from ..model_view import read_prompts

    try:
        record = ui.store.open(request.path_params["run_id"])
        step = int(request.path_params["step"])
    except (ConfigError, ValueError) as exc:
        return ui.refused(404, str(exc))
    return ui.page("prompt.html", run_id=record.run_id, step=step, prompts=read_prompts(record.dir, step),
                   steps=record.read_result().get("steps") or 0)


def run_diff(ui: UIContext, request: Request):
    """What the run, or its step N (?step=N), changed in its work directory (miniagi diff)."""
    try:
        record = ui.store.open(request.path_params["run_id"])
        step = int(request.query_params["step"]) if request.query_params.get("step") else None
        files, diff = changes_text(record, step)
    except (ConfigError, ValueError) as exc:
        return ui.refused(404, str(exc))
    return ui.page("diff.html", run_id=record.run_id, step=step, diff=diff,
                   line=files_changed_line(files) if files else "no files changed")


def memory_page(ui: UIContext, request: Request):
    query = request.query_params.get("q", "").strip()
    hits, problem = [], ""
    if query:
        try:
            found = ui.vector_memory()
            if found is None:
                problem = f"there is no memory under {ui.home} yet"
            else:
                hits = found.search(query, 10)
        except Exception as exc:  # a store that cannot be opened
            problem = f"{type(exc).__name__}: {exc}"
    return ui.page("memory.html", query=query, hits=hits, problem=problem)


def api_runs(ui: UIContext, request: Request):
    return JSONResponse(ui.store.results(request.query_params.get("status") or None))


def live_result(result: dict, events: list[ev.Event]) -> dict:
    """A running run's result with its steps, model calls and cost counted from its trace: the run saves its result
    only when a step ends, so the header would say 0 steps and $0 while step 1 and its cost show below."""
    start = next((e for e in events if isinstance(e, ev.RunStart)), None)
    # Resume offers the run's own "run without asking" (`miniagi resume` takes --yes only when given again)
    last = next((e for e in reversed(events) if isinstance(e, (ev.Action, ev.FormatError))), None)
    result = dict(result, ran_without_asking=bool(start and start.settings.get("yes")),
                  asked_above=isinstance(last, ev.Action) and last.command == "talk_to_user")
    if result.get("status", "running") != "running":
        return result
    steps = max((e.step for e in events if isinstance(e, (ev.Action, ev.FormatError, ev.Observation))), default=0)
    calls = [e for e in events if isinstance(e, ev.ModelCall)]
    live = dict(result, steps=max(result.get("steps") or 0, steps),
                cost_usd=max(result.get("cost_usd") or 0, round(sum(e.cost_usd for e in calls), 6)),
                prompt_tokens=max(result.get("prompt_tokens") or 0, sum(e.prompt_tokens for e in calls)),
                cached_prompt_tokens=max(result.get("cached_prompt_tokens") or 0, sum(e.cached_tokens for e in calls)))
    if not result.get("replay_of"):
        live["llm_calls"] = max(result.get("llm_calls") or 0, len(calls))
    return live


def markdown(text: str) -> Markup:
    """A model's Markdown as HTML, safely: raw HTML in it is shown as text, links only to http(s), mailto or a
    page of this UI (markdown-it's own check), and no images (one would be fetched the moment the page shows it,
    carrying whatever its address holds to another server)."""
    with _MARKDOWN_LOCK:  # the first call builds it, once
        renderer = _markdown()
    return Markup(renderer.render(str(text)))


_MARKDOWN_LOCK = threading.Lock()


@cache
def _markdown():
    """One renderer, its rule chains compiled before any page uses it: markdown-it compiles them on first use, and
    two threads doing that at once could see a half-built chain (an answer rendered empty)."""
    from markdown_it import MarkdownIt

    renderer = MarkdownIt("commonmark", {"html": False}).disable("image")
    renderer.render("# a\n\n*b* `c` [d](http://e)\n\n- f\n\n> g\n\n```\nh\n```\n")
    return renderer


def usage(events: list[ev.Event]) -> list[tuple[int, int, float]]:
    """(step, prompt tokens of its calls, cost so far) per step."""
    steps: dict[int, list] = {}
    spent = 0.0
    for event in events:
        if isinstance(event, ev.ModelCall):
            spent += event.cost_usd
            entry = steps.setdefault(event.step, [0, 0.0])
            entry[0] += event.prompt_tokens
            entry[1] = spent
    return [(step, tokens, cost) for step, (tokens, cost) in sorted(steps.items()) if step > 0]


def listen(host: str, port: int):
    """The UI's socket, bound before anything is said: a port in use is a usage error (exit 2), not a crash."""
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)  # connections made once the URL is printed wait for the server, not refused
    except OSError as exc:
        if "sock" in locals():
            sock.close()
        raise ConfigError(f"cannot listen on {host} port {port}: {exc.strerror or exc} (choose another with "
                          "--port, or --host)") from None
    return sock


def serve(sock, home: Path, host: str, port: int, open_browser: bool, redact, token: str,
          workdirs: list[Path]) -> None:
    import uvicorn

    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}/?token={token}"
    opener = None
    if open_browser:  # through a file only the user can read: a URL given to the browser is in its command line
        import threading
        import webbrowser

        opener = opening_page(url)
        threading.Timer(1.0, lambda: webbrowser.open(opener.as_uri())).start()
    app = create_app(home, redact, host, token=token, workdirs=workdirs)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    try:
        server.run(sockets=[sock])
    finally:
        app.workbench.close()  # the runs it started stop as Ctrl-C stops them: state saved, resumable
        if opener is not None:
            opener.unlink(missing_ok=True)


def opening_page(url: str) -> Path:
    """A page that sends the browser on to the UI's URL, token included, in a file only this user can read (mode
    0600, in ~/.miniagi, which executed code never sees), as Jupyter opens its notebooks: what the browser is given
    on its command line (/proc/PID/cmdline, readable by every user) is the file's name, not the token."""
    import html
    import os
    import secrets

    from ..config import user_home

    folder = user_home()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = folder / f"ui-open-{os.getpid()}-{secrets.token_hex(4)}.html"
    link = html.escape(url, quote=True)
    text = (f'<!doctype html><html><head><meta charset="utf-8"><meta http-equiv="refresh" content="0;url={link}">'
            f'<title>miniagi ui</title></head><body><p>Opening <a href="{link}">the miniagi UI</a>…</p></body>'
            '</html>\n')
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)
    return path
