"""How executed code is contained: one `Sandbox` per kind, behind one small interface (`launch` wraps a command
line, `command` and `spared` find the command's and the sandbox's own processes, `close`).

- `Bubblewrap` (`--sandbox bwrap`): bubblewrap, as Flatpak and Claude Code use it. The code's file system is the
  work directory (read-write), a private /tmp, and the rest of the system read-only; `$MINIAGI_HOME`, the `.env`
  files miniagi reads and the user's secrets in the home (~/.ssh, ~/.aws, ~/.config, ~/.netrc, shell histories…)
  are hidden, and so are /run's sockets; miniagi's own installation is read-only wherever it lives. PID, IPC, UTS
  and cgroup namespaces of its own, every capability dropped, no new user namespaces inside.
- `Namespace` (`--sandbox namespace`): util-linux `unshare --user --map-root-user --pid --fork --mount-proc`, no
  privilege needed: /proc shows only the code's own processes, so the agent (its environment, memory, command line)
  is out of sight and out of reach of `kill`. Its init drops every privilege after remounting the cgroup files
  read-only, so `umount /proc` cannot bring the host's back and the limits stay. Files are not protected.
- `Unconfined` (`--sandbox none`): a process group of its own, nothing more.

Under both namespace kinds PID 1 is nsinit.py, which reaps orphans and ends everything when the agent is gone.
`--no-network` gives the code a network namespace with nothing but loopback (namespace kinds only).
`open_sandbox` picks the kind (`auto`: the strongest that works here, found by really starting `true` in it).
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ..config import ConfigError
from .limits import children

NSINIT = Path(__file__).resolve().with_name("nsinit.py")
INNER_COMMAND_PID = 2  # nsinit is 1 and forks the command first
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap; "
                "Arch: pacman -S bubblewrap)")

# what the user keeps in the home that executed code has no business reading, hidden by bwrap (relative to ~)
HOME_SECRETS = (
    ".ssh", ".gnupg", ".aws", ".azure", ".config", ".kube", ".docker", ".netrc", ".git-credentials", ".pgpass",
    ".my.cnf", ".pypirc", ".npmrc", ".yarnrc", ".gem/credentials", ".cargo/credentials", ".cargo/credentials.toml",
    ".m2/settings.xml", ".gradle/gradle.properties", ".terraform.d", ".vault-token", ".password-store",
    ".local/share/keyrings", ".pki", ".mozilla", ".s3cfg", ".boto", ".oci", ".databrickscfg", ".huggingface",
    ".cache/huggingface/token", ".env", ".bash_history", ".zsh_history", ".zhistory", ".history", ".sh_history",
    ".python_history", ".psql_history", ".mysql_history", ".sqlite_history", ".node_repl_history", ".irb_history",
    ".rediscli_history", ".lesshst", ".viminfo", ".local/share/fish", ".ipython", ".jupyter",
    ".local/share/jupyter", ".bash_sessions", ".zsh_sessions",
)
# readable by root only; executed code may run as root
SYSTEM_SECRETS = ("/etc/shadow", "/etc/gshadow", "/etc/ssh")


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    pass_fds: tuple[int, ...]


@dataclass(frozen=True)
class Policy:
    """What a sandbox is asked to keep: the run's side of it."""

    workdir: Path
    hidden: tuple[Path, ...] = ()  # the agent's own files ($MINIAGI_HOME, the .env files it reads)
    allowed: tuple[Path, ...] = ()  # --sandbox-allow: hidden paths reopened
    network: bool = True
    tmp_bytes: int = 2**30  # the size of the private /tmp
    cgroup_procs: tuple[str, ...] = ()  # cgroup.procs files each launch joins before anything runs
    path: str | None = None  # where to look for bwrap and unshare (the agent's PATH)


