"""The UI's batch pages: the batches the home knows (each recorded in $MINIAGI_HOME/batches/ when it starts), and
one batch's latest result per objective — status, check, pass count, steps, cost, its answer or message — with the
batch's pass rate.

Nothing here takes a path from the request. The results file a record names is read only when it is a regular file
named results.jsonl, at most UI_MAX_BYTES of it (its end: the latest results), and the handlers are plain
functions, which Starlette runs in a thread: a slow disk never stalls the event loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from starlette.requests import Request
from starlette.routing import Route

from ..batch_report import (
    known_batch,
    known_batches,
    latest,
    read_results,
    results_key,
    scores,
    shown,
    summary_line,
    totals,
)

UI_MAX_BYTES = 16 * 2**20
MAX_LISTED = 100


def _summed(batch: dict, key: bytes | None = None) -> tuple[list[dict], dict | None, bool, str]:
    """(a row per objective, the totals, whether the file was cut, a problem) of a recorded batch: of its lines,
    those the home's batches signed (batch_report.shown)."""
    try:
        records, cut = read_results(Path(batch["results"]), UI_MAX_BYTES)
    except OSError as exc:
        return [], None, False, f"cannot read {batch['results']}: {exc.strerror or exc}"
    records = shown(records, key)[0]
    summed = scores(latest(records))
    rows = [{**score.to_dict(), "run_id": score.last.get("run_id"), "check_output": score.last.get("check_output"),
             "repeat": score.last.get("repeat", 0)} for score in summed]
    total = totals(summed)
    return rows, {**total, "line": summary_line(total)}, cut, ""


def batch_routes(home: Path, page: Callable) -> list[Route]:
    def batch_list(request: Request):
        rows = []
        for batch in known_batches(home)[:MAX_LISTED]:
            _, total, _, problem = _summed(batch, results_key(home))
            rows.append({**batch, "total": total, "problem": problem})
        return page("batches.html", batches=rows, home=str(home))

    def batch_view(request: Request):
        batch = known_batch(home, request.path_params["key"])
        if batch is None:
            return page("missing.html", _status=404,
                        message=f"no batch {request.path_params['key']!r} is recorded in {home}")
        rows, total, cut, problem = _summed(batch, results_key(home))
        return page("batch.html", batch=batch, rows=rows, total=total, cut=cut, problem=problem,
                    max_mb=UI_MAX_BYTES // 2**20)

    return [Route("/batch", batch_list), Route("/batch/{key}", batch_view)]
