"""How a batch did. DIR/results.jsonl holds a line per attempt (objective and repeat) as each finished, reruns
appended; this reads the latest line of each attempt and sums them up: done, passed (the check passed; an objective
without a check passes when it is done, as before checks existed), cost, cost per passed objective, median steps,
model calls and median time. Used by the batch's live line and closing table, by `miniagi batch report DIR [DIR…]`
and by the UI.

The batches a home knows are recorded in $MINIAGI_HOME/batches/ when they start, so the UI lists them from there.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from memory.jsonl import json_lines

from .config import ConfigError
from .run_store import now_iso

RESULTS_NAME = "results.jsonl"
RECORD_MAX_BYTES = 64 * 1024  # a batch's record in the home is a few hundred bytes
BATCH_KEY = re.compile(r"[0-9a-f]{12}")


# --- reading ------------------------------------------------------------------------------------------------------
def results_file(where: Path) -> Path:
    """A results folder, or its results.jsonl."""
    return where if where.name == RESULTS_NAME else where / RESULTS_NAME


def read_bounded(path: Path, max_bytes: int | None = None) -> tuple[bytes, bool]:
    """(the file's bytes — its last max_bytes when it is larger —, whether it was cut). Regular files only: a FIFO,
    a device or /proc raises OSError rather than hang or read forever; opening never blocks."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(descriptor, "rb") as handle:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path} is not a regular file")
        cut = max_bytes is not None and info.st_size > max_bytes
        if cut:
            handle.seek(info.st_size - max_bytes)
        return handle.read(max_bytes if max_bytes is not None else -1), cut


def read_results(path: Path, max_bytes: int | None = None) -> tuple[list[dict], bool]:
    """Every record of a results.jsonl in order (lines torn by a crash skipped), and whether the file was cut to its
    last max_bytes. Only a file named results.jsonl, whatever a link says, under no /proc, /sys or /dev."""
    real = Path(os.path.realpath(path))
    if real.name != RESULTS_NAME or real.parts[1:2] in (("proc",), ("sys",), ("dev",)):
        raise OSError(f"{path} is not a batch's {RESULTS_NAME}")
    data, cut = read_bounded(real, max_bytes)
    lines = data.decode("utf-8", "replace").split("\n")  # not splitlines: U+2028 may sit in a string
    if cut:
        lines = lines[1:]  # the first line is likely partial
    return [record for record in json_lines(lines) if isinstance(record, dict) and "id" in record], cut


def attempt_key(record: dict) -> tuple[str, int]:
    try:
        repeat = int(record.get("repeat") or 0)
    except (TypeError, ValueError):
        repeat = 0
    return str(record["id"]), repeat


def latest(records: list[dict]) -> dict[tuple[str, int], dict]:
    """The latest record of each attempt (id, repeat); results written before repeats existed are repeat 0."""
    found: dict[tuple[str, int], dict] = {}
    for record in records:
        found[attempt_key(record)] = record
    return found


def latest_results(path: Path, key: bytes | None = None) -> dict[tuple[str, int], dict]:
    """What an earlier run of a batch left in its results.jsonl (nothing yet: empty): with a key, only the lines a
    batch of this home wrote (signed with it) — a line anything else added is not taken as done."""
    if not path.exists():
        return {}
    records = read_results(path)[0]
    return latest(records if key is None else signed(records, key))


# --- which results a batch of this home wrote ---------------------------------------------------------------------
KEY_NAME = "batch.key"
MAC_FIELD = "mac"


def results_key(home: Path) -> bytes:
    """The key this home signs its batches' results with ($MINIAGI_HOME/batch.key, made at first use, 0600). The home
    is out of executed code's reach, so code that can append to a results folder cannot sign what it appends."""
    import secrets

    from .safefs import write_new

    path = Path(home) / KEY_NAME
    for _ in range(2):
        try:
            data = read_bounded(path, 4096)[0].strip()
            if len(data) >= 32:
                return data
        except FileNotFoundError:
            pass
        path.parent.mkdir(parents=True, exist_ok=True)
        write_new(path, secrets.token_hex(32).encode())
    raise ConfigError(f"{path} does not hold a key (delete it: a new one is made)")


