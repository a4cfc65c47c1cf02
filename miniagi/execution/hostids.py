"""What makes uid 0 in the bwrap sandbox something other than the host's root, when miniagi runs as root. Standard
library only: it is started once per sandbox as `python -I -S hostids.py UID GID PATH…`, before any of miniagi
could be imported.

bubblewrap, run by root, maps the code's uid to root outside, whatever uid it shows inside: the kernel then lets
it write /proc/sys and every root-owned file that is mounted writable. So, as root, miniagi gives bwrap a user
namespace of its own making (`bwrap --userns`), in which the code's uid is UID outside too (65534, nobody); the
host's root stays mapped only for bwrap's own set-up (the code, with no capability and no_new_privs, cannot get
it back), and the namespace may hold no user namespace of its own (what `--disable-userns` does).

For the code to write the work directory as nobody, each PATH (the work directory, and the --sandbox-allow paths)
is mounted over itself as an idmapped mount (Linux 5.12+), in a mount namespace of its own: there its owner's files
are nobody's, and what nobody creates there is its owner's on the disk. bwrap is started in that mount namespace.

It prints `ready PID FD` (FD: its descriptor of the user namespace, which the agent opens through /proc/PID/fd/FD,
with /proc/PID/ns/mnt) or `error WHY`, then waits for the end of its standard input.
"""

import ctypes
import os
import sys

CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
MS_REC, MS_PRIVATE = 0x4000, 0x40000
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442  # the same on x86_64 and aarch64 (asm-generic)
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC, AT_RECURSIVE, AT_EMPTY_PATH, AT_FDCWD = 1, 0o2000000, 0x8000, 0x1000, -100
MOVE_MOUNT_F_EMPTY_PATH, MOUNT_ATTR_IDMAP = 4, 0x00100000

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def check(result: int, what: str) -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")
    return result


def user_namespaces(levels: list[tuple[str, str, bool]]) -> list[int]:
    """A chain of new user namespaces, each inside the one before, as descriptors: for each level its uid map,
    gid map (in the terms of the level above) and whether it may hold no user namespace of its own. Each is made
    by a child process of the one that made the level above, which writes its maps (only the parent namespace
    may); the processes are held until every descriptor is open."""
    status_read, status_write = os.pipe()
    hold_read, hold_write = os.pipe()
    try:
        _make(levels, [], status_write, hold_read, (status_read, hold_write))
        os.close(status_write)
        status_write = -1
        answer = os.read(status_read, 4096).decode()
        if not answer.startswith("ok "):
            raise OSError(0, answer[1:] or "a namespace's maker ended")
        return [os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC) for pid in answer.split()[1:]]
    finally:
        for fd in (status_write, status_read, hold_read, hold_write):
            if fd >= 0:
                os.close(fd)
        while True:
            try:
                os.wait()
            except ChildProcessError:
                break


def _make(levels: list[tuple[str, str, bool]], pids: list[int], status: int, hold: int,
          others: tuple[int, ...]) -> None:
    """Start the maker of levels[0] and write its maps (we are in the namespace above it). The maker closes the
    others' ends (the hold pipe's write end above all: it waits for its end-of-file)."""
    uid_map, gid_map, no_nesting = levels[0]
    up_read, up_write = os.pipe()
    go_read, go_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            for fd in (up_read, go_write, *others):
                os.close(fd)
            check(libc.unshare(CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
            os.write(up_write, b"u")
            if os.read(go_read, 1) != b"m":  # our maps are written
                os._exit(1)
            if no_nesting:
                with open("/proc/sys/user/max_user_namespaces", "w") as limit:
                    limit.write("0")
            if levels[1:]:
                _make(levels[1:], [*pids, os.getpid()], status, hold, ())
            else:
                os.write(status, " ".join(["ok", *map(str, pids), str(os.getpid())]).encode())
            os.read(hold, 1)  # until every descriptor is open
            os._exit(0)
        except OSError as exc:
            os.write(status, b"e" + str(exc).encode()[:400])
            os._exit(1)
    os.close(up_write)
    os.close(go_read)
    try:
        if os.read(up_read, 1) == b"u":
            for name, text in (("uid_map", uid_map), ("gid_map", gid_map)):
                with open(f"/proc/{pid}/{name}", "w") as mapping:
                    mapping.write(text)
            os.write(go_write, b"m")
    finally:
        os.close(up_read)
        os.close(go_write)


def idmap(path: str, uid: int, gid: int) -> None:
    """Mount PATH over itself with its owner's ids shown as UID and GID (and UID's files stored as the owner's)."""
    owner = os.stat(path)
    (mapping,) = user_namespaces([(f"{owner.st_uid} {uid} 1\n", f"{owner.st_gid} {gid} 1\n", False)])
    try:
        attr = MountAttr(MOUNT_ATTR_IDMAP, 0, 0, mapping)
        for flags in (AT_RECURSIVE, 0):  # a mount below it that cannot be idmapped: the top one alone
            tree = check(libc.syscall(SYS_OPEN_TREE, AT_FDCWD, path.encode(),
                                      OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | flags), f"open_tree({path})")
            try:
                if libc.syscall(SYS_MOUNT_SETATTR, tree, b"", AT_EMPTY_PATH | flags, ctypes.byref(attr),
                                ctypes.sizeof(attr)) == 0:
                    check(libc.syscall(SYS_MOVE_MOUNT, tree, b"", AT_FDCWD, path.encode(), MOVE_MOUNT_F_EMPTY_PATH),
                          f"move_mount({path})")
                    return
                if flags == 0:
                    check(-1, f"idmapping {path}")
            finally:
                os.close(tree)
    finally:
        os.close(mapping)


def main() -> int:
    uid, gid, paths = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    try:
        check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "making / private")
        for path in paths:
            idmap(path, uid, gid)
        # bwrap's set-up, as the host's root; then the code's, where its uid 0 is UID outside
        setup, code = user_namespaces([(f"0 0 1\n{uid} {uid} 1\n", f"0 0 1\n{gid} {gid} 1\n", False),
                                       (f"0 {uid} 1\n", f"0 {gid} 1\n", True)])
    except OSError as exc:
        print("error", exc.strerror or exc, flush=True)
        return 1
    print("ready", os.getpid(), setup, code, flush=True)
    sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main())
