"""Shared fixtures: every test gets its own MINIAGI_HOME and working directory, no inherited settings, and a
scripted OpenAI-compatible server on 127.0.0.1 when it asks for `llm`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from miniagi.config import OPTIONS

from .fake_llm import FakeLLM

SETTING_NAMES = {name for option in OPTIONS for name in option.env_names}


def one_line(stderr: str) -> bool:
    """What a usage or configuration problem looks like: one line, no traceback."""
    return len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr


def act(command: str, arg: str = "", thought: str = "thinking") -> str:
    """A well-formed reply."""
    return f"<r>{thought}</r><c>{command}</c>\n{arg}"


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    for name in list(os.environ):
        if name.startswith(("MINIAGI_", "OPENAI_")) or name in SETTING_NAMES:
            monkeypatch.delenv(name)
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("MINIAGI_HOME", str(home))
    # nothing may reach the real ~/.miniagi, not even Settings() built without a home
    monkeypatch.setenv("HOME", str(tmp_path / "user-home"))
    monkeypatch.chdir(work)  # no stray .env is read
    return SimpleNamespace(home=home, work=work)


@pytest.fixture
def llm():
    with FakeLLM() as server:
        yield server


@pytest.fixture
def cli(llm, isolated, monkeypatch, tmp_path):
    """Run `miniagi ARGS` against the fake endpoint: in this process by default (main() with its own environment,
    folder, stdin, stdout and stderr: a second per call saved), or as a real `python -m miniagi` subprocess with
    process=True, for what needs a process of its own (signals, a kill, its exit, what its children can see)."""
    calls = iter(range(10**6))

    def run(*args, env: dict | None = None, timeout: float = 90, process: bool = False,
            **kwargs) -> subprocess.CompletedProcess:
        full_env = dict(os.environ, OPENAI_BASE_URL=llm.url, OPENAI_API_KEY="sk-test-key-123456",
                        MINIAGI_MEMORY_SCOPE="off")  # vector memory costs start-up; memory tests turn it on
        full_env.update(env or {})
        full_env = {k: v for k, v in full_env.items() if v is not None}
        cwd = kwargs.pop("cwd", isolated.work)
        if process:
            return subprocess.run([sys.executable, "-m", "miniagi", *args], cwd=cwd, env=full_env,
                                  capture_output=True, text=True, timeout=timeout,
                                  **({} if "input" in kwargs else {"stdin": subprocess.DEVNULL}), **kwargs)
        return _in_process(list(args), full_env, cwd, kwargs.pop("input", None), monkeypatch,
                           tmp_path / f"cli-{next(calls)}")

    return run


def _in_process(args: list[str], env: dict, cwd, stdin_text: str | None, monkeypatch, scratch: Path):
    from miniagi.cli import main

    scratch.mkdir()
    (scratch / "stdin").write_text(stdin_text or "", encoding="utf-8")
    with monkeypatch.context() as patch, open(scratch / "stdin", encoding="utf-8") as stdin, \
            open(scratch / "stdout", "w+", encoding="utf-8") as stdout, \
            open(scratch / "stderr", "w+", encoding="utf-8") as stderr:
        for name in list(os.environ):
            if name not in env:
                patch.delenv(name)
        for name, value in env.items():
            patch.setenv(name, value)
        patch.chdir(cwd)
        patch.setattr(sys, "stdin", stdin)
        patch.setattr(sys, "stdout", stdout)
        patch.setattr(sys, "stderr", stderr)
        try:
            code = main(args)
        except SystemExit as stop:  # argparse: --help, --version, usage errors
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        stdout.flush()
        stderr.flush()
        return subprocess.CompletedProcess(["miniagi", *args], code, (scratch / "stdout").read_text("utf-8"),
                                           (scratch / "stderr").read_text("utf-8"))


MEMORY_ON = {"MINIAGI_MEMORY_SCOPE": "global"}


def run_dirs(home: Path) -> list[Path]:
    return sorted((home / "runs").iterdir()) if (home / "runs").is_dir() else []