def _mac(record: dict, key: bytes) -> str:
    import hmac

    body = json.dumps({k: v for k, v in record.items() if k != MAC_FIELD}, ensure_ascii=False, sort_keys=True)
    return hmac.new(key, body.encode("utf-8", "surrogatepass"), "sha256").hexdigest()


def sign(record: dict, key: bytes) -> dict:
    return {**record, MAC_FIELD: _mac(record, key)}


def is_signed(record: dict, key: bytes) -> bool:
    import hmac

    mac = record.get(MAC_FIELD)
    return isinstance(mac, str) and hmac.compare_digest(mac, _mac(record, key))


def signed(records: list[dict], key: bytes) -> list[dict]:
    return [record for record in records if is_signed(record, key)]


def shown(records: list[dict], key: bytes | None) -> tuple[list[dict], int]:
    """What a report shows of a results file, and how many lines it leaves out: when a batch of this home signed any
    of its lines, only those (the others were added by something else); a file none of whose lines this home signed
    (written by another home, or by hand) is shown as it is."""
    if key is None:
        return records, 0
    good = signed(records, key)
    if not good:
        return records, 0
    return good, len(records) - len(good)


# --- scoring ------------------------------------------------------------------------------------------------------
def succeeded(record: dict | None) -> bool:
    """Done, and its check passed when it has one."""
    return bool(record) and record.get("status") == "done" and record.get("check") in (None, "pass")


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


@dataclass
class Score:
    """One objective over its attempts (one per repeat)."""

    id: str
    objective: str
    planned: int  # attempts it should have (the batch's --repeat)
    attempts: list[dict] = field(default_factory=list)

    @property
    def last(self) -> dict:
        return max(self.attempts, key=lambda r: (r.get("finished_at") or "", attempt_key(r)[1]), default={})

    def to_dict(self) -> dict:
        return {"id": self.id, "objective": self.objective, **figures(self.attempts, self.planned),
                "status": self.last.get("status"), "check": self.last.get("check"),
                "message": self.last.get("answer") or self.last.get("message") or ""}


def figures(attempts: list[dict], planned: int | None = None) -> dict:
    """The sums over some attempts: runs, done, checked, passed, pass rate, cost, cost per pass, steps, calls and
    time (seconds from setup to check)."""
    ran = [r for r in attempts if r.get("run_id")]
    passed = sum(succeeded(r) for r in attempts)
    cost = round(sum(float(r.get("cost_usd") or 0) for r in attempts), 6)
    runs = planned if planned is not None else len(attempts)
    return {"runs": runs, "finished": len(attempts), "done": sum(r.get("status") == "done" for r in attempts),
            "checked": sum(r.get("check") is not None for r in attempts), "passed": passed,
            "pass_rate": round(passed / runs, 4) if runs else None, "cost_usd": cost,
            "cost_per_pass": round(cost / passed, 6) if passed else None,
            "median_steps": _median([int(r.get("steps") or 0) for r in ran]),
            "llm_calls": sum(int(r.get("llm_calls") or 0) for r in attempts),
            "median_seconds": _median([float(r["seconds"]) for r in ran if isinstance(r.get("seconds"), (int, float))])}


def scores(found: dict[tuple[str, int], dict], objectives: list[tuple[str, str]] | None = None,
           repeat: int | None = None) -> list[Score]:
    """Per objective: the batch's own list (ids and objectives, `repeat` attempts each), or else every id found,
    in the order first seen, with as many attempts as its highest repeat says."""
    if objectives is None:
        texts: dict[str, str] = {}
        for (id_, _), record in found.items():
            texts.setdefault(id_, record.get("objective") or "")
        objectives = list(texts.items())
    by_id: dict[str, list[tuple[int, dict]]] = {}
    for (id_, number), record in found.items():
        by_id.setdefault(id_, []).append((number, record))
    result = []
    for id_, text in objectives:
        attempts = sorted(by_id.get(id_, []), key=lambda pair: pair[0])
        if repeat is not None:
            attempts = [pair for pair in attempts if pair[0] < repeat]
        planned = repeat if repeat is not None else (attempts[-1][0] + 1 if attempts else 1)
        result.append(Score(id_, text, planned, [record for _, record in attempts]))
    return result


def totals(all_scores: list[Score]) -> dict:
    planned = sum(s.planned for s in all_scores)
    return {"objectives": len(all_scores), **figures([r for s in all_scores for r in s.attempts], planned)}


