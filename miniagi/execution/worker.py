"""The persistent Python worker: one per run, like a notebook kernel.

Started by `PythonSession` as `python -I -u worker.py REQUEST_FD RESPONSE_FD OUTPUT_FD`, by path: isolated (-I),
so neither the work directory nor PYTHONPATH nor a user site can put a module of the same name as one of ours
(json.py, typing.py…) in front of it. It reads its set-up ({"limits", "tools"}) and then one JSON request per
line ({"code", "label"}), runs the code in a namespace that persists between requests with fds 1 and 2 on
OUTPUT_FD (a file the agent holds open and reads through its own descriptor, so output of child processes is
captured too), and answers with one JSON line ({"status": "ok" | "error" | "exit" | "interrupted", "detail"}).
It imports nothing of miniagi, so the user's code runs in a clean interpreter; once its own imports are done, the
work directory goes first on sys.path, so the user's code imports its own modules as in any Python session.
The agent's other commands are functions in the namespace, with their typed signatures: a call writes {"tool",
"arg": the arguments by name as a JSON object} on the answer channel and reads the agent's
{"result" | "data" | "error"} line back.
"""

import ast
import ctypes
import inspect
import json
import linecache
import mmap
import os
import resource
import signal
import sys
import threading
import time
import traceback

WORKER_PID = os.getpid()
# every copy of this process made by os.fork() (and every copy of a copy) writes its pid here, so the copies a
# snippet leaves running (a fork bomb, a pool left open) can be stopped and the ended ones reaped: unreaped, 200
# of them once used up the run's process allowance
FORK_READ, FORK_WRITE = os.pipe()
os.set_blocking(FORK_READ, False)
os.set_blocking(FORK_WRITE, False)
forks: set = set()


# set (shared with every copy) from the end of a snippet to the start of the next: a copy left running that tries
# to fork then ends instead, so a fork bomb stops growing the moment its snippet is over and can be stopped
SNIPPET_OVER = mmap.mmap(-1, 1)


def _stop_copies_forking() -> None:
    if SNIPPET_OVER[0] and os.getpid() != WORKER_PID:
        os._exit(0)


def _note_fork_in_child() -> None:
    _stop_copies_forking()
    try:
        os.write(FORK_WRITE, b"%d\n" % os.getpid())
    except OSError:  # the pipe is full (a fork bomb): the pids cgroup still bounds it
        pass


os.register_at_fork(before=_stop_copies_forking, after_in_child=_note_fork_in_child)
_fork = os.fork


def _recorded_fork() -> int:
    """os.fork, with the child's pid noted at once in the parent (its own note may come a moment later)."""
    pid = _fork()
    if pid > 0:
        forks.add(pid)
    return pid


os.fork = _recorded_fork


def _read_fork_pids() -> None:
    while True:
        try:
            data = os.read(FORK_READ, 65536)
        except BlockingIOError:
            return
        if not data:
            return
        forks.update(int(pid) for pid in data.split() if pid.isdigit())


