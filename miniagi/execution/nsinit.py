"""PID 1 of the namespace that executed code runs in (see sandbox.py). Standard library only: it is started as
`python -I -S nsinit.py LIFELINE_FD [--drop-privileges | --become-root] [--scope-sockets] -- COMMAND…`, before
any of miniagi could be imported.

It starts COMMAND, reaps every process that ends in the namespace (orphans are handed to PID 1, and nobody else
would collect them: 200 zombies once used up the run's process allowance), and exits with COMMAND's status —
which, PID 1 being gone, ends every process left in the namespace. It also ends everything when the agent is
gone (LIFELINE_FD, a pipe whose other end only the agent holds, reads end-of-file), so code that loops forever
does not outlive an agent that was killed.

With --drop-privileges (the namespace sandbox, made by `unshare --user --map-root-user`, where the code would
otherwise hold every capability of its user namespace, and as real root, write access to every root-owned file),
it first remounts the cgroup file systems read-only, so the run's process and memory caps cannot be raised or
left, and /proc and /sys (whose /proc/sys and kernel knobs a uid 0 that is the host's root could write), then
drops every capability for good: `umount /proc` can no longer bring the host's /proc back.

With --become-root (bwrap started by root, see hostids.py: bwrap leaves it every capability of a user namespace
where the host's root is not mapped), it takes that namespace's uid and gid 0 (nobody outside) and no
supplementary group, then drops every capability the same way.

Always, it forbids what would leave a setuid or setgid file behind (see forbid_set_id_modes): the work directory is
written as its owner, often the host's root, and such a file would run as that owner for anyone. The same filter
refuses every call of another architecture's (i386's `int 0x80`) and io_uring, whose operations seccomp never sees.

Always, it refuses fallocate and io_uring (see forbid_allocation): --exec-disk then holds within one command.

With --hide=FOLDER (the namespace sandbox, for each folder it hides: the agent's home, with its runs and their
checkpoints), it first lays an empty read-only tmpfs over the folder; without privileges code cannot take it away.

With --scope-sockets it puts itself, and so everything it starts, in a Landlock domain that reaches no abstract
unix socket of the host (see scope_abstract_sockets).
"""

import os
import select
import signal
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_RELATIME = 1, 2, 4, 8, 32, 4096, 1 << 21
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 24, 38, 22, 2
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_RESTRICT_SELF = 444, 446  # asm-generic numbers: x86_64 and aarch64
LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET, LANDLOCK_SCOPE_SIGNAL = 1, 2
# statvfs flags that a remount must keep (they may be locked), mapped to mount flags
KEPT_FLAGS = ((os.ST_NOSUID, 2), (os.ST_NODEV, 4), (os.ST_NOEXEC, 8), (os.ST_NOATIME, 1024),
              (os.ST_NODIRATIME, 2048), (os.ST_RELATIME, MS_RELATIME))


def _libc():
    """The C library, its errors in ctypes' errno (ctypes is imported only when a flag needs it)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _check(result: int, what: str) -> int:
    """A system call's result; an OSError naming `what` when it failed (a negative result)."""
    if result < 0:
        import ctypes

        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")
    return result


def _host_root() -> bool:
    """Whether uid 0 here is the host's root (the namespace maps it to 0 outside)."""
    try:
        with open("/proc/self/uid_map") as mapping:
            return any(line.split()[:2] == ["0", "0"] for line in mapping)
    except OSError:
        return True


def hide(folders: list[str]) -> None:
    """An empty, read-only tmpfs over each folder: what the agent keeps there is out of the code's sight and reach."""
    libc = _libc()
    for folder in folders:
        _check(libc.mount(b"hidden", folder.encode(), b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                          b"size=4k,mode=0"), f"hiding {folder}")


def drop_privileges(remount: bool = True) -> None:
    import ctypes

    libc, check = _libc(), _check
    with open("/proc/self/mounts") as mounts:
        table = [fields for fields in map(str.split, mounts) if len(fields) > 2]
    cgroups = [fields[1] for fields in table if fields[2] in ("cgroup", "cgroup2") or fields[1] == "/sys/fs/cgroup"]
    # /proc and /sys too: as real root, code's uid 0 is the host's for /proc/sys (kernel.core_pattern runs a
    # program as root at the next crash), /proc/sysrq-trigger and the kernel's knobs under /sys (module
    # parameters, transparent_hugepage, uevent_helper where it exists), whatever capabilities it lacks
    # (as a user, the host's /sys is root's and code cannot write it: a mount of it it cannot remount is left)
    system = [fields[1] for fields in table if fields[1] == "/sys" or fields[1].startswith("/sys/")]
    points = list(dict.fromkeys([*cgroups, *system, "/proc"])) if remount else []
    for point in points:
        try:
            kept = os.statvfs(point).f_flag
            flags = MS_REMOUNT | MS_BIND | MS_RDONLY | sum(flag for st, flag in KEPT_FLAGS if kept & st)
            check(libc.mount(None, point.encode(), None, flags, None), f"remounting {point} read-only")
        except OSError:
            if point in system and point not in cgroups and not _host_root():
                continue
            raise
    with open("/proc/sys/kernel/cap_last_cap") as last:
        for capability in range(int(last.read()) + 1):
            check(libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0), "dropping the capability bounding set")

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    none = (Data * 2)()
    check(libc.capset(ctypes.byref(Header(0x20080522, 0)), none), "dropping capabilities")
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "setting no_new_privs")


