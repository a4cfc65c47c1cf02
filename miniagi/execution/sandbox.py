"""How executed code is contained: one `Sandbox` per kind, behind one small interface (`launch` wraps a command
line, `command` and `spared` find the command's and the sandbox's own processes, `close`).

- `Bubblewrap` (`--sandbox bwrap`): bubblewrap, as Flatpak and Claude Code use it. The code's file system is the
  work directory (read-write), a private /tmp, and the rest of the system read-only; `$MINIAGI_HOME`, the `.env`
  files miniagi reads and every home ($HOME, /root, /home/*: empty directories, the work directory and the
  --sandbox-allow paths bound back in, and the programs of the PATH read-only) are hidden, and so are /run's
  sockets; miniagi's own installation is read-only wherever it lives; /proc is read-only. PID, IPC, UTS and
  cgroup namespaces of its own, every capability dropped, no new user namespaces inside. Started by root, the
  code's uid is nobody on the host, not root (hostids.py: a user namespace of our making, the work directory
  idmapped); where that cannot be had, the sandbox line says so.
- `Namespace` (`--sandbox namespace`): util-linux `unshare --user --map-root-user --pid --fork --mount-proc`, no
  privilege needed: /proc shows only the code's own processes, so the agent (its environment, memory, command line)
  is out of sight and out of reach of `kill`. Its init drops every privilege after remounting the cgroup files
  read-only, and /proc: `umount /proc` cannot bring the host's back, the limits stay, /proc/sys cannot be
  written. Files are not protected; run by root, the code's uid is the host's root for them.
- `Unconfined` (`--sandbox none`): a process group of its own, nothing more.

Under both namespace kinds PID 1 is nsinit.py, which reaps orphans and ends everything when the agent is gone.
`--no-network` gives the code a network namespace with nothing but loopback (namespace kinds only).
`open_sandbox` picks the kind (`auto`: the strongest that works here, found by really starting `true` in it).
"""

from __future__ import annotations

import functools
import os
import select
import shlex
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ..config import ConfigError
from .limits import children

NSINIT = Path(__file__).resolve().with_name("nsinit.py")
HOSTIDS = Path(__file__).resolve().with_name("hostids.py")
EMPTY = Path(__file__).resolve().with_name("empty")  # laid over hidden files
NOBODY = 65534  # the code's uid and gid on the host under bwrap started by root
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

    def whole(self) -> bool:
        """Whether it holds everything the strongest kind can (then the header's name for it is enough)."""
        return False

    def unprotected(self) -> str:
        """What this kind leaves open, for the warning ("" for none)."""
        return ""

    def hides(self, path: Path) -> bool:
        """Whether code cannot see this (resolved) path: what the agent reads for it must not show it either."""
        return False

    def close(self) -> None:
        pass


class Unconfined(Sandbox):
    kind = "none"

    def probe(self) -> str:
        return ""

    def describe(self) -> str:
        return "none — code runs as you, with your files, processes and network"

    def unprotected(self) -> str:
        root = (" As root it can also lift its own process and memory limits and write /proc/sys (kernel settings)."
                if os.getuid() == 0 else "")
        return ("it runs as you: it can see the agent's process and environment in /proc and signal it, reach the "
                "host's abstract unix sockets (X11, D-Bus…), and read and write every file you can — your home's "
                "secrets (~/.ssh, ~/.aws, ~/.config…), $MINIAGI_HOME (runs, traces, memory), ./.env and miniagi's "
                f"own installation.{root}")


