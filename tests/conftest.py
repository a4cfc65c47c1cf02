"""Shared fixtures: every test gets its own MINIAGI_HOME and working directory, no inherited settings, and a
scripted OpenAI-compatible server on 127.0.0.1 when it asks for `llm`. Every byte stays on loopback: the suite's
own process refuses to reach beyond it, and a test marked `own_network` runs in a network namespace of its own."""

from __future__ import annotations

import errno
import functools
import ipaddress
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from xml.etree import ElementTree

import pytest

from miniagi.config import OPTIONS

from .fake_llm import FakeLLM

SETTING_NAMES = {name for option in OPTIONS for name in option.env_names}


# --- every byte on loopback ----------------------------------------------------------------------------------------
# The machines this suite runs on allow traffic only to loopback. In the suite's own process (each xdist worker
# included) a connection, a datagram, a name lookup or a listening socket beyond loopback is refused before any
# packet leaves, and the test that tried fails even when the code under test took the error in its stride. The
# programs a test starts are not watched from here: a test whose programs would use the machine's own address (a
# local Ray instance does) or reach beyond it (Chromium does) is marked `own_network` and runs in a network namespace
# holding only loopback.

class LeftLoopback(OSError):
    """What a test gets instead of reaching beyond loopback."""


reached_beyond: list[str] = []  # what the suite tried since the last test ended


def ip_address(host) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address a host names by its digits (an IPv4-mapped IPv6 address as IPv4), or None for a name."""
    try:
        address = ipaddress.ip_address((host.decode() if isinstance(host, bytes) else host).split("%")[0])
    except ValueError:
        return None
    return getattr(address, "ipv4_mapped", None) or address


def beyond_loopback(host) -> bool:
    """Whether an internet host is outside loopback: a name other than localhost counts (looking it up asks the
    resolver, off this machine), and so does the wildcard (listening there listens on every interface)."""
    name = (host.decode() if isinstance(host, bytes) else host).rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return False
    address = ip_address(name or "0.0.0.0")
    return address is None or not address.is_loopback


def only_loopback() -> bool:
    """Whether this process's network holds nothing but a loopback interface: then no address leads anywhere else."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def _refuse(what: str):
    reached_beyond.append(what)
    raise LeftLoopback(errno.ENETUNREACH, f"{what}: tests keep to loopback (tests/conftest.py)")


def guard_sockets() -> None:
    """Wrap what opens a way out: connect, connect_ex, sendto, bind and getaddrinfo (create_connection and every
    HTTP client go through them). Unix sockets and other families pass; so does listening on the wildcard in a
    network of only loopback (a test marked own_network)."""
    if getattr(socket.socket.connect, "guarded", False):
        return
    plain = {name: getattr(socket.socket, name) for name in ("connect", "connect_ex", "sendto", "bind")}
    plain_getaddrinfo = socket.getaddrinfo
    listening_is_local = only_loopback()

    def checked(name: str, address_at: int):
        def method(self, *args):
            address = args[address_at] if len(args) > address_at else None
            if self.family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple) and \
                    beyond_loopback(address[0]) and not (name == "bind" and listening_is_local):
                _refuse(f"{name} to {address[0] or 'the wildcard'} port {address[1]}")
            return plain[name](self, *args)
        method.guarded = True
        return method

    def getaddrinfo(host, *args, **kwargs):
        if host is not None and ip_address(host) is None and beyond_loopback(host):
            _refuse(f"looking up {host}")  # a numeric host is not looked up: what is done with it is checked
        return plain_getaddrinfo(host, *args, **kwargs)

    socket.socket.connect, socket.socket.connect_ex = checked("connect", 0), checked("connect_ex", 0)
    socket.socket.sendto, socket.socket.bind = checked("sendto", -1), checked("bind", 0)
    socket.getaddrinfo = getaddrinfo