def summary_line(total: dict) -> str:
    """done, pass rate (when something was checked), cost, cost per passed objective, median steps, calls, time."""
    parts = [f"{total['done']}/{total['runs']} done"]
    if total["checked"]:
        parts.append(f"{total['passed']}/{total['runs']} passed ({_percent(total['pass_rate'])})")
    parts.append(f"${total['cost_usd']:.4f}")
    if total["checked"] and total["cost_per_pass"] is not None:
        parts.append(f"${total['cost_per_pass']:.4f} per passed objective")
    if total["median_steps"] is not None:
        parts.append(f"median {total['median_steps']:g} step{'' if total['median_steps'] == 1 else 's'}")
    parts.append(f"{total['llm_calls']} model call{'' if total['llm_calls'] == 1 else 's'}")
    if total["median_seconds"] is not None:
        parts.append(f"median {_duration(total['median_seconds'])} per run")
    return " · ".join(parts)


def _duration(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds:.1f} s" if seconds < 60 else f"{seconds / 60:.1f} min"


def _percent(rate: float | None) -> str:
    return "-" if rate is None else f"{rate * 100:.0f}%"


# --- printing -----------------------------------------------------------------------------------------------------
def _status_style(status: str | None) -> str:
    return "green" if status == "done" else "yellow" if status in (None, "not started") else "red"


def _check_style(check: str | None) -> str:
    return {"pass": "green", "fail": "red", "error": "magenta"}.get(check or "", "")


def preview(text: str, width: int = 100) -> str:
    flat = " ".join(str(text).split())
    return flat[:width] + ("…" if len(flat) > width else "")


def summary_table(all_scores: list[Score], title: str = "batch summary"):
    """One row per objective: its status and check (k of N with repeats), median steps, cost, median time, and the
    latest answer or message."""
    from rich.table import Table
    from rich.text import Text

    checked = any(r.get("check") is not None for s in all_scores for r in s.attempts)
    table = Table(title=title, box=None, header_style="bold")
    for column in ("id", "status", *(["check"] if checked else []), "steps", "cost", "time", "answer / message"):
        table.add_column(column, overflow="ellipsis", no_wrap=column != "answer / message")
    for score in all_scores:
        numbers = figures(score.attempts, score.planned)
        if not score.attempts:
            status, check = Text("not started", style="yellow"), Text("")
        elif score.planned == 1:
            last = score.last
            status = Text(last.get("status") or "?", style=_status_style(last.get("status")))
            check = Text(last.get("check") or "", style=_check_style(last.get("check")))
        else:  # k of N
            status = Text(f"{numbers['done']}/{score.planned} done",
                          style="green" if numbers["done"] == score.planned else "red")
            check = Text(f"{numbers['passed']}/{score.planned} pass",
                         style="green" if numbers["passed"] == score.planned else "red")
        steps = "" if numbers["median_steps"] is None else f"{numbers['median_steps']:g}"
        table.add_row(score.id, status, *([check] if checked else []), steps,
                      f"${numbers['cost_usd']:.4f}" if score.attempts else "", _duration(numbers["median_seconds"]),
                      preview(score.last.get("answer") or score.last.get("message") or ""))
    return table


def comparison_table(folders: list[tuple[str, list[Score]]]):
    """Several result folders side by side (the same suite on two models): pass, cost, steps, calls and time per
    objective and in all. Columns are numbered by folder; the caption names the folders."""
    from rich.table import Table

    table = Table(title="batch comparison", box=None, header_style="bold", caption_justify="left",
                  caption="  ".join(f"[{number}] {label}" for number, (label, _) in enumerate(folders, start=1)))
    table.add_column("id", no_wrap=True)
    for number in range(1, len(folders) + 1):
        for metric in ("pass", "cost", "steps", "calls", "time"):
            table.add_column(f"[{number}] {metric}", justify="right", no_wrap=True)
    ids = list(dict.fromkeys(s.id for _, found in folders for s in found))
    by_folder = [{s.id: s for s in found} for _, found in folders]
    for id_ in ids:
        cells = []
        for found in by_folder:
            score = found.get(id_)
            cells += _figure_cells(figures(score.attempts, score.planned)) if score else [""] * 5
        table.add_row(id_, *cells)
    table.add_section()
    table.add_row("all", *[cell for _, found in folders for cell in _figure_cells(totals(found), rate=True)])
    return table


