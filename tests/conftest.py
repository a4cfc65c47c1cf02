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
def cli(llm, isolated):
    """Run `python -m miniagi ARGS` in a real subprocess against the fake endpoint."""

    def run(*args, env: dict | None = None, timeout: float = 90, **kwargs) -> subprocess.CompletedProcess:
        # vector memory costs ~1 s of start-up per process; tests about memory turn it on (MEMORY_ON)
        full_env = dict(os.environ, OPENAI_BASE_URL=llm.url, OPENAI_API_KEY="sk-test-key-123456",
                        MINIAGI_MEMORY_SCOPE="off")
        full_env.update(env or {})
        full_env = {k: v for k, v in full_env.items() if v is not None}
        return subprocess.run([sys.executable, "-m", "miniagi", *args], cwd=kwargs.pop("cwd", isolated.work),
                              env=full_env, capture_output=True, text=True, timeout=timeout,
                              **({} if "input" in kwargs else {"stdin": subprocess.DEVNULL}), **kwargs)

    return run


MEMORY_ON = {"MINIAGI_MEMORY_SCOPE": "global"}


def run_dirs(home: Path) -> list[Path]:
    return sorted((home / "runs").iterdir()) if (home / "runs").is_dir() else []