# the system calls that can give a file a mode, by architecture: (number, index of the mode argument), or None as
# the index for those refused whatever their arguments (openat2's mode is in a struct; file capabilities are xattrs)
SET_ID_CALLS = {
    0xC000003E: ((90, 1), (91, 1), (268, 2), (452, 2), (2, 2), (85, 1), (257, 3), (83, 1), (258, 2), (133, 1),
                 (259, 2), (437, None), (188, None), (189, None), (190, None), (463, None)),  # x86_64
    0xC00000B7: ((52, 1), (53, 2), (452, 2), (56, 3), (34, 2), (33, 2), (437, None), (5, None), (6, None),
                 (7, None), (463, None)),  # aarch64
}
SET_ID_BITS = 0o6000


def forbid_set_id_modes() -> None:
    """A seccomp filter: chmod, open, mkdir and mknod (every variant) fail with EPERM when the mode asks for the
    setuid or setgid bit, and file capabilities (extended attributes) cannot be set. Files that code writes are
    stored under the work directory's owner (as root, the host's root): such a file would be a way in for any local
    user. Every call made through another architecture's entry (i386's `int 0x80` on x86_64, arm32 on aarch64:
    numbers of their own, none of them checked here) and io_uring (whose operations, IORING_OP_OPENAT among them,
    never pass seccomp) fail with ENOSYS. Other machines are left as they are (the docs say so)."""
    arch = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}.get(os.uname().machine)  # (platform: a slow import)
    if arch is None:
        return
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    calls = SET_ID_CALLS[arch]
    # the program, with jumps to labels: ("ALLOW"), ("DENY"), ("NOSYS") or ("arg", i): the check of the i-th call's
    # mode
    program: list[tuple] = [(ld, 4), (jeq, arch, None, "NOSYS"), (ld, 0), (jge, 0x40000000, "DENY", None)]
    program += [(jeq, nr, "NOSYS", None) for nr in IO_URING]
    program += [(jeq, nr, ("arg", i), None) for i, (nr, _) in enumerate(calls)]
    program.append((ret, allow))
    where: dict = {}
    for i, (_, index) in enumerate(calls):
        where[("arg", i)] = len(program)
        program += [(ld, 16 + 8 * index), (jset, SET_ID_BITS, "DENY", "ALLOW")] if index is not None else [
            (ret, deny)]
    where["DENY"], where["ALLOW"], where["NOSYS"] = len(program), len(program) + 1, len(program) + 2
    program += [(ret, deny), (ret, allow), (ret, NOSYS)]
    _seccomp(program, where, "forbidding setuid and setgid files (seccomp)")


FALLOCATE = {0xC000003E: 285, 0xC00000B7: 47}  # x86_64, aarch64
I386, I386_FALLOCATE, X32 = 0x40000003, 324, 0x40000000
IO_URING = (425, 426, 427)  # io_uring_setup, _enter, _register: the same numbers on x86_64, i386 and aarch64
NOSYS = 0x00050000 | 38  # SECCOMP_RET_ERRNO | ENOSYS: "not here", and programs (liburing's users) fall back


def forbid_allocation() -> None:
    """A seccomp filter: fallocate (posix_fallocate, `fallocate`) fails with EOPNOTSUPP, so no call gives a file
    blocks without writing them. An allocation is instant, and --exec-disk's meter, which samples, could not stop
    one command of them in time (60 x 20 MB under a 20 MB limit); a program falls back to writing (glibc's
    posix_fallocate does), and what it writes is counted and capped (RLIMIT_FSIZE) like any write. io_uring fails
    with ENOSYS: its operations never pass seccomp (IORING_OP_FALLOCATE left 40 x 15 MB under a 20 MB limit)."""
    arch = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}.get(os.uname().machine)  # (platform: a slow import)
    if arch is None:
        return
    ld, jeq, ret = 0x20, 0x15, 0x06
    allow, unsupported = 0x7FFF0000, 0x00050000 | 95  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EOPNOTSUPP
    program: list[tuple] = [(ld, 4)]
    if arch == 0xC000003E:  # 32-bit programs have their own numbers
        program.append((jeq, I386, "I386", None))
    program += [(jeq, arch, None, "ALLOW"), (ld, 0), *((jeq, nr | x32, "NOSYS", None) for nr in IO_URING
                                                         for x32 in (0, X32)),
                (jeq, FALLOCATE[arch], "REFUSE", None), (jeq, FALLOCATE[arch] | X32, "REFUSE", "ALLOW")]
    where = {"I386": len(program)}
    program += [(ld, 0), *((jeq, nr, "NOSYS", None) for nr in IO_URING), (jeq, I386_FALLOCATE, "REFUSE", "ALLOW")]
    where["REFUSE"], where["ALLOW"], where["NOSYS"] = len(program), len(program) + 1, len(program) + 2
    program += [(ret, unsupported), (ret, allow), (ret, NOSYS)]
    _seccomp(program, where, "refusing fallocate (seccomp)")