def _figure_cells(numbers: dict, rate: bool = False) -> list[str]:
    passed = f"{numbers['passed']}/{numbers['runs']}" + (f" {_percent(numbers['pass_rate'])}" if rate else "")
    steps = "" if numbers["median_steps"] is None else f"{numbers['median_steps']:g}"
    return [passed, f"${numbers['cost_usd']:.4f}", steps, str(numbers["llm_calls"]),
            _duration(numbers["median_seconds"])]


def report(folders: list[str], as_json: bool = False, home: Path | None = None) -> int:
    """`miniagi batch report DIR [DIR…]`."""
    import sys

    key = results_key(home) if home is not None else None
    found = []
    for folder in folders:
        path = results_file(Path(folder))
        try:
            records, _ = read_results(path)
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
        records, left_out = shown(records, key)
        if left_out:
            print(f"miniagi: {path}: {left_out} lines that no batch of this home wrote are left out", file=sys.stderr)
        found.append((folder, scores(latest(records))))
    if as_json:
        print(json.dumps({"folders": [{"results": str(results_file(Path(folder))),
                                       "objectives": [s.to_dict() for s in folder_scores],
                                       "total": totals(folder_scores)} for folder, folder_scores in found]},
                         ensure_ascii=False))
        return 0
    console = pipe_console()
    if len(found) == 1:
        folder, folder_scores = found[0]
        print_table(console, summary_table(folder_scores, title=f"batch summary: {results_file(Path(folder))}"))
        console.print(summary_line(totals(folder_scores)))
    else:
        print_table(console, comparison_table(found))
    return 0


class PipeConsole(Console):
    """A console whose reader may leave (`… | head`): what follows is dropped and the command goes on to its end and
    its own exit code (rich's console would exit 1 at the first line nobody reads, leaving a batch half run)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True


def pipe_console(stderr: bool = False) -> PipeConsole:
    """Into a file or a pipe, lines are not wrapped (as ui.make_console)."""
    console = PipeConsole(stderr=stderr, highlight=False)
    console.soft_wrap = not console.is_terminal
    return console


def print_table(console, table) -> None:
    """Into a file or a pipe, whole rows: a table is not squeezed to the 80 columns of a console with no width."""
    if not console.is_terminal:
        from rich.measure import Measurement

        console.width = max(console.width, Measurement.get(console, console.options.update_width(1000), table).maximum)
    console.print(table)


# --- the batches a home knows -------------------------------------------------------------------------------------
def batch_key(results_path: Path) -> str:
    return hashlib.sha1(str(results_path.resolve()).encode()).hexdigest()[:12]


def register_batch(home: Path, source: Path, results_path: Path, objectives: int, repeat: int) -> None:
    """Note a starting batch in the home (one record per results file, replaced by each rerun)."""
    folder = home / "batches"
    folder.mkdir(parents=True, exist_ok=True)
    key = batch_key(results_path)
    record = {"key": key, "file": str(source.resolve()), "results": str(results_path.resolve()),
              "started_at": now_iso(), "objectives": objectives, "repeat": repeat}
    partial = folder / f".{key}.json.partial"
    partial.write_text(json.dumps(record, ensure_ascii=False), encoding="utf-8")
    os.replace(partial, folder / f"{key}.json")


def known_batches(home: Path) -> list[dict]:
    """The batches recorded in the home, newest first. A record that is not one (anything in that folder may have
    been written by code the agent ran) is passed over."""
    found = []
    folder = home / "batches"
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return []
    for entry in entries:
        if not BATCH_KEY.fullmatch(entry.stem) or entry.suffix != ".json":
            continue
        try:
            record = json.loads(read_bounded(entry, RECORD_MAX_BYTES)[0])
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and isinstance(record.get("results"), str):
            found.append({**record, "key": entry.stem})
    return sorted(found, key=lambda r: str(r.get("started_at") or ""), reverse=True)


def known_batch(home: Path, key: str) -> dict | None:
    return next((b for b in known_batches(home) if b["key"] == key), None) if BATCH_KEY.fullmatch(key) else None
