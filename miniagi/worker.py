"""The persistent Python worker: one per run, like a notebook kernel.

Started by `PythonSession` as `python -u -m miniagi.worker REQUEST_FD RESPONSE_FD`. It reads one JSON request per
line ({"code", "output", "label"}), runs the code in a namespace that persists between requests with fds 1 and 2
pointed at the output file (so output of child processes is captured too), and answers with one JSON line
({"status": "ok" | "error" | "exit" | "interrupted", "detail"}). It imports nothing of miniagi, so the user's
code runs in a clean interpreter.
"""

import ast
import json
import linecache
import os
import resource
import signal
import sys
import traceback

WORKER_PID = os.getpid()
forked = False  # whether the running snippet called os.fork(): only then can copies of this worker be left over


def _note_fork() -> None:
    global forked
    forked = True


os.register_at_fork(after_in_parent=_note_fork)


class CPUTimeExceeded(BaseException):
    """The snippet used up its CPU time (RLIMIT_CPU): raised by the SIGXCPU handler."""


def apply_limits(settings: dict) -> None:
    """Lower this process's limits (children inherit them) and join the run's pids cgroup."""
    if settings.get("cgroup_procs"):
        try:
            with open(settings["cgroup_procs"], "w") as procs:
                procs.write(str(os.getpid()))
        except OSError:
            pass
    for name, value in (("RLIMIT_DATA", settings.get("data_bytes")), ("RLIMIT_FSIZE", settings.get("file_bytes")),
                        ("RLIMIT_CORE", 0), ("RLIMIT_NPROC", settings.get("nproc"))):
        if value is None or not hasattr(resource, name):
            continue
        limit = getattr(resource, name)
        hard = resource.getrlimit(limit)[1]
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        try:
            resource.setrlimit(limit, (value, value))
        except (ValueError, OSError):
            pass
    try:  # die with the agent, even if it is SIGKILLed (Linux)
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def on_cpu_limit(signum, frame):
    raise CPUTimeExceeded


def cpu_budget(seconds):
    """Let the next snippet use `seconds` more CPU time (None: no limit)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    soft = resource.RLIM_INFINITY if seconds is None else int(usage.ru_utime + usage.ru_stime + seconds) + 1
    if hard != resource.RLIM_INFINITY:
        soft = hard if soft == resource.RLIM_INFINITY else min(soft, hard)
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    except (ValueError, OSError):
        pass


def run_code(code: str, label: str, namespace: dict) -> tuple[str, str]:
    try:
        tree = ast.parse(code, filename=label, mode="exec")
    except SyntaxError:
        sys.stderr.write("".join(traceback.format_exception_only(*sys.exc_info()[:2])))
        return "error", "SyntaxError"
    # show source lines in tracebacks, as a REPL does
    linecache.cache[label] = (len(code), None, code.splitlines(True), label)
    trailing = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        trailing = ast.Expression(tree.body.pop().value)
    try:
        exec(compile(tree, label, "exec"), namespace)
        if trailing is not None:
            value = eval(compile(trailing, label, "eval"), namespace)
            if value is not None:
                namespace["_"] = value
                print(repr(value))
        return "ok", ""
    except SystemExit as stop:
        print(f"SystemExit: {stop.code!r} (the code called sys.exit(); the Python session keeps its state)",
              file=sys.stderr)
        return "exit", repr(stop.code)
    except KeyboardInterrupt:
        print("KeyboardInterrupt", file=sys.stderr)
        return "interrupted", ""
    except CPUTimeExceeded:
        print("CPU time limit reached: the snippet was stopped (the Python session keeps its state)", file=sys.stderr)
        return "error", "CPUTimeExceeded"
    except BaseException as error:  # the user's exception is the observation, whatever it is
        tb = error.__traceback__.tb_next if error.__traceback__ else None  # drop this function's frame
        sys.stderr.write("".join(traceback.format_exception(type(error), error, tb)))
        return "error", type(error).__name__


def serve(request_fd: int, response_fd: int, limits: dict) -> None:
    requests = os.fdopen(request_fd, "r", encoding="utf-8")
    responses = os.fdopen(response_fd, "w", encoding="utf-8")
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    signal.signal(signal.SIGXCPU, on_cpu_limit)
    global forked
    for line in requests:
        request = json.loads(line)
        forked = False
        out = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        try:
            cpu_budget(limits.get("cpu_s"))
            status, detail = run_code(request["code"], request["label"], namespace)
            cpu_budget(None)
        except KeyboardInterrupt:  # arrived between statements of our own
            status, detail = "interrupted", ""
        if os.getpid() != WORKER_PID:  # a process the snippet forked came back here: it must not answer
            os._exit(0)
        sys.stdout.flush()
        sys.stderr.flush()
        responses.write(json.dumps({"status": status, "detail": detail, "forked": forked}) + "\n")
        responses.flush()


if __name__ == "__main__":
    sys.argv = [""]
    worker_limits = json.loads(os.environ.pop("MINIAGI_WORKER_LIMITS", "{}"))
    apply_limits(worker_limits)
    serve(int(os.environ.pop("MINIAGI_WORKER_REQUEST_FD")), int(os.environ.pop("MINIAGI_WORKER_RESPONSE_FD")),
          worker_limits)