def _seccomp(program: list[tuple], where: dict, what: str) -> None:
    """Install a seccomp filter: each instruction (code, k) or (code, k, label if true, label if false), a label
    an index in `where` (None: the next instruction)."""
    import ctypes

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                    ("k", ctypes.c_uint32)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Filter))]

    def offset(at: int, label) -> int:
        return 0 if label is None else where[label] - at - 1

    compiled = (Filter * len(program))(*[
        Filter(op[0], offset(at, op[2]), offset(at, op[3]), op[1]) if len(op) == 4 else Filter(op[0], 0, 0, op[1])
        for at, op in enumerate(program)])
    libc = _libc()
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "setting no_new_privs")
    _check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(Program(len(program), compiled)), 0, 0),
           what)


def scope_abstract_sockets() -> None:
    """Landlock (Linux 6.12+, ABI 6): this process and all it starts can no longer connect to an abstract unix
    socket made outside of it (X11's @/tmp/.X11-unix/X0, D-Bus, containerd…) nor signal a process outside.
    Abstract sockets belong to a network namespace, which code with the network on shares with the host."""
    import ctypes

    libc, check = _libc(), _check

    class Ruleset(ctypes.Structure):
        _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                    ("scoped", ctypes.c_uint64)]

    ruleset = Ruleset(0, 0, LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | LANDLOCK_SCOPE_SIGNAL)
    fd = check(libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(ruleset), ctypes.sizeof(ruleset), 0),
               "creating a Landlock ruleset")
    try:
        check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "setting no_new_privs")
        check(libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, fd, 0), "scoping abstract unix sockets (Landlock)")
    finally:
        os.close(fd)


def main() -> int:
    lifeline = int(sys.argv[1])
    flags, argv = sys.argv[2:sys.argv.index("--")], sys.argv[sys.argv.index("--") + 1:]
    try:
        if "--drop-privileges" in flags or "--become-root" in flags:
            if "--become-root" in flags:  # bwrap started by root: become the namespace's root, nobody outside
                os.setgroups([])
                os.setresgid(0, 0, 0)
                os.setresuid(0, 0, 0)
            hide([flag.removeprefix("--hide=") for flag in flags if flag.startswith("--hide=")])
            drop_privileges(remount="--drop-privileges" in flags)
        # (also under a user's bwrap: a setuid file of the user's would run as that user for anyone)
        forbid_set_id_modes()
    except OSError as exc:  # never run code with privileges it was meant not to have
        print(f"nsinit: {exc.strerror}", file=sys.stderr)
        return 125
    try:
        forbid_allocation()
    except OSError as exc:  # --exec-disk's meter still counts what is written: said, and the code runs
        print(f"nsinit: {exc.strerror}", file=sys.stderr)
    if "--scope-sockets" in flags:
        try:
            scope_abstract_sockets()
        except OSError as exc:  # the sandbox line said they are out of reach
            print(f"nsinit: {exc.strerror}", file=sys.stderr)
            return 125
    # interrupts are for the command: the agent sends SIGINT to the whole process group on a timeout
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    command = os.fork()
    if command == 0:
        os.close(lifeline)
        signal.set_wakeup_fd(-1)
        for fd in (wake_read, wake_write):
            os.close(fd)
        for signum in (signal.SIGINT, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        try:
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    return reap(command, wake_read, lifeline)


def reap(command: int, wake_read: int, lifeline: int) -> int:
    """As the namespace's init: collect every process that ends (orphans are re-parented here) until the command
    has, and return its exit code (128 + N for a signal); woken by SIGCHLD through `wake_read`, and 137 once the
    agent, the other end of `lifeline`, is gone."""
    while True:
        while True:  # collect every process that has ended
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return 0
            if pid == 0:
                break
            if pid == command:
                code = os.waitstatus_to_exitcode(status)
                return code if code >= 0 else 128 - code
        ready, _, _ = select.select([wake_read, lifeline], [], [])
        if lifeline in ready:  # the agent is gone
            return 137
        os.read(wake_read, 4096)


if __name__ == "__main__":
    sys.exit(main())
