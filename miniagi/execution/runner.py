"""One run's executed code: the sandbox it runs in and the limits it runs under, chosen once from the run's
settings, shared by its Python session and its shell commands."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Mapping

from ..redaction import child_environment
from .limits import Limits, RunLimits
from .output import ExecResult
from .python import PythonSession
from .sandbox import INSTALL_HINT, Policy, open_sandbox
from .shell import run_shell


def users_own_folder(workdir: Path) -> Path:
    """~/.miniagi, made if missing so that the sandbox can lay an empty folder over it (a path that does not exist
    cannot be hidden, and code could make it). A work directory inside it is refused: code would write there."""
    from ..config import ConfigError, user_home

    folder = user_home()
    if os.path.realpath(workdir) == str(folder) or os.path.realpath(workdir).startswith(str(folder) + os.sep):
        raise ConfigError(f"the work directory {workdir} is inside {folder}, miniagi's own folder (its trust record "
                          "and your settings), which executed code must never reach: choose another --workdir")
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


def sandbox_policy(settings, users_own: Path, environ: Mapping[str, str], **more) -> Policy:
    """What the sandbox keeps from a run's code (docs/security.md's table is checked against it)."""
    return Policy(workdir=settings.workdir_path,
                  # the agent's own files: runs, traces, memory, the .env files it reads, and always the user's own
                  # folder (~/.miniagi: the trust record, the user's settings), whatever the run's home
                  hidden=(settings.home_path, users_own, Path.cwd() / ".env", settings.workdir_path / ".env"),
                  allowed=tuple(Path(p).expanduser().absolute() for p in settings.sandbox_allow),
                  network=not settings.no_network, path=environ.get("PATH"), **more)


class CodeRunner:
    def __init__(self, settings, environ: Mapping[str, str], max_chars: int, tools: list[dict] = (),
                 tool_handler: Callable[[str, str], dict] | None = None):
        self.settings = settings
        self.workdir: Path = settings.workdir_path
        self.workdir.mkdir(parents=True, exist_ok=True)
        users_own = users_own_folder(self.workdir)  # before the limits: a work directory there is refused
        self.max_chars = max_chars
        # the working directory is the code's home: caches and dotfiles it writes stay with the work
        self.env = dict(child_environment(environ, settings.pass_env), HOME=str(self.workdir))
        self.limits = RunLimits(Limits(memory_mb=settings.exec_memory, cpu_s=settings.exec_timeout or 3600,
                                       disk_mb=settings.exec_disk), self.workdir)
        policy = sandbox_policy(settings, users_own, environ, tmp_bytes=self.limits.limits.disk_bytes,
                                cgroup_procs=tuple(self.limits.cgroups.procs_files))
        try:
            self.sandbox, self.passed_over = open_sandbox(settings.sandbox, policy)
        except BaseException:
            self.limits.close()
            raise
        self.tools = list(tools)
        self.tool_handler = tool_handler
        self._python: PythonSession | None = None
        self.on_output: Callable[[str], None] | None = None  # told each line code prints, as it prints it
        self.warned = False  # what is not protected is said once, however many runs share this (a chat)

    @property
    def kind(self) -> str:
        return self.sandbox.kind

    def describe(self) -> str:
        return self.sandbox.describe()

    def whole(self) -> bool:
        """Whether the sandbox holds everything the strongest kind can: then its name says enough."""
        return self.sandbox.whole()

    def warning(self) -> str:
        """What is not protected here, in words ("" when everything is)."""
        parts = []
        if self.sandbox.unprotected():
            why = f" ({'; '.join(self.passed_over)})" if self.passed_over else " (--sandbox " + self.kind + ")"
            parts.append(f"executed code is not in a file-system sandbox{why}: {self.sandbox.unprotected()} For a "
                         f"file-system sandbox, {INSTALL_HINT}.")
        parts += [f"{gap}." for gap in self.limits.gaps()]
        return " ".join(parts)

    @property
    def python(self) -> PythonSession:
        if self._python is None:
            self._python = PythonSession(self.workdir, self.env, self.settings.exec_timeout, self.max_chars,
                                         self.limits, self.sandbox, tools=self.tools, tool_handler=self.tool_handler)
        self._python.on_output = self.on_output
        return self._python

    def run_python(self, code: str, label: str | None = None) -> ExecResult:
        return self.python.run(code, label)

    def run_shell(self, command: str) -> ExecResult:
        return run_shell(command, self.workdir, self.env, self.settings.exec_timeout, self.max_chars, self.limits,
                         self.sandbox, on_output=self.on_output)

    def close(self) -> None:
        if self._python is not None:
            self._python.close()
            self._python = None
        self.sandbox.close()
        self.limits.close()

    def __enter__(self) -> "CodeRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_command(command: str, settings, environ: Mapping[str, str] | None = None,
                max_chars: int = 20_000) -> ExecResult:
    """A shell command line run in settings.workdir with the same sandbox and limits as a run's execute_shell
    (for a batch objective's `check`). Raises ConfigError when the sandbox asked for cannot be had."""
    with CodeRunner(settings, os.environ if environ is None else environ, max_chars) as runner:
        return runner.run_shell(command)
