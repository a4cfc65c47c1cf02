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
import sys
import traceback


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
    except BaseException as error:  # the user's exception is the observation, whatever it is
        tb = error.__traceback__.tb_next if error.__traceback__ else None  # drop this function's frame
        sys.stderr.write("".join(traceback.format_exception(type(error), error, tb)))
        return "error", type(error).__name__


def serve(request_fd: int, response_fd: int) -> None:
    requests = os.fdopen(request_fd, "r", encoding="utf-8")
    responses = os.fdopen(response_fd, "w", encoding="utf-8")
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    for line in requests:
        request = json.loads(line)
        out = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        try:
            status, detail = run_code(request["code"], request["label"], namespace)
        except KeyboardInterrupt:  # arrived between statements of our own
            status, detail = "interrupted", ""
        sys.stdout.flush()
        sys.stderr.flush()
        responses.write(json.dumps({"status": status, "detail": detail}) + "\n")
        responses.flush()


if __name__ == "__main__":
    sys.argv = [""]
    serve(int(os.environ.pop("MINIAGI_WORKER_REQUEST_FD")), int(os.environ.pop("MINIAGI_WORKER_RESPONSE_FD")))