class NamespaceSandbox(Sandbox):
    """The base of the kinds that run code in a PID namespace under nsinit."""

    def __init__(self, policy: Policy):
        super().__init__(policy)
        # the lifeline: every namespace's init holds the read end; only we hold the write end, so when this
        # process is gone (even SIGKILLed) the inits read end-of-file and end their namespaces
        self._lifeline_read, self._lifeline_write = os.pipe()

    def _nsinit(self, argv: list[str], *flags: str) -> list[str]:
        scoped = ("--scope-sockets",) if sockets_scoped() else ()
        return [sys.executable, "-I", "-S", str(NSINIT), str(self._lifeline_read), *flags, *scoped, "--", *argv]

    def _sockets(self) -> str:
        """What the sandbox line says of the host's abstract unix sockets, when they are in reach."""
        if self.policy.network and not sockets_scoped():
            return "; the host's abstract unix sockets reachable (Landlock ABI 6, Linux 6.12+, is not here)"
        return ""

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
        return find_program("unshare", self.policy.path, self.policy.workdir)

    def launch(self, argv: list[str]) -> Launch:
        flags = [*self.FLAGS, *(() if self.policy.network else ("--net",))]
        inner = self._nsinit(argv, "--drop-privileges", *(f"--hide={folder}" for folder in self.hidden_folders()))
        return Launch(self._launcher([self.program, *flags, *inner], ignore_interrupt=True), (self._lifeline_read,))

    def hidden_folders(self) -> list[Path]:
        """The agent's own folders ($MINIAGI_HOME: runs, their checkpoints, memory), laid over by an empty tmpfs in
        the code's mount namespace; not one that holds the work directory or a --sandbox-allow path."""
        workdir, allowed = _real(self.policy.workdir), [_real(a) for a in self.policy.allowed]
        return [folder for folder in (_real(p) for p in self.policy.hidden) if folder is not None and folder.is_dir()
                and not (workdir and _under(workdir, folder)) and not any(a and _under(a, folder) for a in allowed)]

    def hides(self, path: Path) -> bool:
        return any(_under(Path(path), folder) for folder in self.hidden_folders())

    def describe(self) -> str:
        root = "; code's uid is the host's root" if os.geteuid() == 0 else ""
        return (f"namespace — its own processes only; $MINIAGI_HOME hidden, other files not protected; "
                f"network {'on' if self.policy.network else 'off'}{self._sockets()}{root}")

    def unprotected(self) -> str:
        # unshare maps the code's uid 0 to ours: no unprivileged id could write the work directory here
        root = (" Run as root, its uid 0 is the host's root for files: every file on the system is in its reach "
                "(/proc, with /proc/sys, is read-only)." if os.geteuid() == 0 else "")
        return ("it cannot see or signal the agent, but it can read and write every file you can — your home's "
                "secrets (~/.ssh, ~/.aws, ~/.config…), $MINIAGI_HOME (runs, traces, memory), ./.env and miniagi's "
                f"own installation.{root}")


