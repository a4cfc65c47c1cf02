"""`miniagi runs` and `miniagi show`: runs made readable (rich on stdout) or scriptable (--json)."""

from __future__ import annotations

import json
from typing import Callable

from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from . import events as ev
from .run_store import RunRecord, RunStore
from .terminal import calls, make_console, visible, visible_json
from .text import files_changed_line, plural

# `miniagi runs` on a screen: each column, its justification, and the narrowest screen that shows it
RUNS_COLUMNS = {"id": ("left", 0), "started": ("left", 0), "status": ("left", 0), "took": ("right", 100),
                "steps": ("right", 0), "cost": ("right", 0), "cached": ("right", 100), "objective": ("left", 0),
                "folder": ("left", 120)}
STATUS_STYLES = {"done": "green", "running": "cyan", "limit": "yellow", "interrupted": "yellow"}


def print_runs(store: RunStore, status: str | None = None, as_json: bool = False) -> None:
    results = store.results(status)
    if as_json:
        print(visible_json(results))
        return
    console = make_console()
    if not results:
        console.print(f"no runs{f' with status {status}' if status else ''} under {store.root}")
        return
    if not console.is_terminal:  # a pipe or a file: one whole line per run, tab-separated, for grep and cut
        print("id\tstarted\tstatus\ttook\tsteps\tcost\tcached\tfolder\tobjective")
        for result in results:
            print(visible("\t".join([str(result.get("run_id", "?")), started(result), str(result.get("status", "?")),
                                     took(result), str(result.get("steps", 0)), f"${result.get('cost_usd', 0):.4f}",
                                     cache_rate(result), folder(result), objective_of(result)])))
        return
    table = Table(box=None, header_style="bold", collapse_padding=True, pad_edge=False)
    # the objective says which run is which: on a narrower screen it keeps its room, and the folder, then the
    # time taken and the cache rate, go (`--json` and a pipe have them all)
    shown = [name for name in RUNS_COLUMNS if console.width >= RUNS_COLUMNS[name][1]]
    rows = []
    for result in results:
        state = result.get("status", "?")
        rows.append({"id": visible(result.get("run_id", "?")), "status": visible(state), "started": started(result),
                     "took": took(result), "steps": str(result.get("steps", 0)),
                     "cost": f"${result.get('cost_usd', 0):.4f}", "cached": cache_rate(result),
                     "objective": visible(objective_of(result)[:200]),
                     "folder": _path_end(visible(folder(result)), 30)})
    # the objective has what the other columns (at their width, a space between) leave of the screen
    others = sum(max(cell_len(name), *(cell_len(row[name]) for row in rows)) + 1 for name in shown
                 if name != "objective")
    for name in shown:
        table.add_column(name, justify=RUNS_COLUMNS[name][0], no_wrap=True, overflow="ellipsis",
                         max_width=max(12, console.width - others) if name == "objective" else None)
    for row in rows:
        table.add_row(*(Text(row[name], style=STATUS_STYLES.get(row[name], "red") if name == "status" else "")
                        for name in shown))
    console.print(table)


def print_run(record: RunRecord, raw: bool = False, as_json: bool = False) -> None:
    """Step by step: thought, command, argument, observation, and each step's tokens and cost. Every text of the
    trace is the model's or executed code's: it is made visible (no escape sequence reaches the terminal raw)."""
    result = record.read_result()
    if as_json:
        print(visible_json({"result": result, "events": list(record.events())}))
        return
    console = make_console()
    say = _sayer(console)

    usage: dict[int, list[float]] = {}
    speed: dict[int, str] = {}  # step → how fast its agent reply came, when it streamed
    system_shown = ""
    for event in ev.read(record.events()):
        step = event.step
        if isinstance(event, ev.RunStart):
            _print_start(say, record, event, result)
        elif isinstance(event, ev.Resume):
            say(f"— resumed at {event.time} —", "bold yellow")
        elif isinstance(event, ev.ModelCall):
            tokens = usage.setdefault(step, [0, 0, 0.0])
            tokens[0] += event.prompt_tokens
            tokens[1] += event.completion_tokens
            tokens[2] += event.cost_usd
            if event.role == "agent" and event.tokens_per_s is not None:
                speed[step] = f" · first token {event.first_token_s:.1f} s · {event.tokens_per_s:g} tokens/s"
            if raw:
                system_shown = _print_raw_call(say, event, system_shown)
        elif isinstance(event, (ev.Action, ev.FormatError)):
            _print_step(console, say, event, usage.get(step, [0, 0, 0.0]), speed.get(step, ""))
        elif isinstance(event, ev.Observation):
            say("observation:\n" + _indent(event.text), "dim")
            if event.files:
                say(f"files: {files_changed_line(event.files)} (miniagi diff {record.run_id} --step {step})", "cyan")
        elif isinstance(event, (ev.LoopWarning, ev.CriticReview, ev.CriticVerdict, ev.SummaryFolded)):
            say(f"[{event.type}] {event.text}", "yellow")
        elif isinstance(event, ev.RunEnd):
            console.print()
            say(f"ended: {event.status}" + (f" — {event.message}" if event.message else ""), "bold")
    if result:
        _print_totals(say, result)


