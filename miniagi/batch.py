"""`miniagi batch FILE`: many objectives, unattended, in parallel worker processes — and whether each succeeded.

Each objective is its own `miniagi run` process (its own process group), so one objective's crash, hang or limit
never touches another. A .jsonl line may carry a `setup` (a folder copied into, or a shell command run in, a fresh
work directory DIR/work/ID), a `check` (a shell command run in the work directory after the run: exit 0 is a pass)
and an `expect` (a regular expression the final answer must match). `--repeat N` runs each objective N times.
DIR/results.jsonl gets a line per objective and repeat as each finishes; running the same command again skips what
is done and retries the rest. The sums (live line, closing table, `batch report`) are in batch_report.py.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

from rich.console import Console
from rich.text import Text

from memory.jsonl import json_lines

from . import safefs
from .batch_report import (
    figures,
    latest_results,
    pipe_console,
    preview,
    print_table,
    register_batch,
    results_key,
    scores,
    sign,
    succeeded,
    summary_line,
    summary_table,
    totals,
)
from .config import OPTIONS_BY_NAME, ConfigError, Settings, read_settings_files, resolve_settings
from .redaction import Redactor, redact_data
from .run_store import miniagi_command, now_iso

RESUMABLE = ("limit", "interrupted")
LINE_KEYS = ("id", "objective", "check", "expect", "setup")  # a .jsonl line's own keys; the rest are run options
CHECK_OUTPUT_CHARS = 4000  # of a check's (or a failed setup's) output, kept in results.jsonl


@dataclass(frozen=True)
class Objective:
    id: str
    objective: str
    overrides: dict = field(default_factory=dict)
    problem: str = ""  # why this objective cannot run (a bad line): it fails alone, with its own results line
    check: str | None = None
    expect: str | None = None
    setup_dir: str | None = None  # a folder copied into a fresh work directory before each run…
    setup_command: str | None = None  # …or a shell command run in it
    line: int = 0

    @property
    def checked(self) -> bool:
        return self.check is not None or self.expect is not None

    @property
    def fresh_workdir(self) -> bool:
        return self.setup_dir is not None or self.setup_command is not None


def read_objectives(path: Path) -> list[Objective]:
    """A .txt file (one objective per line; blank lines and # comments skipped; the id is the line number) or a
    .jsonl file ({"id": …, "objective": …, "check", "expect", "setup", and run options by their long names with
    underscores}). A line that cannot run becomes an objective with a `problem`: it fails alone."""
    if not path.is_file():
        raise ConfigError(f"no such file: {path}")
    suffix = path.suffix.lower()
    if suffix not in (".txt", ".jsonl"):
        raise ConfigError(f"{path}: a batch file is .txt (one objective per line) or .jsonl")
    try:
        lines = path.read_text(encoding="utf-8").split("\n")  # not splitlines: U+2028 may sit in a string
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    objectives: list[Objective] = []
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or (suffix == ".txt" and text.startswith("#")):
            continue
        objectives.append(Objective(str(number), text, line=number) if suffix == ".txt"
                          else _objective_of_line(path, number, text))
    first_line: dict[str, int] = {}
    clashes = []
    for objective in objectives:
        if objective.id in first_line:
            clashes.append(f"the id {objective.id!r} is on lines {first_line[objective.id]} and {objective.line}")
        first_line.setdefault(objective.id, objective.line)
    if clashes:
        raise ConfigError(f"{path}: " + "; ".join(clashes) + " (each id names its results: make them unique)")
    if not objectives:
        raise ConfigError(f"{path} holds no objectives")
    return objectives


def judge_lines(path: Path, objectives: list[Objective], settings: Settings, ui) -> list[Objective]:
    """The objectives of a batch file that code could have written (it lies where code has run: a batch with
    `--workdir .` runs beside it), as trust.py's one rule has them: a line whose run options are wider than the
    user's own (`settings`: a trust.WIDENING option, another work directory, a looser limit) runs only once the
    user said yes to it at the terminal; with no one to ask, it fails alone, saying why. So does a line whose setup
    folder lies out of code's reach (the batch copies it where code runs). The others run."""
    from .trust import TrustRecord, narrowed

    record = TrustRecord()
    if not record.writable_by_code(path):
        return objectives
    wider: dict[str, str] = {}  # objective id → what it widens
    for objective in objectives:
        if objective.problem or not (objective.overrides or objective.setup_dir):
            continue
        line_settings = settings.with_overrides(objective.overrides)
        _, differences = narrowed(line_settings, settings)
        if "workdir" in objective.overrides and line_settings.workdir_path != settings.workdir_path \
                and not record.in_reach(str(line_settings.workdir_path)):  # (where code already writes: no wider)
            differences["workdir"] = f"--workdir {line_settings.workdir}"
        if objective.setup_dir and not record.in_reach(objective.setup_dir):  # copied, outside the sandbox, to code
            differences["setup"] = f"setup {objective.setup_dir} (a folder code has not run in, copied where it runs)"
        if differences:
            wider[objective.id] = ", ".join(differences.values())
    facts = {f"line {objective.id}": _line_digest(objective) for objective in objectives if objective.id in wider}
    unconfirmed = set(record.judge(path, facts, new_is_trusted=False))
    if not unconfirmed:
        return objectives
    shown = [objective for objective in objectives if f"line {objective.id}" in unconfirmed]
    what = (f"{path} can be written by code that runs where it lies, and these lines run with options wider than "
            "yours:\n" + "\n".join(f"  line {o.line} ({o.id}): {wider[o.id]}" for o in shown))
    if getattr(ui, "interactive", False) and ui.confirm(f"{what}\nRun them so?"):
        record.remember(path, facts)
        record.save()
        return objectives
    why = ("not confirmed" if getattr(ui, "interactive", False)
           else "confirm it by running the batch in a terminal")
    return [replace(objective, problem=f"{path}:{objective.line}: {wider[objective.id]}: wider than your options, "
                                       f"in a file code can write ({why})") if objective in shown else objective
            for objective in objectives]


def _line_digest(objective: Objective) -> str:
    line = {"objective": objective.objective, "check": objective.check, "expect": objective.expect,
            "setup": objective.setup_dir or objective.setup_command, **objective.overrides}
    return hashlib.sha256(json.dumps(line, sort_keys=True).encode()).hexdigest()


def _objective_of_line(path: Path, number: int, text: str) -> Objective:
    where = f"{path}:{number}"
    try:
        data = json.loads(text)
    except ValueError as exc:
        return Objective(str(number), "", problem=f"{where}: not JSON ({exc})", line=number)
    if not isinstance(data, dict):
        return Objective(str(number), "", line=number,
                         problem=f'{where}: a line is one JSON object: {{"id": …, "objective": …}}')
    id_, objective = str(data.get("id", number)), str(data.get("objective") or "").strip()
    overrides = {k: v for k, v in data.items() if k not in LINE_KEYS}
    problem = _line_problem(data, objective, overrides)
    if problem:
        return Objective(id_, objective, problem=f"{where}: {problem}", line=number)
    setup = data.get("setup")
    folder = path.parent / setup if setup else None  # relative to the batch file, so a suite runs from anywhere
    is_folder = folder is not None and folder.is_dir()
    return Objective(id_, objective, overrides, check=data.get("check"), expect=data.get("expect"),
                     setup_dir=str(folder.resolve()) if is_folder else None,
                     setup_command=setup if setup and not is_folder else None, line=number)


def _line_problem(data: dict, objective: str, overrides: dict) -> str:
    if not objective:
        return 'each line needs an "objective"'
    for key in ("check", "expect", "setup"):
        if key in data and not (isinstance(data[key], str) and data[key].strip()):
            return f'"{key}" must be a non-empty string'
    for key in overrides:
        if key not in OPTIONS_BY_NAME:
            close = difflib.get_close_matches(key, [*OPTIONS_BY_NAME, *LINE_KEYS], n=1, cutoff=0.6)
            return (f"unknown option {key!r} (did you mean {close[0]}?)" if close else
                    f"unknown option {key!r} (a line holds id, objective, check, expect, setup and the long names "
                    f"of `miniagi run`'s options, with underscores: {', '.join(OPTIONS_BY_NAME)})")
    if "expect" in data:
        try:
            re.compile(data["expect"], re.MULTILINE)
        except re.error as exc:
            return f'"expect" is not a regular expression: {exc}'
    if "setup" in data and "workdir" in overrides:
        return '"setup" makes a fresh work directory for the objective: leave out "workdir"'
    try:
        Settings().with_overrides(overrides)
    except ConfigError as exc:
        return str(exc)
    return ""


def _env_value(value) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def attempt_name(objective_id: str, repeat: int) -> str:
    """The file-system name of one attempt (logs/NAME.log, work/NAME): the id, and @N for repeats after the first
    (`@` is never in a safe id, so names cannot clash)."""
    return _safe(objective_id) + (f"@{repeat}" if repeat else "")


class Batch:
    def __init__(self, objectives: list[Objective], out: Path, *, workers: int, options: dict,
                 max_batch_cost: float | None, timeout_s: float | None, repeat: int = 1,
                 home: Path | None = None, source: Path | None = None, console: Console | None = None,
                 cluster: "RayCluster | None" = None):
        self.cluster = cluster
        self.objectives = objectives
        self.out = out
        self.results_path = out / "results.jsonl"
        self.logs = out / "logs"
        self.workers = max(1, workers)
        self.repeat = max(1, repeat)
        self.home = home
        self.source = source
        self.options = options  # run options given to `miniagi batch`, under each objective's own
        self.max_batch_cost = max_batch_cost
        self.timeout_s = timeout_s
        # `miniagi batch … 2>&1 | head` goes on, quietly, to its end and its exit code
        self.console = console or pipe_console(stderr=True)
        self.lock = threading.Lock()
        self.running: dict[tuple[str, int], object] = {}  # a process here, a Ray task reference there
        self.finished: dict[tuple[str, int], dict] = {}
        self.spent = 0.0
        self.stopping = False
        self.previous: dict[tuple[str, int], dict] = {}  # the results of an earlier run of this batch
        self.redact = Redactor(os.environ, read_settings_files())  # results and logs: the gate of a run's files
        # the lines this batch writes are signed with the home's key: a rerun takes only those as done
        self.key = results_key(home) if home is not None else None
        # an objective works in a folder of its own (DIR/work/NAME) unless --workdir or its line names one: never
        # in the folder that holds the results (see _workdir)
        self.own_workdirs = not options.get("workdir")
        self._out_fd: int | None = None  # DIR, opened once, never through a link: every file here is written via it

    # --- one attempt ----------------------------------------------------------------------------------------------
    def _option_env(self, objective: Objective, workdir: Path | None) -> dict[str, str]:
        """The run options of this objective, as the environment variables `miniagi run` reads."""
        env = {OPTIONS_BY_NAME[name].env: _env_value(value)
               for name, value in {**self.options, **objective.overrides}.items() if value is not None}
        if workdir is not None:
            env["MINIAGI_WORKDIR"] = str(workdir)
        env["MINIAGI_UNATTENDED"] = "true"  # batch runs never wait for a person
        return env

    def _workdir(self, objective: Objective, repeat: int) -> Path | None:
        """DIR/work/NAME: with a setup, and for every objective whose work directory nobody named (a .txt batch's
        objectives, say), so that what code writes stays beside, never inside, the batch's results and logs."""
        own = objective.fresh_workdir or (self.own_workdirs and "workdir" not in objective.overrides)
        # (only the results folder resolved: a link code put in place of DIR/work is refused, not followed)
        return self.out.resolve() / "work" / attempt_name(objective.id, repeat) if own else None

    def _out_dir(self) -> int:
        with self.lock:
            if self._out_fd is None:
                self._out_fd = safefs.open_dir(self.out)
            return self._out_fd

    def _run_one(self, objective: Objective, repeat: int) -> dict:
        if objective.problem:  # a bad line: this objective fails alone, the others run
            return self._record(self._failed(objective, repeat, objective.problem))
        try:
            return self._run_attempt(objective, repeat)
        except Exception as exc:  # whatever goes wrong with one objective stays with it
            return self._record(self._failed(objective, repeat, f"{type(exc).__name__}: {exc}"))

    def _failed(self, objective: Objective, repeat: int, message: str) -> dict:
        return {"id": objective.id, "objective": objective.objective, "repeat": repeat, "status": "error",
                "answer": None, "run_id": None, "steps": 0, "llm_calls": 0, "cost_usd": 0.0, "exit_code": None,
                "message": message, "finished_at": now_iso()}

    def _resumable(self, objective: Objective, repeat: int) -> str | None:
        """The run to continue instead of starting over: the last one of this attempt, stopped by a limit or
        interrupted (a rerun with a higher --max-steps goes on where it stopped, in the same work directory)."""
        last = self.previous.get((objective.id, repeat)) or {}
        if last.get("objective") == objective.objective and last.get("status") in RESUMABLE and last.get("run_id"):
            return last["run_id"]
        return None

    def _run_attempt(self, objective: Objective, repeat: int) -> dict:
        key = (objective.id, repeat)
        workdir = self._workdir(objective, repeat)
        attempt = Attempt(objective.objective, self._option_env(objective, workdir), self.timeout_s,
                          self._resumable(objective, repeat), str(workdir) if workdir else None, objective.setup_dir,
                          objective.setup_command, objective.check, objective.expect)
        started = time.monotonic()
        if self.cluster is not None:  # on whichever node of the Ray cluster has room
            reference = self.cluster.submit(attempt)
            with self.lock:
                self.running[key] = reference
            try:
                outcome = self.cluster.wait(reference)
            finally:
                with self.lock:
                    self.running.pop(key, None)
        else:
            outcome = carry_out(attempt, os.environ, on_start=lambda process: self._started(key, process),
                                on_end=lambda: self._ended(key), stopping=lambda: self.stopping)
        log_path = self.logs / f"{attempt_name(objective.id, repeat)}.log"
        logs = safefs.sub_dir(self._out_dir(), "logs")  # never through a link code may have put there
        try:
            safefs.replace_file(logs, log_path.name, self.redact(outcome.stderr).encode("utf-8", "replace"))
        finally:
            os.close(logs)
        summary = outcome.summary
        message = ""
        if outcome.setup_problem:
            message = f"setup failed: {outcome.setup_problem}"
        elif outcome.timed_out:
            message = f"stopped after the batch's --timeout of {self.timeout_s:g} s"
        elif not summary:
            said = [line for line in outcome.stderr.strip().splitlines() if line.strip()]
            message = (f"the run ended without a result (exit {outcome.returncode})"
                       + (f": {said[-1].strip()}" if said else "") + f"; see {log_path}")
        status = "error" if outcome.timed_out or outcome.setup_problem else summary.get("status", "error")
        if not summary and not outcome.setup_problem and (self.stopping
                                                          or outcome.returncode in (130, -signal.SIGINT)):
            status = "interrupted"  # stopped (by our Ctrl-C) before it could say more, even while starting
        record = {"id": objective.id, "objective": objective.objective, "repeat": repeat, "status": status,
                  "answer": summary.get("answer"), "run_id": summary.get("run_id"),
                  "steps": summary.get("steps", 0), "llm_calls": summary.get("llm_calls", 0),
                  "cost_usd": summary.get("cost_usd", 0.0), "exit_code": outcome.returncode,
                  "message": message or summary.get("message", ""), "seconds": round(time.monotonic() - started, 2),
                  "finished_at": now_iso()}
        if objective.checked:
            record["check"], record["check_output"] = outcome.check, outcome.check_output
        if workdir is not None:
            record["workdir"] = str(workdir)
        if self.cluster is not None:
            record["node"] = outcome.node
        return self._record(record)

    def _started(self, key: tuple[str, int], process: subprocess.Popen) -> None:
        with self.lock:
            self.running[key] = process
            stopping = self.stopping
        if stopping:  # Ctrl-C came while this process was being started (before it was known): it stops too
            try:
                os.killpg(process.pid, signal.SIGINT)
            except OSError:
                pass

    def _ended(self, key: tuple[str, int]) -> None:
        with self.lock:
            self.running.pop(key, None)

    def _record(self, record: dict) -> dict:
        key = (record["id"], record["repeat"])
        record = redact_data(self.redact, record)
        if self.key is not None:
            record = sign(record, self.key)
        out = self._out_dir()
        with self.lock:
            safefs.append(out, self.results_path.name,
                          (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8", "surrogatepass"))
            self.finished[key] = record
            self.spent += record.get("cost_usd") or 0.0
        name = record["id"] + (f" #{record['repeat']}" if self.repeat > 1 else "")
        check = record.get("check")
        self.console.print(Text.assemble((f"{name} ", "bold"), (record["status"], "green" if record["status"] == "done"
                                                                else "red"),
                                         (f" check {check}" if check else "", "green" if check == "pass" else "red"),
                                         (f"  {record['steps']} steps · ${record['cost_usd'] or 0:.4f}  ", "dim"),
                                         preview(record.get("answer") or record.get("message") or "")))
        return record

    # --- the batch ------------------------------------------------------------------------------------------------
    def _complete(self, objective: Objective, repeat: int) -> bool:
        """Done in an earlier run of this batch, for this objective text (with a check when it now has one)."""
        last = self.previous.get((objective.id, repeat)) or {}
        return (last.get("status") == "done" and last.get("objective") == objective.objective
                and ("check" in last) == objective.checked)

    def run(self) -> int:
        try:
            return self._run()
        finally:
            if self._out_fd is not None:
                os.close(self._out_fd)
                self._out_fd = None

    def _run(self) -> int:
        self.previous = latest_results(self.results_path, self.key)
        attempts = [(o, r) for r in range(self.repeat) for o in self.objectives]
        todo = [(o, r) for o, r in attempts if not self._complete(o, r)]
        if self.home is not None and self.source is not None:  # so the UI lists it
            register_batch(self.home, self.source, self.results_path, len(self.objectives), self.repeat)
        times = f" × {self.repeat} repeats" if self.repeat > 1 else ""
        self.console.print(f"[bold]batch[/] {len(self.objectives)} objectives{times} · "
                           f"{len(attempts) - len(todo)} already done · {len(todo)} to run on {self.workers} "
                           f"workers · results in {self.results_path}"
                           + (f" · work directories in {self.out.resolve() / 'work'} (one per objective)"
                              if self.own_workdirs else ""))
        for objective in self.objectives:  # every bad line at once, before anything runs
            if objective.problem:
                self.console.print(f"[red]{objective.problem}[/] (this objective fails alone)", markup=True,
                                   highlight=False)
        not_started: list[tuple[Objective, int]] = []
        interrupted = False
        pending: set[Future] = set()
        queue = list(todo)
        live = self.console.status("") if self.console.is_terminal else None  # a spinner with the counts
        if live:
            live.start()
        try:
            with ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="objective") as pool:
                try:
                    while queue or pending:
                        while queue and len(pending) < self.workers and not self.stopping:
                            if self.max_batch_cost is not None and self.spent >= self.max_batch_cost:
                                self.console.print(f"[yellow]batch cost cap ${self.max_batch_cost:g} reached "
                                                   f"(${self.spent:.4f} spent): no new objectives are started[/]")
                                not_started, queue = queue, []
                                break
                            pending.add(pool.submit(self._run_one, *queue.pop(0)))
                        if not pending:
                            break
                        if live:
                            live.update(self._progress_line(len(todo)))
                        done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                        for future in done:
                            future.result()
                except KeyboardInterrupt:  # inside the pool, so its shutdown does not wait for the objectives
                    with self.lock:  # from here, a process that _started registers is interrupted at once
                        interrupted = self.stopping = True
                    self.console.print("[yellow]interrupted: stopping the running objectives (their state is "
                                       "saved)…[/]")
                    self._interrupt_running()
                    wait(pending, timeout=60)
        finally:
            if live:
                live.stop()
        latest = {**self.previous, **self.finished}
        self._summary(latest, not_started)
        if interrupted:
            return 130
        return 0 if all(succeeded(latest.get((o.id, r))) for o, r in attempts) else 3

    def _interrupt_running(self) -> None:
        with self.lock:
            running = list(self.running.values())
        for handle in running:
            if self.cluster is not None:
                self.cluster.interrupt(handle)
                continue
            try:
                os.killpg(handle.pid, signal.SIGINT)
            except OSError:
                pass

    def _progress_line(self, total: int) -> str:
        """done, not done, running, waiting, then the pass rate, cost per pass and median steps so far."""
        with self.lock:
            finished = list(self.finished.values())
            running = len(self.running)
        numbers = figures(finished)
        return (f"{numbers['done']} done · {len(finished) - numbers['done']} not done · {running} running · "
                f"{total - len(finished) - running} waiting · " + summary_line({**numbers, "cost_usd": self.spent}))

    def _summary(self, latest: dict[tuple[str, int], dict], not_started: list[tuple[Objective, int]]) -> None:
        skipped = {(o.id, r) for o, r in not_started}
        found = {key: record for key, record in latest.items() if key not in skipped}
        summed = scores(found, [(o.id, o.objective) for o in self.objectives], self.repeat)
        print_table(self.console, summary_table(summed))
        self.console.print(f"{summary_line(totals(summed))} · ${self.spent:.4f} spent in this batch · "
                           f"results: {self.results_path}")


# --- one attempt, here or on a Ray node ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Attempt:
    """Everything a worker needs to carry out one attempt of one objective: prepare its work directory, run it,
    check it."""

    objective: str
    option_env: dict
    timeout_s: float | None
    resume: str | None = None  # the run to continue (a limit stopped it, or Ctrl-C)
    workdir: str | None = None  # a fresh work directory to prepare (the line has a setup)
    setup_dir: str | None = None
    setup_command: str | None = None
    check: str | None = None
    expect: str | None = None


@dataclass(frozen=True)
class ProcessResult:
    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool
    node: str = ""
    summary: dict = field(default_factory=dict)  # the run's --json result
    check: str | None = None  # pass | fail | error
    check_output: str = ""
    setup_problem: str = ""


def carry_out(attempt: Attempt, environ: Mapping[str, str], on_start=None, on_end=None,
              stopping=lambda: False) -> ProcessResult:
    """Prepare the work directory (fresh, unless a stopped run goes on in it), run the objective, check it."""
    import socket

    env = {**environ, **attempt.option_env}
    if attempt.workdir and not attempt.resume:
        problem = prepare_workdir(attempt, env)
        if problem:
            return ProcessResult("", "", None, False, socket.gethostname(), setup_problem=problem,
                           check="error" if attempt.check or attempt.expect else None,
                           check_output="not run: the setup failed")
    outcome = run_objective(attempt.objective, env, attempt.timeout_s, on_start=on_start, on_end=on_end,
                            resume=attempt.resume)
    summary = _last_json(outcome.stdout)
    outcome = replace(outcome, summary=summary)
    if not (attempt.check or attempt.expect):
        return outcome
    if outcome.timed_out or stopping():
        return replace(outcome, check="fail", check_output="not run: the run was stopped")
    if summary.get("status") != "done":
        return replace(outcome, check="fail",
                       check_output=f"not run: the run ended {summary.get('status') or 'without a result'}")
    return replace(outcome, **judge(attempt, summary.get("answer") or "", env))


def judge(attempt: Attempt, answer: str, env: Mapping[str, str]) -> dict:
    """The check (exit 0: pass; a timeout, a signal, or a command that cannot be found or run: error) and the
    expected answer (a regular expression searched for, ^ and $ at every line)."""
    verdicts, said = [], []
    if attempt.check:
        code, output = run_check(attempt.check, env)
        verdicts.append("pass" if code == 0 else "error" if code in (None, 126, 127) else "fail")
        said.append(output)
    if attempt.expect:
        matched = re.search(attempt.expect, answer, re.MULTILINE) is not None
        verdicts.append("pass" if matched else "fail")
        if not matched:
            said.append(f"the answer does not match expect {attempt.expect!r}")
    verdict = "error" if "error" in verdicts else "fail" if "fail" in verdicts else "pass"
    return {"check": verdict, "check_output": "\n".join(said)[-CHECK_OUTPUT_CHARS:]}


def prepare_workdir(attempt: Attempt, env: Mapping[str, str]) -> str:
    """A fresh work directory for one attempt — emptied, then the setup folder copied in or the setup command run
    there. '' when it is ready, else what went wrong."""
    workdir = Path(attempt.workdir)
    problem = _emptied(workdir)  # a rerun starts clean
    if problem:
        return problem
    if not attempt.setup_dir and not attempt.setup_command:  # a work directory of its own, empty
        workdir.mkdir()
        return ""
    if attempt.setup_dir:
        source = Path(attempt.setup_dir)
        if workdir.is_relative_to(source):
            return f"the setup folder {source} holds the batch's results folder: copy a folder beside it"
        try:
            shutil.copytree(source, workdir, symlinks=True)
        except (OSError, shutil.Error) as exc:
            return f"cannot copy {source}: {exc}"
        return ""
    workdir.mkdir()
    code, output = run_check(attempt.setup_command, env)
    return "" if code == 0 else f"the command {attempt.setup_command!r} failed: {preview(output, 400)}"


def _emptied(workdir: Path) -> str:
    """DIR/work/NAME removed, through folder descriptors opened without following a link on the way: DIR/work lies
    where code may reach (beside the batch file), and a link there must not send the removal elsewhere. '' when
    done, else why not."""
    try:
        results = safefs.open_dir(workdir.parent.parent)  # (made when missing; resolved when the batch began)
        try:
            work = safefs.sub_dir(results, workdir.parent.name)
        finally:
            os.close(results)
    except OSError as exc:
        return f"{workdir.parent} cannot be used: a link, or no folder ({exc.strerror})"
    try:
        if sys.version_info >= (3, 11):
            shutil.rmtree(workdir.name, dir_fd=work, ignore_errors=True)
        else:  # (no dir_fd before 3.11: the same folder, by its descriptor's name)
            shutil.rmtree(f"/proc/self/fd/{work}/{workdir.name}", ignore_errors=True)
        try:
            os.lstat(workdir.name, dir_fd=work)
            return f"{workdir} could not be emptied"
        except FileNotFoundError:
            return ""
    finally:
        os.close(work)


def run_check(command: str, environ: Mapping[str, str]) -> tuple[int | None, str]:
    """A check or setup command, run in the attempt's work directory as the model's execute_shell commands are:
    with the run options in `environ`, the same sandbox, limits and environment allow-list (the command is the
    user's, but it runs in a directory the model wrote). Its exit code (None when it did not end by itself: timed
    out, killed) and its output, bounded."""
    from .execution.runner import run_command

    settings = resolve_settings({}, environ=environ)
    result = run_command(command, settings, environ, CHECK_OUTPUT_CHARS)
    exited = re.fullmatch(r"exit code (\d+)", result.note)
    return (int(exited.group(1)) if exited else None), result.observation()


def run_objective(objective: str, env: dict, timeout_s: float | None, on_start=None, on_end=None,
                  resume: str | None = None) -> ProcessResult:
    """One objective as its own `miniagi run` (or `miniagi resume RUN_ID`) process, in its own process group.
    Here or on a Ray node."""
    import socket

    # the objective goes in on stdin (`run -`): no limit on its size, and any text at all can be carried;
    # a resumed run takes the batch's options as flags (its recorded settings would win over the environment)
    command = ["resume", resume, "--json", *_option_flags(env)] if resume else ["run", "--json", "-"]
    process = subprocess.Popen(miniagi_command(*command), env=env,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               encoding="utf-8", errors="replace", start_new_session=True)
    if on_start:
        on_start(process)
    timed_out = False
    try:
        try:
            stdout, stderr = process.communicate("" if resume else objective, timeout=timeout_s)
        except (subprocess.TimeoutExpired, KeyboardInterrupt) as stop:  # a timeout, or a cancelled Ray task
            timed_out = isinstance(stop, subprocess.TimeoutExpired)
            os.killpg(process.pid, signal.SIGINT)  # let it save its state, then insist
            try:
                stdout, stderr = process.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                stdout, stderr = process.communicate()
    finally:
        if on_end:
            on_end()
    return ProcessResult(stdout, stderr, process.returncode, timed_out, socket.gethostname())


class RayCluster:
    """Objectives spread over a Ray cluster (`pip install 'miniagi[distributed]'`): each runs as the same
    `miniagi run` process, on a node that has miniagi installed and its own model endpoint settings
    (OPENAI_API_KEY / OPENAI_BASE_URL are never sent over the cluster; run options are)."""

    def __init__(self, address: str):
        if address == "local":  # our own instance: token authentication as Ray's default, without its notice
            os.environ.setdefault("RAY_AUTH_MODE", "token")  # (before the import: Ray reads it once)
        try:
            import ray
        except ImportError:
            raise ConfigError("--ray needs Ray: pip install 'miniagi[distributed]'") from None
        self.ray = ray
        # "local" starts a Ray instance on this machine; anything else joins a cluster ("auto", "ray://host:10001")
        ray.init(address=None if address == "local" else address, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
        self.remote = ray.remote(num_cpus=1, max_retries=0)(run_on_node)

    def submit(self, attempt: Attempt):
        return self.remote.remote(attempt)

    def wait(self, reference) -> ProcessResult:
        try:
            return self.ray.get(reference)
        except self.ray.exceptions.TaskCancelledError:
            return ProcessResult("", "cancelled by the batch (Ctrl-C)", None, False)
        except self.ray.exceptions.RayError as exc:
            return ProcessResult("", f"the Ray task failed: {exc}", None, False)

    def interrupt(self, reference) -> None:
        self.ray.cancel(reference)  # KeyboardInterrupt in the task: the run saves its state

    def close(self) -> None:
        self.ray.shutdown()


def run_on_node(attempt: Attempt) -> ProcessResult:
    """A Ray task: the attempt is carried out with the node's own environment plus the batch's run options (a
    setup folder and the results folder must be on a file system the nodes share)."""
    return carry_out(attempt, os.environ)


def _option_flags(env: dict) -> list[str]:
    """The batch's run options (MINIAGI_* in env) as `miniagi resume` flags."""
    flags: list[str] = []
    for option in OPTIONS_BY_NAME.values():
        value = env.get(option.env)
        if value is None or option.name in ("unattended",):
            continue
        if option.boolean:
            if option.negatable:
                flags.append(option.flag if value == "true" else f"--no-{option.flag[2:]}")
            elif value == "true":
                flags.append(option.flag)
        else:
            flags += [option.flag, value]
    return flags


def _safe(name: str) -> str:
    """A file name for an id; ids that had to change get a short hash, so two ids never share a name."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:80].lstrip(".")
    if safe != name:
        safe = f"{safe or 'objective'}-{hashlib.sha1(name.encode()).hexdigest()[:6]}"
    return safe


def _last_json(stdout: str) -> dict:
    lines = reversed((stdout or "").strip().split("\n"))  # not splitlines: U+2028 may sit in the answer
    return next((value for value in json_lines(lines) if isinstance(value, dict)), {})