def _is_copy_of_me(pid: int, cmdline: bytes) -> bool:
    """Still alive and still running this program (a fork that exec'd another program is not a copy)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
        with open(f"/proc/{pid}/cmdline", "rb") as command:
            return state not in (b"Z", b"X") and command.read() == cmdline
    except (OSError, IndexError):
        return False


def stop_forks() -> int:
    """Kill the copies of this worker still running after a snippet and reap the ended ones; how many were
    killed."""
    _read_fork_pids()
    if not forks:
        return 0
    try:
        with open("/proc/self/cmdline", "rb") as command:
            cmdline = command.read()
    except OSError:
        return 0
    killed: set = set()
    for _ in range(20):  # a fork bomb refills while we kill; the pids cgroup bounds what is left
        alive = [pid for pid in tuple(forks) if _is_copy_of_me(pid, cmdline)]
        if not alive:
            break
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except OSError:
                pass
        time.sleep(0.005)
        _read_fork_pids()
    for pid in tuple(forks):  # reap our own children that have ended; copies of copies go to init
        try:
            done, _ = os.waitpid(pid, 0 if pid in killed else os.WNOHANG)
        except ChildProcessError:
            forks.discard(pid)
            continue
        if done:
            forks.discard(pid)
    return len(killed)


class CPUTimeExceeded(BaseException):
    """The snippet used up its CPU time (RLIMIT_CPU): raised by the SIGXCPU handler."""


def apply_limits(settings: dict) -> None:
    """Lower this process's limits (children inherit them)."""
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
    if settings.get("refuse_allocation"):
        refuse_allocation()
    try:  # die with whoever started us (the agent, or the namespace's init), even on SIGKILL (Linux)
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def refuse_allocation() -> None:
    """fallocate refused (EOPNOTSUPP) in this process and all it starts: nsinit's filter (forbid_allocation), for
    --sandbox none, where no init of ours runs before the code. The module is read from its file, beside this one
    (nothing of miniagi is importable here)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("nsinit", os.path.join(os.path.dirname(__file__), "nsinit.py"))
    nsinit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nsinit)
    try:
        nsinit.forbid_allocation()
    except OSError:  # --exec-disk's meter still counts what is written
        pass


def on_cpu_limit(signum, frame):
    raise CPUTimeExceeded


def file_budget(limit) -> None:
    """No file written by the next snippet may grow past what is left of the run's disk allowance (the soft limit;
    the agent's disk meter stops code that raises it)."""
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    soft = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    except (ValueError, OSError):
        pass


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
    """Run a snippet. An interrupt (the agent's SIGINT on a timeout) is taken only while it runs: outside, the
    worker's own housekeeping must finish, or the session would be lost."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return _run_code(code, label, namespace)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_code(code: str, label: str, namespace: dict) -> tuple[str, str]:
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


class SearchResult:
    """One web_search result, as the tool returns it to Python code."""

    def __init__(self, title: str = "", url: str = "", snippet: str = ""):
        self.title, self.url, self.snippet = title, url, snippet

    def __repr__(self) -> str:
        return f"SearchResult(title={self.title!r}, url={self.url!r}, snippet={self.snippet!r})"


SearchResult.__module__ = "builtins"  # signatures show list[SearchResult], as the prompt names it (not __main__.…)


class SourceText(str):
    """A source's text, as read(source) returns it: a plain str to work with; printed whole, it shows between
    the agent's untrusted-data fence lines, as ingest_data shows a source."""

    def __new__(cls, text: str, fence: list):
        value = super().__new__(cls, text)
        value.fence = fence
        return value

    def __str__(self) -> str:
        return self.fence[0] + str.__str__(self) + self.fence[1]


TYPES = {"str": str, "list[str]": list[str], "list[SearchResult]": list[SearchResult]}  # the commands' annotations
JSON_TYPES = {"str": str, "int": int, "float": float, "bool": bool, "list": list, "dict": dict}  # an MCP tool's


class ToolError(Exception):
    """The agent could not carry out a tool call made from Python."""


