"""`miniagi batch FILE`: many objectives, unattended, in parallel worker processes.

Each objective is its own `miniagi run` process (its own process group), so one objective's crash, hang or limit
never touches another. DIR/results.jsonl gets a line per objective as each finishes; running the same command
again skips the objectives whose latest result is `done` and retries the rest.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .config import OPTIONS_BY_NAME, ConfigError, Settings, read_dotenv
from .runs import now_iso
from .redaction import Redactor, redact_data
from .ui import make_console


RESUMABLE = ("limit", "interrupted")


@dataclass(frozen=True)
class Objective:
    id: str
    objective: str
    overrides: dict = field(default_factory=dict)
    problem: str = ""  # why this objective cannot run (a bad option): it fails alone, with its own results line


def read_objectives(path: Path) -> list[Objective]:
    """A .txt file (one objective per line; blank lines and # comments skipped; the id is the line number) or a
    .jsonl file ({"id": …, "objective": …, and run options by their long names with underscores})."""
    if not path.is_file():
        raise ConfigError(f"no such file: {path}")
    suffix = path.suffix.lower()
    if suffix not in (".txt", ".jsonl"):
        raise ConfigError(f"{path}: a batch file is .txt (one objective per line) or .jsonl")
    objectives: list[Objective] = []
    try:
        lines = path.read_text(encoding="utf-8").split("\n")  # not splitlines: U+2028 may sit in a string
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or (suffix == ".txt" and text.startswith("#")):
            continue
        if suffix == ".txt":
            objectives.append(Objective(str(number), text))
            continue
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"{path}:{number}: not JSON ({exc})") from None
        if not isinstance(data, dict) or not str(data.get("objective") or "").strip():
            raise ConfigError(f"{path}:{number}: each line needs an \"objective\"")
        overrides = {k: v for k, v in data.items() if k not in ("id", "objective")}
        unknown = [k for k in overrides if k not in OPTIONS_BY_NAME]
        problem = ""
        if unknown:
            problem = (f"{path}:{number}: unknown option {unknown[0]!r} (options are the long names of "
                       f"`miniagi run`, with underscores: {', '.join(OPTIONS_BY_NAME)})")
        else:
            try:
                Settings().with_overrides(overrides)
            except ConfigError as exc:
                problem = f"{path}:{number}: {exc}"
        objectives.append(Objective(str(data.get("id", number)), str(data["objective"]).strip(),
                                    {} if problem else overrides, problem))
    ids = [o.id for o in objectives]
    duplicate = next((i for i in ids if ids.count(i) > 1), None)
    if duplicate is not None:
        raise ConfigError(f"{path}: the id {duplicate!r} is used more than once")
    if not objectives:
        raise ConfigError(f"{path} holds no objectives")
    return objectives


def latest_results(results_path: Path) -> dict[str, dict]:
    latest: dict[str, dict] = {}
    if results_path.is_file():
        for line in results_path.read_text(encoding="utf-8").split("\n"):  # not splitlines: U+2028 may sit in a string
            try:
                record = json.loads(line)
                latest[str(record["id"])] = record
            except (ValueError, KeyError, TypeError):
                continue  # a line torn by a crash
    return latest


def _env_value(value) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


class Batch:
    def __init__(self, objectives: list[Objective], out: Path, *, workers: int, options: dict,
                 max_batch_cost: float | None, timeout_s: float | None, console: Console | None = None,
                 cluster: "RayCluster | None" = None):
        self.cluster = cluster
        self.objectives = objectives
        self.out = out
        self.results_path = out / "results.jsonl"
        self.logs = out / "logs"
        self.workers = max(1, workers)
        self.options = options  # run options given to `miniagi batch`, under each objective's own
        self.max_batch_cost = max_batch_cost
        self.timeout_s = timeout_s
        self.console = console or make_console(stderr=True)
        self.lock = threading.Lock()
        self.running: dict[str, subprocess.Popen] = {}
        self.finished: dict[str, dict] = {}
        self.spent = 0.0
        self.stopping = False
        self.previous: dict[str, dict] = {}  # the results of an earlier run of this batch
        self.redact = Redactor(os.environ, read_dotenv())  # results and logs pass the same gate as a run's files

    # --- one objective --------------------------------------------------------------------------------------------
    def _option_env(self, objective: Objective) -> dict[str, str]:
        """The run options of this objective, as the environment variables `miniagi run` reads."""
        env = {OPTIONS_BY_NAME[name].env: _env_value(value)
               for name, value in {**self.options, **objective.overrides}.items() if value is not None}
        env["MINIAGI_UNATTENDED"] = "true"  # batch runs never wait for a person
        return env

    def _run_one(self, objective: Objective) -> dict:
        if objective.problem:  # a bad option: this objective fails alone, the others run
            return self._record(self._failed(objective, objective.problem))
        try:
            return self._run_process(objective)
        except Exception as exc:  # whatever goes wrong with one objective stays with it
            return self._record(self._failed(objective, f"{type(exc).__name__}: {exc}"))

    def _failed(self, objective: Objective, message: str) -> dict:
        return {"id": objective.id, "objective": objective.objective, "status": "error", "answer": None,
                "run_id": None, "steps": 0, "cost_usd": 0.0, "exit_code": None, "message": message,
                "finished_at": now_iso()}

    def _resumable(self, objective: Objective) -> str | None:
        """The run to continue instead of starting over: the last one of this objective, stopped by a limit or
        interrupted (a rerun with a higher --max-steps goes on where it stopped)."""
        last = self.previous.get(objective.id) or {}
        if last.get("objective") == objective.objective and last.get("status") in RESUMABLE and last.get("run_id"):
            return last["run_id"]
        return None

    def _run_process(self, objective: Objective) -> dict:
        resume = self._resumable(objective)
        if self.cluster is not None:  # on whichever node of the Ray cluster has room
            reference = self.cluster.submit(objective.objective, self._option_env(objective), self.timeout_s, resume)
            with self.lock:
                self.running[objective.id] = reference
            try:
                outcome = self.cluster.wait(reference)
            finally:
                with self.lock:
                    self.running.pop(objective.id, None)
        else:
            outcome = run_objective(objective.objective, {**os.environ, **self._option_env(objective)},
                                    self.timeout_s, on_start=lambda process: self._started(objective, process),
                                    on_end=lambda: self._ended(objective), resume=resume)
        self.logs.mkdir(parents=True, exist_ok=True)
        log_path = self.logs / f"{_safe(objective.id)}.log"
        log_path.write_text(self.redact(outcome.stderr), encoding="utf-8")
        summary = _last_json(outcome.stdout)
        message = ""
        if outcome.timed_out:
            message = f"stopped after the batch's --timeout of {self.timeout_s:g} s"
        elif not summary:
            said = [line for line in outcome.stderr.strip().splitlines() if line.strip()]
            message = (f"the run ended without a result (exit {outcome.returncode})"
                       + (f": {said[-1].strip()}" if said else "") + f"; see {log_path}")
        status = "error" if outcome.timed_out else summary.get("status", "error")
        if not summary and (self.stopping or outcome.returncode in (130, -signal.SIGINT)):
            status = "interrupted"  # stopped (by our Ctrl-C) before it could say more, even while starting
        record = {"id": objective.id, "objective": objective.objective, "status": status,
                  "answer": summary.get("answer"), "run_id": summary.get("run_id"),
                  "steps": summary.get("steps", 0), "cost_usd": summary.get("cost_usd", 0.0),
                  "exit_code": outcome.returncode, "message": message or summary.get("message", ""),
                  "finished_at": now_iso()}
        if self.cluster is not None:
            record["node"] = outcome.node
        return self._record(record)

    def _started(self, objective: Objective, process: subprocess.Popen) -> None:
        with self.lock:
            self.running[objective.id] = process

    def _ended(self, objective: Objective) -> None:
        with self.lock:
            self.running.pop(objective.id, None)

    def _record(self, record: dict) -> dict:
        record = redact_data(self.redact, record)
        with self.lock:
            self.out.mkdir(parents=True, exist_ok=True)
            with open(self.results_path, "a", encoding="utf-8") as results:
                results.write(json.dumps(record, ensure_ascii=False) + "\n")
            self.finished[record["id"]] = record
            self.spent += record.get("cost_usd") or 0.0
        style = "green" if record["status"] == "done" else "red"
        self.console.print(Text.assemble((f"{record['id']} ", "bold"), (record["status"], style),
                                         (f"  {record['steps']} steps · ${record['cost_usd'] or 0:.4f}  ", "dim"),
                                         _preview(record.get("answer") or record.get("message") or "")))
        return record

    # --- the batch ------------------------------------------------------------------------------------------------
    def run(self) -> int:
        previous = self.previous = latest_results(self.results_path)
        todo = [o for o in self.objectives if not (previous.get(o.id, {}).get("status") == "done"
                                                  and previous[o.id].get("objective") == o.objective)]
        skipped = len(self.objectives) - len(todo)
        self.console.print(f"[bold]batch[/] {len(self.objectives)} objectives · {skipped} already done · "
                           f"{len(todo)} to run on {self.workers} workers · results in {self.results_path}")
        not_started: list[Objective] = []
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
                            pending.add(pool.submit(self._run_one, queue.pop(0)))
                        if not pending:
                            break
                        if live:
                            live.update(self._progress_line(len(todo)))
                        done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                        for future in done:
                            future.result()
                except KeyboardInterrupt:  # inside the pool, so its shutdown does not wait for the objectives
                    interrupted = self.stopping = True
                    self.console.print("[yellow]interrupted: stopping the running objectives (their state is "
                                       "saved)…[/]")
                    self._interrupt_running()
                    wait(pending, timeout=60)
        finally:
            if live:
                live.stop()
        latest = {**previous, **self.finished}
        self._summary(latest, not_started)
        if interrupted:
            return 130
        all_done = all(latest.get(o.id, {}).get("status") == "done" for o in self.objectives)
        return 0 if all_done else 3

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
        with self.lock:
            finished = list(self.finished.values())
            running = len(self.running)
        done = sum(r["status"] == "done" for r in finished)
        return (f"{done} done · {running} running · {len(finished) - done} not done · "
                f"{total - len(finished) - running} waiting · ${self.spent:.4f}")

    def _summary(self, latest: dict[str, dict], not_started: list[Objective]) -> None:
        table = Table(title="batch summary", box=None, header_style="bold")
        for column in ("id", "status", "steps", "cost", "answer / message"):
            table.add_column(column, overflow="ellipsis", no_wrap=column != "answer / message")
        skipped = {o.id for o in not_started}
        for objective in self.objectives:
            record = latest.get(objective.id)
            if objective.id in skipped or record is None:
                table.add_row(objective.id, Text("not started", style="yellow"), "", "", "")
                continue
            table.add_row(objective.id, Text(record["status"], style="green" if record["status"] == "done" else "red"),
                          str(record.get("steps", 0)), f"${record.get('cost_usd') or 0:.4f}",
                          _preview(record.get("answer") or record.get("message") or ""))
        self.console.print(table)
        done = sum(1 for o in self.objectives if latest.get(o.id, {}).get("status") == "done")
        self.console.print(f"{done}/{len(self.objectives)} done · ${self.spent:.4f} spent in this batch · "
                           f"results: {self.results_path}")


@dataclass(frozen=True)
class ProcessResult:
    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool
    node: str = ""


def run_objective(objective: str, env: dict, timeout_s: float | None, on_start=None, on_end=None,
                  resume: str | None = None) -> ProcessResult:
    """One objective as its own `miniagi run` (or `miniagi resume RUN_ID`) process, in its own process group.
    Here or on a Ray node."""
    import socket

    # the objective goes in on stdin (`run -`): no limit on its size, and any text at all can be carried;
    # a resumed run takes the batch's options as flags (its recorded settings would win over the environment)
    command = ["resume", resume, "--json", *_option_flags(env)] if resume else ["run", "--json", "-"]
    process = subprocess.Popen([sys.executable, "-m", "miniagi", *command], env=env,
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
        try:
            import ray
        except ImportError:
            raise ConfigError("--ray needs Ray: pip install 'miniagi[distributed]'") from None
        self.ray = ray
        # "local" starts a Ray instance on this machine; anything else joins a cluster ("auto", "ray://host:10001")
        ray.init(address=None if address == "local" else address, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
        self.remote = ray.remote(num_cpus=1, max_retries=0)(run_on_node)

    def submit(self, objective: str, option_env: dict, timeout_s: float | None, resume: str | None = None):
        return self.remote.remote(objective, option_env, timeout_s, resume)

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


def run_on_node(objective: str, option_env: dict, timeout_s: float | None, resume: str | None = None) -> ProcessResult:
    """A Ray task: the objective runs with the node's own environment plus the batch's run options."""
    return run_objective(objective, {**os.environ, **option_env}, timeout_s, resume=resume)


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


def _preview(text: str, width: int = 100) -> str:
    flat = " ".join(str(text).split())
    return flat[:width] + ("…" if len(flat) > width else "")


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:80] or "objective"


def _last_json(stdout: str) -> dict:
    for line in reversed((stdout or "").strip().splitlines()):
        try:
            value = json.loads(line)
            if isinstance(value, dict):
                return value
        except ValueError:
            continue
    return {}