@pytest.fixture(autouse=True)
def stays_on_loopback():
    yield
    if reached_beyond:
        tried = "; ".join(dict.fromkeys(reached_beyond))
        reached_beyond.clear()
        pytest.fail(f"this test reached beyond loopback: {tried}", pytrace=False)


def pytest_configure(config):
    config.addinivalue_line("markers", "own_network: runs in a network namespace of its own that holds only a "
                            "loopback interface (its programs would otherwise use the machine's own address)")
    guard_sockets()


def pytest_collection_modifyitems(items):
    """Each test marked own_network (and each that drives Chromium, which asks Google's update, account and autofill
    services as it starts) is replaced here by one that runs it in a network of its own, fixtures and all, unless
    this process is in such a network already."""
    if only_loopback():
        return
    for index, item in enumerate(items):
        if "browser" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.own_network)
        if item.get_closest_marker("own_network") is not None:
            items[index] = InOwnNetwork.from_parent(item.parent, name=item.name, original=item)


class InOwnNetwork(pytest.Item):
    """A test run as a pytest of its own in a new network namespace that holds only loopback: what it starts
    cannot use the machine's address, as there is none. Its fixtures are set up there, not here. Where no namespace
    can be made it is skipped, with the reason, never run on the machine's network."""

    def __init__(self, *, original: pytest.Item, **kwargs):
        super().__init__(**kwargs)
        self.original = original
        self.own_markers = list(original.own_markers)

    def reportinfo(self):
        return self.original.reportinfo()

    def runtest(self) -> None:
        command = new_network()
        if isinstance(command, str):
            pytest.skip(f"{command}: this test runs in a network of its own only (what it starts would use the "
                        "machine's network address)")
        with tempfile.TemporaryDirectory() as scratch:
            report = Path(scratch) / "report.xml"
            proc = subprocess.run([*command, sys.executable, "-m", "pytest", "-q", "-n", "0", "-p",
                                   "no:cacheprovider", "-rP", f"--junitxml={report}", self.nodeid],
                                  cwd=self.config.rootpath, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=900)
            case = ElementTree.parse(report).getroot().find(".//testcase") if report.exists() else None
        print(proc.stdout, proc.stderr, sep="\n")  # the inner run's report: shown with -s or -rP
        if case is None:
            pytest.fail(f"the test did not run in its network namespace:\n{proc.stdout}{proc.stderr}", pytrace=False)
        if case.find("skipped") is not None:
            pytest.skip(case.find("skipped").get("message", ""))
        if case.find("failure") is not None or case.find("error") is not None or proc.returncode != 0:
            pytest.fail(f"in its network namespace:\n{proc.stdout[-6000:]}", pytrace=False)


@functools.cache
def new_network() -> list[str] | str:
    """The command that makes a network namespace of its own with loopback up, or why none can be made."""
    if not shutil.which("unshare") or not shutil.which("ip"):
        return "no unshare (util-linux) or ip (iproute2) to make a network namespace"
    # as root a network namespace is enough; otherwise a user namespace may grant the right to make one
    for unshare in (["unshare", "--net"], ["unshare", "--map-root-user", "--net"]):
        probe = subprocess.run([*unshare, "--", "ip", "link", "set", "lo", "up"], capture_output=True, text=True)
        if probe.returncode == 0:
            return [*unshare, "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"]
    return f"cannot make a network namespace here ({probe.stderr.strip() or probe.returncode})"


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


# --- a run's memory used alone: given what a run gives it -----------------------------------------------------------
def run_context(memory, **how):
    """`memory.context(...)` as a run asks for it: the memory reads the run's state (`RunState`), and a summary it
    folds is recorded there by the run, as an event (Run.context): the memory never writes the state itself."""
    from miniagi import events as ev

    context, folded = memory.context(**how)
    if folded is not None:
        memory.state.apply(ev.SummaryFolded(step=how["next_step"] - 1, text=folded.text,
                                            through_step=folded.through_step,
                                            notes_digest=folded.notes_digest or None,
                                            notes_through=folded.notes_through or None))
    return context, folded