def make_tool(spec: dict, requests, responses):
    """A plain function, with the command's own typed signature, that asks the agent to run one of its commands
    (through the worker's channel) and returns what it observed: the agent applies its approval, limits,
    redaction and cost accounting. The arguments travel by name, as a JSON object."""
    lock = threading.Lock()
    if spec.get("json"):  # an MCP tool: JSON-typed arguments, the optional ones may be left out
        signature = inspect.Signature(
            [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=JSON_TYPES.get(kind, object),
                               default=inspect.Parameter.empty if required else default)
             for name, kind, required, default in spec["params"]]
            + ([inspect.Parameter("_other", inspect.Parameter.VAR_KEYWORD)] if spec.get("more") else []),
            return_annotation=str)
    else:
        signature = inspect.Signature(
            [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=TYPES[kind])
             for name, kind in spec["params"]], return_annotation=TYPES[spec["returns"]])

    def tool(*args, **kwargs):
        if os.getpid() != WORKER_PID:
            raise ToolError(f"{spec['name']} can be called from the main Python process only, not from a fork")
        bound = signature.bind(*args, **kwargs)
        if spec.get("json"):
            arguments = {name: value for name, value in bound.arguments.items() if value is not None}
            arguments.update(arguments.pop("_other", {}) if spec.get("more") else {})
        else:
            arguments = {name: value if isinstance(value, str) else
                         [str(item) for item in value] if isinstance(value, (list, tuple)) else str(value)
                         for name, value in bound.arguments.items()}
        with lock:
            sys.stdout.flush()
            sys.stderr.flush()
            responses.write("\n" + json.dumps({"tool": spec["name"], "arg": json.dumps(arguments, default=str)}) + "\n")
            responses.flush()
            line = requests.readline()
        if not line:
            raise ToolError("the agent is gone")
        answer = json.loads(line)
        if "error" in answer:
            raise ToolError(answer["error"])
        data = answer.get("data")
        if isinstance(data, list):
            return [SearchResult(**item) for item in data]
        if isinstance(data, dict) and "error" in data:  # the command failed (an MCP tool's error)
            raise ToolError(data["error"])
        if isinstance(data, dict):
            return SourceText(data["text"], data["fence"])
        return answer.get("result", "")

    tool.__name__ = tool.__qualname__ = spec["name"]
    tool.__doc__ = spec.get("doc", "")
    tool.__signature__ = signature
    return tool


def serve(requests, responses, output_fd: int, limits: dict, tools: list) -> None:
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    namespace.update({spec["name"]: make_tool(spec, requests, responses) for spec in tools})
    signal.signal(signal.SIGXCPU, on_cpu_limit)
    for stream in (sys.__stdout__, sys.__stderr__):  # each printed line reaches the file at once: it is watched
        stream.reconfigure(line_buffering=True)
    responses.write(json.dumps({"status": "ready"}) + "\n")  # the snippet's clock starts after start-up
    responses.flush()
    for line in requests:
        request = json.loads(line)
        SNIPPET_OVER[0] = 0
        # output goes to the agent's file again, whatever the last snippet did with fds 1 and 2 or sys.stdout
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        os.dup2(output_fd, 1)
        os.dup2(output_fd, 2)
        if request.get("file_bytes") is not None:
            file_budget(request["file_bytes"])
        try:
            cpu_budget(limits.get("cpu_s"))
            status, detail = run_code(request["code"], request["label"], namespace)
        except KeyboardInterrupt:  # arrived between statements of our own
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            status, detail = "interrupted", ""
        cpu_budget(None)
        if os.getpid() != WORKER_PID:  # a process the snippet forked came back here: it must not answer
            os._exit(0)
        SNIPPET_OVER[0] = 1
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            stopped = stop_forks()
        except Exception:  # housekeeping must never take the session down
            stopped = 0
        # a leading newline ends whatever part of a line the snippet may have written here itself
        responses.write("\n" + json.dumps({"id": request.get("id"), "status": status, "detail": detail,
                                           "forks_stopped": stopped}) + "\n")
        responses.flush()


def warm_up() -> None:
    """Make the standard library's lazy imports (tracebacks) now, before the work directory joins sys.path."""
    try:
        compile("(", "<warm-up>", "exec")
    except SyntaxError:
        traceback.format_exception_only(*sys.exc_info()[:2])
    try:
        raise ValueError
    except ValueError as error:
        traceback.format_exception(type(error), error, error.__traceback__)


def main() -> None:
    request_fd, response_fd, output_fd = (int(fd) for fd in sys.argv[1:4])
    sys.argv = [""]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # until a snippet runs
    requests = os.fdopen(request_fd, "r", encoding="utf-8")
    responses = os.fdopen(response_fd, "w", encoding="utf-8")
    setup = json.loads(requests.readline())
    apply_limits(setup["limits"])
    warm_up()
    sys.path[0] = os.getcwd()  # not this file's folder: the user's modules, as `python` in the work directory
    serve(requests, responses, output_fd, setup["limits"], setup["tools"])


if __name__ == "__main__":
    main()