class HostIds:
    """The namespaces hostids.py makes for a bwrap started by root: a mount namespace where the work directory and
    the --sandbox-allow paths are idmapped (their owner's files are nobody's), and a user namespace where the
    code's uid is nobody outside too. Held as descriptors for the sandbox's life."""

    def __init__(self, paths: list[Path]):
        helper = subprocess.Popen([sys.executable, "-I", "-S", str(HOSTIDS), str(NOBODY), str(NOBODY),
                                   *map(str, paths)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL)
        try:
            ready, _, _ = select.select([helper.stdout], [], [], 30)
            answer = (helper.stdout.readline() if ready else b"error it did not answer").decode().split()
            if answer[:1] != ["ready"]:
                raise OSError(0, " ".join(answer[1:]) or "it ended")
            self.mount_fd = os.open(f"/proc/{answer[1]}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
            self.setup_fd, self.code_fd = (os.open(f"/proc/{answer[1]}/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
                                           for fd in answer[2:4])
        finally:
            helper.stdin.close()
            try:
                helper.wait(timeout=10)
            except subprocess.TimeoutExpired:
                helper.kill()
                helper.wait()

    def close(self) -> None:
        for fd in (self.mount_fd, self.setup_fd, self.code_fd):
            if fd >= 0:
                os.close(fd)
        self.mount_fd = self.setup_fd = self.code_fd = -1


class Bubblewrap(NamespaceSandbox):
    kind = "bwrap"
    NAMESPACES = ("--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try")

    def __init__(self, policy: Policy):
        super().__init__(policy)
        self.no_nested_userns = True  # --disable-userns (bubblewrap 0.8+); dropped when this bwrap refuses it
        self.host_ids: HostIds | None = None  # as root: the code's uid is nobody on the host
        self.host_root = ""  # as root without them: why the code's uid is the host's root
        self._view_rules: dict[Path, tuple[int, str]] | None = None  # what code sees of the system, made once
        self._made: dict[Path, Path] = {}  # mount points bwrap makes in the work directory: the first folder made

    def hides(self, path: Path) -> bool:
        if self._view_rules is None:  # the policy does not change: its rules (homes listed, PATH walked) are made once
            self._view_rules = _rules(self.policy)
        return hidden_from_code(self.policy, path, self._view_rules)

    def _find_program(self) -> str | None:
        return find_program("bwrap", self.policy.path, self.policy.workdir)

    def probe(self) -> str:
        """Why bwrap cannot be used here. When bwrap itself starts but not with this run's mounts, that is no reason
        to fall back (the paths of a work directory are code's to shape: `ln -s .env .env` made the next run drop
        to namespace): a ConfigError that says which."""
        if self.program:
            looping = [path for path, (_, how) in _mounted(_rules(self.policy)).items()
                       if how in ("hide", "ro") and path.is_symlink()]
            if looping:
                raise ConfigError(f"{looping[0]} is a link that leads back to itself: bwrap cannot lay an empty file "
                                  f"over it to hide it; remove it (rm {shlex.quote(str(looping[0]))}) and start again")
        if os.geteuid() == 0 and self.program:
            self.host_root = self._unprivileged()
            if self.host_ids:
                return ""
        why = super().probe()
        if why and self.program:
            self.no_nested_userns = False
            if not super().probe():
                return ""
            self.no_nested_userns = True
        if why and self.program and self._starts_bare():
            raise ConfigError(f"bwrap works here, but not with this run's mounts ({why}); a path in the work "
                              "directory may be in the way: fix it, or choose a weaker --sandbox yourself")
        return why

    def _starts_bare(self) -> bool:
        """Whether a bwrap that mounts nothing of the run's starts here (the system gives it user namespaces)."""
        for nested in (("--disable-userns",), ()):
            argv = [self.program, "--unshare-user", *nested, "--cap-drop", "ALL", *self.NAMESPACES,
                    *(() if self.policy.network else ("--unshare-net",)), "--ro-bind", "/", "/", "--dev", "/dev",
                    "--proc", "/proc", "--", "true"]
            try:
                if subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, timeout=30).returncode == 0:
                    return True
            except (OSError, subprocess.TimeoutExpired):
                return False
        return False

    def _unprivileged(self) -> str:
        """Run the code as nobody on the host (see hostids.py); why not, when that cannot be had here."""
        self.nsenter = find_program("nsenter", self.policy.path, self.policy.workdir)
        if self.nsenter is None:
            return "no nsenter"
        paths = [p for p in (_real(a) for a in (self.policy.workdir, *self.policy.allowed)) if p is not None]
        try:
            self.host_ids = HostIds([p for p in paths if not any(_under(p, q) for q in paths if q != p)])
        except OSError as exc:
            return str(exc.strerror or exc)
        why = super().probe()
        if why:
            self.host_ids.close()
            self.host_ids = None
        return why

    def launch(self, argv: list[str]) -> Launch:
        prefix, fds, inits = [], [self._lifeline_read], ()
        if self.host_ids:  # bwrap in the idmapped mount namespace; nsinit drops what it leaves
            ids = self.host_ids
            prefix = [self.nsenter, f"--mount=/proc/self/fd/{ids.mount_fd}", "--"]
            # bwrap, in the code's namespace where the host's root is not mapped, would leave it the host's uid 0
            # with no capability to give it up: nsinit gets them all there, takes that namespace's uid 0 (nobody
            # outside) and drops them
            users = ["--userns", str(ids.setup_fd), "--userns2", str(ids.code_fd), "--cap-add", "ALL"]
            fds += [ids.mount_fd, ids.setup_fd, ids.code_fd]
            inits = ("--become-root",)
        else:
            users = ["--unshare-user", *(("--disable-userns",) if self.no_nested_userns else ()), "--cap-drop", "ALL"]
        rules = _rules(self.policy)
        for path, (_, how) in rules.items():
            if how in ("hide", "blank") and not os.path.lexists(path) and path not in self._made:
                self._made[path] = next(p for p in (*reversed(path.parents), path) if not os.path.lexists(p))
        flags = [*users, *self.NAMESPACES, *(() if self.policy.network else ("--unshare-net",)),
                 "--as-pid-1", *file_system(self.policy, rules), "--chdir", str(self.policy.workdir)]
        argv = [*prefix, self.program, *flags, "--", *self._nsinit(argv, *inits)]
        return Launch(self._launcher(argv, ignore_interrupt=True), tuple(fds))

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        return dict(env, TMPDIR="/tmp")  # the one /tmp it can write

    def whole(self) -> bool:
        return (self.host_ids is not None or os.geteuid() != 0) and not self._sockets()

    def describe(self) -> str:
        who = ""
        if self.host_ids:
            who = "; code runs as nobody"
        elif os.geteuid() == 0:
            who = f"; code's uid is the host's root ({self.host_root or 'no idmapped mount here'})"
        mode = "read-write" if os.access(self.policy.workdir, os.W_OK) else "read-only (not writable by you)"
        return (f"bwrap — work directory {mode}, private /tmp, the rest read-only; $MINIAGI_HOME and .env hidden, "
                f"homes empty; network {'on' if self.policy.network else 'off'}{self._sockets()}{who}")

    def close(self) -> None:
        if self.host_ids:
            self.host_ids.close()
            self.host_ids = None
        super().close()
        # what bwrap made to lay an empty read-only file or folder where none was goes (an empty ~/.bash_profile
        # left behind would keep a login shell from reading ~/.profile); what is no longer empty stays
        for path, first in sorted(self._made.items(), key=lambda made: -len(made[0].parts)):  # deepest first
            for made in (path, *path.parents):
                if not _remove_if_empty(made) or made == first:
                    break
        self._made = {}


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


def find_program(name: str, path: str | None, workdir: Path | None = None) -> str | None:
    """A program the agent starts outside the sandbox (bwrap, unshare, nsenter, bash), looked for only in the PATH's
    folders code cannot have planted it in: absolute ones, outside the work directory and every folder code has run
    in (the trust record's list). A `bwrap` that run 1's code put in a PATH folder of the work directory (or a
    relative one, node_modules/.bin) ran as the user at run 2."""
    from ..trust import TrustRecord

    reach = [str(p) for p in (_real(workdir) if workdir else None,) if p] + TrustRecord().code_dirs
    folders = [entry for entry in (path if path is not None else os.defpath).split(os.pathsep)
               if entry.startswith("/") and not any(_under(Path(os.path.realpath(entry)), Path(place))
                                                    for place in reach)]
    return shutil.which(name, path=os.pathsep.join(folders)) if folders else None


def _rules(policy: Policy) -> dict[Path, tuple[int, str]]:
    """Each path bwrap mounts, with its rank and how: "rw", "ro" or "hide"."""
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
    # every home is an empty directory, but for the work directory (and --sandbox-allow) bound back into it;
    # a home the work directory holds is the work directory's to show
    homes = [h for h in homes_of_users() if not (workdir and _under(h, workdir))]
    hidden = [p for p in (_real(path) for path in (*policy.hidden, *secrets, *map(Path, SYSTEM_SECRETS),
                                                    Path("/run"), Path("/var/run"))) if p is not None]
    rule(workdir, "rw", 0)
    for path in [*homes, *hidden]:
        rule(path, "hide", 2)
    # the interpreter and packages the worker and nsinit run from, and the programs of the PATH, wherever a rule
    # above would touch them (a version manager's shims need its root: pyenv, rbenv, nodenv, asdf)
    covered = [Path("/tmp"), *([workdir] if workdir else []), *homes, *hidden]
    entries = [Path(entry) for entry in (policy.path or "").split(os.pathsep) if entry.startswith("/")]
    programs = [p for p in map(_real, entries) if p is not None and p.is_dir()]
    programs = [p.parent if p.name == "shims" else p for p in programs]
    programs = [p for p in programs if not any(_under(p, secret) for secret in hidden)]
    for path in [*_installation(), *programs]:
        if any(_under(path, place) for place in covered):
            rule(path, "ro", 1)
    # a PATH folder of the work directory's that does not exist yet (WORK/bin, .venv/bin before the venv): code
    # would make it and plant programs the user's shell, or the next run, starts as the user; an empty read-only
    # folder is laid on the first missing folder of its path instead (.venv: code cannot make the venv this run)
    for path in (Path(os.path.realpath(entry)) for entry in entries if _real(entry) is None):
        if workdir and _under(path, workdir) and path != workdir:
            rule(next(p for p in (*reversed(path.parents), path) if not os.path.lexists(p)), "hide", 1)
    # what the user's shell and Python run at their next start, where code could write it (the home is, or is in,
    # the work directory: a .pth code put in the user site ran at the next `miniagi runs`): read-only, and where it
    # is missing, an empty read-only one, made for the run and taken away after (see Bubblewrap.close). Each is
    # kept by its first folder under the work directory: a deeper mount could be moved away with its parent
    for path, is_folder in _run_at_start():
        real = Path(os.path.realpath(path))
        if workdir and _under(real, workdir) and real != workdir:
            top = workdir / real.relative_to(workdir).parts[0]
            rule(top, "ro" if os.path.lexists(top) else "hide" if is_folder or top != real else "blank", 1)
    resolver = _real(Path("/etc/resolv.conf"))  # often a link into /run (systemd-resolved, resolvconf)
    if resolver and _under(resolver, Path("/run")):
        rule(resolver, "ro", 1)
    for path in allowed:
        rule(path, "rw" if workdir and _under(path, workdir) else "ro", 3)
    return _pinned(rules, workdir)


def _pinned(rules: dict[Path, tuple[int, str]], workdir: Path | None) -> dict[Path, tuple[int, str]]:
    """The rules, and each folder between the work directory and what they keep from code bound onto itself: code
    can rename a folder of the work directory, and what is mounted in it goes along (`mv .cargo x; mkdir -p
    .cargo/bin` and a planted cargo is on the PATH again); a mount point cannot be renamed or removed."""
    for path, (_, how) in list(rules.items()):
        if how != "rw" and workdir and _under(path, workdir):
            for above in path.parents:
                if not _under(above, workdir) or above == workdir:
                    break
                rules.setdefault(above, (0, "rw"))
    return rules


def hidden_from_code(policy: Policy, path: Path, rules: dict[Path, tuple[int, str]] | None = None) -> bool:
    """Whether bwrap's view keeps this path (taken as it is: resolve it first) from code: its most specific rule
    hides it, or it lies in the host's /tmp, which code sees a private one in place of. `rules`: the policy's, when
    already made (making them lists the homes and walks the PATH)."""
    rules = dict(_rules(policy) if rules is None else rules)
    rules.setdefault(Path("/tmp"), (0, "hide"))
    enclosing = [p for p in rules if _under(Path(path), p)]
    return bool(enclosing) and rules[max(enclosing, key=lambda p: len(p.parts))][1] == "hide"


def file_system(policy: Policy, rules: dict[Path, tuple[int, str]] | None = None) -> list[str]:
    """bwrap's mounts: the system read-only, the work directory read-write, a private /tmp; the agent's files, the
    home's secrets and /run hidden; miniagi's installation read-only wherever it is; the --sandbox-allow paths
    reopened. A deeper path is mounted later, so the most specific rule wins."""
    rules = _mounted(_rules(policy) if rules is None else rules)
    # /proc read-only: /proc/sys and /proc/sysrq-trigger check the uid, not capabilities
    args = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--remount-ro", "/proc",
            "--size", str(policy.tmp_bytes), "--perms", "1777", "--tmpfs", "/tmp"]
    remount, made = [], set()
    def folder(path: Path) -> bool:  # hidden as an empty folder: a folder, or a PATH folder not made yet
        return path.is_dir() or not os.path.lexists(path)

    fresh = [Path("/tmp"), *(p for p, (_, how) in rules.items() if how == "hide" and folder(p))]  # tmpfs
    for path in sorted(rules, key=lambda p: len(p.parts)):
        how = rules[path][1]
        # the directories leading to a mount point in a tmpfs, made world-searchable (bwrap would copy the mode
        # of the host's, 0700 for a pytest or a user's folder, which code running as nobody could not cross)
        for above in reversed(path.parents):
            enclosing = max((p for p in (*fresh, *rules) if above != p and _under(above, p)),
                            key=lambda p: len(p.parts), default=None)
            if enclosing in fresh and above not in made and above not in rules:
                args += ["--perms", "0755", "--dir", str(above)]
                made.add(above)
        if how == "hide" and folder(path):
            args += ["--tmpfs", str(path)]
            remount.append(str(path))  # read-only last, once the mounts inside it are made
        elif how in ("hide", "blank"):
            args += ["--ro-bind", _empty_file(), str(path)]
        else:
            args += ["--bind" if how == "rw" else "--ro-bind", str(path), str(path)]
    for path in reversed(remount):
        args += ["--remount-ro", path]
    return args


def _remove_if_empty(path: Path) -> bool:
    """Remove an empty folder or empty regular file (never a link); whether it was removed."""
    try:
        status = os.lstat(path)
        if stat.S_ISDIR(status.st_mode):
            os.rmdir(path)
        elif stat.S_ISREG(status.st_mode) and status.st_size == 0:
            os.unlink(path)
        else:
            return False
    except OSError:
        return False
    return True


def _run_at_start() -> list[tuple[Path, bool]]:
    """The folders and files the user's shells and Python run code from when they start (path, is a folder)."""
    import site

    home = Path.home()
    folders = [Path(site.getusersitepackages()), home / ".local" / "bin", home / "bin"]
    files = [home / name for name in (".bashrc", ".profile", ".bash_profile", ".bash_login", ".zshrc", ".zshenv",
                                      ".zprofile", ".zlogin")]
    return [(path, True) for path in folders] + [(path, False) for path in files]


def _mounted(rules: dict[Path, tuple[int, str]]) -> dict[Path, tuple[int, str]]:
    """The rules bwrap is given: one read-only bind covers those below it, and a hidden directory what it holds
    (~/.ssh in an empty home is missing, not an empty mount point)."""
    rules = dict(rules)
    for path in [p for p, (_, how) in rules.items() if how in ("ro", "hide")]:
        enclosing = [p for p in rules if p != path and _under(path, p)]
        if enclosing and rules[max(enclosing, key=lambda p: len(p.parts))][1] == rules[path][1]:
            del rules[path]
    return rules


def _empty_file() -> str:
    """An empty regular file to lay over a hidden file, read-only: /dev/null, bound without its device (bwrap's
    binds are nodev), reads as "Permission denied" instead of the empty file the docs promise. It ships with
    miniagi; should code under a weaker kind have written into it, /dev/null it is."""
    return str(EMPTY) if EMPTY.is_file() and EMPTY.stat().st_size == 0 else "/dev/null"


@functools.lru_cache(maxsize=1)
def sockets_scoped() -> bool:
    """Whether Landlock can keep code from the host's abstract unix sockets here (ABI 6, Linux 6.12+): nsinit
    then scopes every namespace kind's code (see nsinit.scope_abstract_sockets)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc.syscall(444, None, 0, 1) >= 6  # landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)


def homes_of_users() -> list[Path]:
    """Where users keep their files: $HOME, the user's home in the password database, /root and what /home
    holds (their links resolved)."""
    import pwd

    places = [Path("/root")]
    try:
        places += [Path.home(), Path(pwd.getpwuid(os.getuid()).pw_dir)]
    except (KeyError, RuntimeError):
        pass
    try:
        places += [entry for entry in Path("/home").iterdir() if entry.is_dir()]
    except OSError:
        pass
    return [p for p in dict.fromkeys(_real(place) for place in places) if p is not None and p != Path("/")]


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
