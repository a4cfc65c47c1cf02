"""Running the agent's code: execute_python's persistent worker and execute_shell's command lines, contained.

- runner.py — `CodeRunner`: one run's sandbox and limits, its Python session and shell; `run_command` runs one
  shell command the same way (a batch objective's check)
- sandbox.py — one `Sandbox` per kind: bwrap, namespace, none (docs/sandbox.md says what each protects)
- limits.py — processes, memory, CPU, file size and disk caps, and the cgroups that hold them
- python.py, worker.py — the Python session and the worker process it talks to
- shell.py — one shell command line
- nsinit.py — PID 1 of the sandbox's namespace
- output.py, processes.py — output read through our own descriptor, bounded; process groups started and killed
"""

from .output import ExecResult, cap_text
from .runner import CodeRunner, run_command

__all__ = ["CodeRunner", "ExecResult", "cap_text", "run_command"]
