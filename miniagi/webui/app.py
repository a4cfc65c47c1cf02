"""The web app over $MINIAGI_HOME: read-only over runs, batches and memory.

Everything shown passes the run files' redaction again, and every text is escaped by the templates (observations
and model replies are untrusted: a reply holding <script> is shown as text). A running run's page polls
/runs/ID/events?after=N and appends the steps that came since, rendered here, so the page never reloads.
"""

from __future__ import annotations

from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .. import events as ev
from ..config import ConfigError
from ..report import cache_rate
from ..runs import STATUSES, RunStore
from .batches import batch_routes

HERE = Path(__file__).parent
FOLD_LINES = 12  # an observation longer than this is folded


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


def create_app(home: Path, redact=lambda text: text) -> Starlette:
    store = RunStore(Path(home), redact)
    templates = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(default=True))
    templates.globals.update(highlight=highlight, fold_lines=FOLD_LINES, cache_rate=cache_rate)
    templates.filters["redact"] = lambda text: redact(str(text)) if text is not None else ""

    def page(name: str, **values) -> HTMLResponse:
        return HTMLResponse(templates.get_template(name).render(**values))

    def read_events(run_id: str) -> tuple[object, list[ev.Event]]:
        record = store.open(run_id)
        return record, ev.read(record.events())

    async def runs_list(request: Request):
        status, query = request.query_params.get("status") or None, request.query_params.get("q", "").strip()
        runs = [r for r in store.results(status) if query.lower() in str(r.get("objective", "")).lower()]
        return page("runs.html", runs=runs, status=status, query=query, statuses=STATUSES)

    async def run_page(request: Request):
        try:
            record, events = read_events(request.path_params["run_id"])
        except ConfigError as exc:
            return page("missing.html", message=str(exc))
        result = record.read_result()
        return page("run.html", run_id=record.run_id, result=result, events=events, count=len(events),
                    chart=chart(usage(events)))

    async def run_events(request: Request):
        """What came since event N, rendered, for a page watching a running run."""
        try:
            record, events = read_events(request.path_params["run_id"])
        except ConfigError as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)
        after = max(0, int(request.query_params.get("after", "0") or 0))
        html = templates.get_template("events.html").render(events=events[after:])
        result = record.read_result()
        return JSONResponse({"count": len(events), "html": html, "status": result.get("status", "running"),
                             "chart": str(chart(usage(events))),
                             "meta": templates.get_template("meta.html").render(result=result)})

    memory: list = []  # the vector memory, opened (with its embedder) on the first search and kept

    async def memory_page(request: Request):
        query = request.query_params.get("q", "").strip()
        hits, problem = [], ""
        if query:
            try:
                if not memory:
                    from ..agent import open_vector_memory
                    from ..config import Settings

                    memory.append(open_vector_memory(Settings(home=str(home), memory_scope="global"), {}, None,
                                                     redact))
                hits = memory[0].search(query, 10)
            except Exception as exc:  # no memory yet, or a store that cannot be opened
                problem = f"{type(exc).__name__}: {exc}"
        return page("memory.html", query=query, hits=hits, problem=problem)

    async def api_runs(request: Request):
        return JSONResponse(store.results(request.query_params.get("status") or None))

    return Starlette(routes=[
        Route("/", runs_list), Route("/runs/{run_id}", run_page), Route("/runs/{run_id}/events", run_events),
        *batch_routes(home, page), Route("/memory", memory_page), Route("/api/runs", api_runs),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static")])


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


def serve(home: Path, host: str, port: int, open_browser: bool, redact) -> None:
    import uvicorn

    url = f"http://{host}:{port}/"
    if open_browser:
        import threading
        import webbrowser

        threading.Timer(1.0, lambda: webbrowser.open(url)).start()
    uvicorn.run(create_app(home, redact), host=host, port=port, log_level="warning")