def _path_end(path: str, width: int) -> str:
    return path if len(path) <= width else "…" + path[-(width - 1):]


def _sayer(console) -> Callable[..., None]:
    """How `show` prints a text: made visible; on a screen, a line too long for it goes on under its own indent,
    broken at words."""

    def say(text: str, style: str = "") -> None:
        text = visible(text)
        if console.is_terminal:
            text = "\n".join(_hanging(line, console.width) for line in text.split("\n"))
        console.print(Text(text, style=style))

    return say


def _hanging(line: str, width: int) -> str:
    """A line within `width`, broken at words, each further part indented two more than the line itself."""
    if cell_len(line) <= width:
        return line
    import textwrap

    indent = " " * (len(line) - len(line.lstrip(" ")) + 2)
    return textwrap.fill(line, width, subsequent_indent=indent, break_on_hyphens=False, expand_tabs=False,
                         replace_whitespace=False, drop_whitespace=True)


def _print_start(say: Callable[..., None], record: RunRecord, event: ev.RunStart, result: dict) -> None:
    """A run's heading: its id (and what it replays), objective, folder and times."""
    say(f"run {record.run_id}" + (f" · a replay of run {event.extra['replay_of']}: no model calls"
                                  if event.extra.get("replay_of") else ""), "bold")
    say(f"objective: {event.objective}", "cyan")
    if result:
        say(f"folder: {folder(result)} · started {started(result)} · "
            f"{'running for' if result.get('status') == 'running' else 'took'} {took(result)}", "dim")


def _print_step(console, say: Callable[..., None], event: ev.Action | ev.FormatError, usage: list[float],
                speed: str) -> None:
    """A step's heading, with its tokens, cost and speed, and what it chose: its command, thought and argument, or
    the format error its reply had."""
    prompt, completion, cost = usage
    console.print()
    if isinstance(event, ev.FormatError):
        console.print(Text.assemble((f"step {event.step} format error", "bold red"),
                                    (f"  {prompt}+{completion} tokens{speed}", "dim")))
        say(event.error, "red")
        return
    heading, figures = visible(f"command: {event.command}"), f"{prompt}+{completion} tokens · ${cost:.4f}{speed}"
    wide = not console.is_terminal or cell_len(f"step {event.step} {heading}  {figures}") <= console.width
    console.print(Text.assemble((f"step {event.step} ", "bold"), (heading, "bold magenta"),
                                (f"  {figures}" if wide else "", "dim")))
    if not wide:  # the figures on a line of their own, under the heading
        say(f"  {figures}", "dim")
    if event.thought:
        say(f"thought: {event.thought}", "italic")
    say("argument:\n" + _indent(event.arg), "yellow")


def _print_raw_call(say: Callable[..., None], event: ev.ModelCall, system_shown: str) -> str:
    """A model call as sent and received (--raw): its prompt's messages, kept with --debug, and its raw response.
    The system prompt is shown once while it stays the same: returned is the one shown last."""
    for message in event.messages or ():
        content = str(message.get("content") or "")
        if message.get("role") == "system":
            content, system_shown = ("(the system prompt shown above)" if content == system_shown
                                     else content), content
        say(f"[{event.role} prompt · {message.get('role')}]", "dim blue")
        say(content, "dim")
    timing = (f" · first token {event.first_token_s:.1f} s · {event.generation_s:.1f} s generating · "
              f"{event.tokens_per_s:g} tokens/s" if event.tokens_per_s is not None else "")
    say(f"[{event.role} · {event.model} · {event.latency_s} s{timing}] raw response:", "dim")
    say(event.response, "dim")
    return system_shown


def _print_totals(say: Callable[..., None], result: dict) -> None:
    """A run's totals (steps, calls, tokens, cost, the endpoint's cache) and its answer."""
    say(f"{plural(result.get('steps') or 0, 'step')} · {calls(result)} · "
        f"{result.get('prompt_tokens')}+{result.get('completion_tokens')} tokens · "
        f"${result.get('cost_usd', 0):.4f} · {cache_rate(result)} of prompt tokens from the "
        f"endpoint's cache (saved ${result.get('cost_saved_usd') or 0:.4f})", "dim")
    if result.get("answer") is not None:
        say("answer:", "bold green")
        say(str(result["answer"]))