class Sandbox:
    kind: ClassVar[str]

    def __init__(self, policy: Policy):
        self.policy = policy
        self.program = self._find_program()

    def _find_program(self) -> str | None:
        return None

    def launch(self, argv: list[str]) -> Launch:
        """The command line that runs argv in the sandbox, and the descriptors to pass on."""
        return Launch(self._launcher(argv, ignore_interrupt=False), ())

    def _launcher(self, argv: list[str], ignore_interrupt: bool) -> list[str]:
        """Join the run's cgroups before anything else starts. A namespace's launcher ignores SIGINT (sent to the
        whole group on a timeout, it is for the snippet); nsinit gives the command the default back."""
        lines = ['trap "" INT'] if ignore_interrupt else []
        lines += [f"echo $$ > {shlex.quote(procs)} 2>/dev/null" for procs in self.policy.cgroup_procs]
        return ["/bin/sh", "-c", "; ".join(lines) + '; exec "$@"', "sh", *argv] if lines else argv

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        return env

    def command(self, leader: int) -> int | None:
        """The process (its pid as seen here) of the command a launch runs; outside a namespace, the launcher is
        the command. None when it is gone."""
        return leader

    def spared(self, leader: int) -> set[int]:
        """The processes of a launch that are not the command's own work: the launcher and the namespace's init,
        plus the command itself."""
        return {leader}

    def probe(self) -> str:
        """Why this sandbox cannot be used here ("" when it can), found by starting `true` in it."""
        if self.program is None:
            return "not installed"
        launch = self.launch(["true"])
        try:
            done = subprocess.run(launch.argv, pass_fds=launch.pass_fds, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"could not be run ({exc})"
        if done.returncode != 0:
            why = done.stderr.decode("utf-8", "replace").strip().splitlines()
            return f"the system refused it ({why[-1] if why else f'exit {done.returncode}'})"
        return ""

    def describe(self) -> str:
        raise NotImplementedError

    def unprotected(self) -> str:
        """What this kind leaves open, for the warning ("" for none)."""
        return ""

    def close(self) -> None:
        pass


class Unconfined(Sandbox):
    kind = "none"

    def probe(self) -> str:
        return ""

    def describe(self) -> str:
        return "none — code runs as you, with your files, processes and network"

    def unprotected(self) -> str:
        root = " As root it can also lift its own process and memory limits." if os.getuid() == 0 else ""
        return ("it runs as you: it can see the agent's process and environment in /proc and signal it, and read "
                "and write every file you can — your home's secrets (~/.ssh, ~/.aws, ~/.config…), $MINIAGI_HOME "
                f"(runs, traces, memory), ./.env and miniagi's own installation.{root}")


class NamespaceSandbox(Sandbox):
    """The base of the kinds that run code in a PID namespace under nsinit."""

    def __init__(self, policy: Policy):
        super().__init__(policy)
        # the lifeline: every namespace's init holds the read end; only we hold the write end, so when this
        # process is gone (even SIGKILLed) the inits read end-of-file and end their namespaces
        self._lifeline_read, self._lifeline_write = os.pipe()

    def _nsinit(self, argv: list[str], *flags: str) -> list[str]:
        return [sys.executable, "-I", "-S", str(NSINIT), str(self._lifeline_read), *flags, "--", *argv]

    def command(self, leader: int) -> int | None:
        for init in children(leader):
            for pid in children(init):
                if _inner_pid(pid) == INNER_COMMAND_PID:
                    return pid
        return None

    def spared(self, leader: int) -> set[int]:
        keep = {leader}
        for init in children(leader):
            keep.add(init)
            keep.update(pid for pid in children(init) if _inner_pid(pid) in (INNER_COMMAND_PID, None))
        return keep

    def close(self) -> None:
        for fd in (self._lifeline_read, self._lifeline_write):
            if fd >= 0:
                os.close(fd)
        self._lifeline_read = self._lifeline_write = -1


class Namespace(NamespaceSandbox):
    kind = "namespace"
    FLAGS = ("--user", "--map-root-user", "--pid", "--fork", "--mount-proc", "--kill-child")

    def _find_program(self) -> str | None:
        return shutil.which("unshare", path=self.policy.path)

    def launch(self, argv: list[str]) -> Launch:
        flags = [*self.FLAGS, *(() if self.policy.network else ("--net",))]
        inner = self._nsinit(argv, "--drop-privileges")
        return Launch(self._launcher([self.program, *flags, *inner], ignore_interrupt=True), (self._lifeline_read,))

    def describe(self) -> str:
        return (f"namespace — its own processes only; files not protected; "
                f"network {'on' if self.policy.network else 'off'}")

    def unprotected(self) -> str:
        return ("it cannot see or signal the agent, but it can read and write every file you can — your home's "
                "secrets (~/.ssh, ~/.aws, ~/.config…), $MINIAGI_HOME (runs, traces, memory), ./.env and miniagi's "
                "own installation.")


class Bubblewrap(NamespaceSandbox):
    kind = "bwrap"
    NAMESPACES = ("--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try")

    def __init__(self, policy: Policy):
        super().__init__(policy)
        self.no_nested_userns = True  # --disable-userns (bubblewrap 0.8+); dropped when this bwrap refuses it

    def _find_program(self) -> str | None:
        return shutil.which("bwrap", path=self.policy.path)

    def probe(self) -> str:
        why = super().probe()
        if why and self.program:
            self.no_nested_userns = False
            if not super().probe():
                return ""
            self.no_nested_userns = True
        return why

    def launch(self, argv: list[str]) -> Launch:
        flags = [*self.NAMESPACES, *(() if self.policy.network else ("--unshare-net",)),
                 *(("--disable-userns",) if self.no_nested_userns else ()), "--cap-drop", "ALL", "--as-pid-1",
                 *file_system(self.policy), "--chdir", str(self.policy.workdir)]
        argv = [self.program, *flags, "--", *self._nsinit(argv)]
        return Launch(self._launcher(argv, ignore_interrupt=True), (self._lifeline_read,))

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        return dict(env, TMPDIR="/tmp")  # the one /tmp it can write

    def describe(self) -> str:
        mode = "read-write" if os.access(self.policy.workdir, os.W_OK) else "read-only (not writable by you)"
        return (f"bwrap — work directory {mode}, private /tmp, the rest read-only; $MINIAGI_HOME, .env and the "
                f"home's secrets hidden; network {'on' if self.policy.network else 'off'}")


SANDBOXES: dict[str, type[Sandbox]] = {"bwrap": Bubblewrap, "namespace": Namespace, "none": Unconfined}


def open_sandbox(kind: str, policy: Policy) -> tuple[Sandbox, list[str]]:
    """The sandbox of one run, and why the stronger kinds were passed over (`auto` only). A kind asked for by name
    that cannot work here is a configuration error, and so is `--no-network` with no namespace to give it."""
    candidates = ["bwrap", "namespace", "none"] if kind == "auto" else [kind]
    passed_over = []
    for name in candidates:
        if name == "none" and not policy.network:
            why = f" and none works here ({'; '.join(passed_over)}): {INSTALL_HINT}" if passed_over else ""
            raise ConfigError(f"--no-network needs a sandbox (bwrap or namespace){why}")
        sandbox = SANDBOXES[name](policy)
        why = sandbox.probe()
        if not why:
            return sandbox, passed_over
        sandbox.close()
        passed_over.append(f"{name}: {why}")
    hint = f"; {INSTALL_HINT}" if kind == "bwrap" else ""
    raise ConfigError(f"--sandbox {kind} cannot be used here ({passed_over[-1]}){hint}; --sandbox auto picks the "
                      "strongest that works")


def file_system(policy: Policy) -> list[str]:
    """bwrap's mounts: the system read-only, the work directory read-write, a private /tmp; the agent's files, the
    home's secrets and /run hidden; miniagi's installation read-only wherever it is; the --sandbox-allow paths
    reopened. A deeper path is mounted later, so the most specific rule wins."""
    workdir = _real(policy.workdir)
    allowed = [p for p in (_real(a) for a in policy.allowed) if p is not None]
    rules: dict[Path, tuple[int, str]] = {}

    def rule(path: Path | None, how: str, rank: int) -> None:
        if path is None or path == Path("/") or _under(path, Path("/proc")) or _under(path, Path("/dev")):
            return
        if how == "hide" and any(_under(path, a) for a in allowed):
            return
        if rank >= rules.get(path, (-1, ""))[0]:
            rules[path] = (rank, how)

    home = _real(Path.home())
    secrets = [home / name for name in HOME_SECRETS] if home and home != Path("/") else []
    hidden = [p for p in (_real(path) for path in (*policy.hidden, *secrets, *map(Path, SYSTEM_SECRETS),
                                                    Path("/run"), Path("/var/run"))) if p is not None]
    rule(workdir, "rw", 0)
    for path in hidden:
        rule(path, "hide", 2)
    # the interpreter and packages the worker and nsinit run from, wherever a rule above would touch them
    covered = [Path("/tmp"), *([workdir] if workdir else []), *hidden]
    for path in _installation():
        if any(_under(path, place) for place in covered):
            rule(path, "ro", 1)
    resolver = _real(Path("/etc/resolv.conf"))  # often a link into /run (systemd-resolved, resolvconf)
    if resolver and _under(resolver, Path("/run")):
        rule(resolver, "ro", 1)
    for path in allowed:
        rule(path, "rw" if workdir and _under(path, workdir) else "ro", 3)

    args = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--size", str(policy.tmp_bytes),
            "--tmpfs", "/tmp"]
    remount = []
    for path in sorted(rules, key=lambda p: len(p.parts)):
        how = rules[path][1]
        if how == "hide" and path.is_dir():
            args += ["--tmpfs", str(path)]
            remount.append(str(path))  # read-only last, once the mounts inside it are made
        elif how == "hide":
            args += ["--ro-bind", "/dev/null", str(path)]
        else:
            args += ["--bind" if how == "rw" else "--ro-bind", str(path), str(path)]
    for path in reversed(remount):
        args += ["--remount-ro", path]
    return args


@functools.lru_cache(maxsize=1)
def _installation() -> list[Path]:
    """Where the agent's own code lives: its packages, its interpreter's prefixes and site directories."""
    import site

    package = Path(__file__).resolve().parents[1]
    places = [package, package.with_name("memory"), Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix)]
    places += [Path(p) for p in site.getsitepackages()]
    if site.ENABLE_USER_SITE and site.getusersitepackages():
        places.append(Path(site.getusersitepackages()))
    return [p for p in dict.fromkeys(_real(place) for place in places) if p is not None]


def _real(path: Path) -> Path | None:
    """The path with its links resolved, when it exists."""
    try:
        real = Path(os.path.realpath(Path(path).expanduser()))
        return real if os.path.lexists(real) else None
    except OSError:
        return None


def _under(path: Path, parent: Path) -> bool:
    inner, outer = str(path), str(parent)
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def _inner_pid(pid: int) -> int | None:
    """A process's pid inside its own namespace (the last NSpid field), None when the kernel does not say."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except (OSError, ValueError):
        pass
    return None