def print_prompt(record: RunRecord, step: int, as_json: bool = False) -> int:
    """`show RUN --prompt N`: the messages the model was sent for step N, each with what it covers. 1 when the run
    kept none for that step (it is older than prompts.jsonl, or never reached step N)."""
    from dataclasses import asdict

    from .model_view import read_prompts

    prompts = read_prompts(record.dir, step)
    if as_json:
        print(visible_json([asdict(prompt) for prompt in prompts]))
        return 0 if prompts else 1
    if not prompts:
        make_console(stderr=True).print(Text(f"run {record.run_id} kept no prompt for step {step} (a run before "
                                             "prompts were kept, or a step it never reached)", style="red"))
        return 1
    console = make_console()
    for prompt in prompts:
        console.print(Text(f"run {record.run_id} · step {prompt.step} · what the model saw"
                           + (f" (call {prompt.call})" if len(prompts) > 1 else ""), style="bold"))
        for number, part in enumerate(prompt.parts, 1):
            console.print()
            console.print(Text.assemble((f"[{number}] {part.role}", "bold blue"), (f" — {visible(part.covers)}",
                                                                                   "dim")))
            console.print(Text(visible(part.content)))
            for call in part.tool_calls or ():
                console.print(Text(visible(f"[tool call] {json.dumps(call, ensure_ascii=False)}"), style="yellow"))
    return 0


def objective_of(result: dict) -> str:
    """A run's objective on one line, marked when the run is a replay."""
    objective = " ".join(str(result.get("objective", "")).split())
    return f"(replay of {result['replay_of']}) {objective}" if result.get("replay_of") else objective


def started(result: dict) -> str:
    """When a run started, in local time to the minute."""
    from datetime import datetime

    try:
        moment = datetime.fromisoformat(str(result.get("started_at")).replace("Z", "+00:00"))
        return moment.astimezone().strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return "?"


def took(result: dict) -> str:
    """How long a run took, start to end (a running one: so far), as "42 s", "3 m 05 s", "1 h 02 m"."""
    from datetime import datetime, timezone

    try:
        start = datetime.fromisoformat(str(result.get("started_at")).replace("Z", "+00:00"))
        end = (datetime.fromisoformat(str(result["ended_at"]).replace("Z", "+00:00")) if result.get("ended_at")
               else datetime.now(timezone.utc))
        seconds = max(0, round((end - start).total_seconds()))
    except (ValueError, TypeError):
        return "?"
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} m {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} m"


def folder(result: dict) -> str:
    """The work directory a run worked in, the home shown as ~."""
    import os

    path = str(result.get("workdir") or "?")
    home = os.path.expanduser("~")
    return "~" + path[len(home):] if home != "/" and (path == home or path.startswith(home + os.sep)) else path


def cache_rate(result: dict) -> str:
    """The share of prompt tokens the endpoint served from its prompt cache."""
    prompt = result.get("prompt_tokens") or 0
    return f"{100 * (result.get('cached_prompt_tokens') or 0) / prompt:.0f}%" if prompt else "-"


def print_memory_hits(hits, as_json: bool = False, redact=lambda text: text, left_out: int = 0) -> None:
    """Best match first, each with its similarity (1 - cosine distance) and where it comes from."""
    if as_json:
        print(visible_json([{"id": h.id, "text": redact(h.text), "distance": round(h.distance, 4), **h.metadata}
                            for h in hits]))
        return
    console = make_console()
    if not hits:
        console.print("no relevant memories found")
    for hit in hits:
        if hit.kind == "document":
            where = f"document {hit.metadata.get('source') or '?'}"
        else:
            where = f"{hit.kind} · run {hit.run}" + (f" step {hit.step}" if hit.step else "")
        console.print(Text.assemble((f"similarity {1 - hit.distance:.2f}", "bold"), (visible(f"  {where}"), "dim")))
        console.print(Text(visible(redact(hit.text[:500])) + ("…" if len(hit.text) > 500 else "")))
    if left_out:
        console.print(Text(f"({left_out} less relevant {'match' if left_out == 1 else 'matches'} left out: --all "
                           "shows them)", "dim"))


def print_memory_stats(stats: dict, as_json: bool = False) -> None:
    if as_json:
        print(json.dumps(stats))
        return
    kinds = ", ".join(f"{count} {kind}" for kind, count in sorted(stats["kinds"].items())) or "nothing yet"
    print(f"{plural(stats['items'], 'memory', 'memories')} from {plural(stats['runs'], 'run')} ({kinds})\n"
          f"embeddings: {stats['embedder']} · stored in {stats['path']}")


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in str(text).splitlines()) or "  (none)"
