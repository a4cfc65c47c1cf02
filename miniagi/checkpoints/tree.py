"""A work directory as checkpoints see it: each path's `Entry` (a file's mode and content, a link's target, a
folder's mode), found by one walk that reads only the files whose stat moved since the walk before.

The walk goes through directory descriptors opened without following links: a folder swapped for a link while it
is walked is not entered, and a link is recorded as a link, never followed. Ignored folders (version control,
dependencies, virtual environments, caches) are not entered at all."""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
# folders never kept: their own tools keep them (.git), or they are made again from what is kept (dependencies,
# environments, caches)
IGNORED_FOLDERS = frozenset({
    ".git", ".hg", ".svn", ".jj", "node_modules", "__pycache__", ".venv", "venv", ".mypy_cache", ".pytest_cache",
    ".ruff_cache", ".tox", ".nox", ".cache", ".ipynb_checkpoints", ".gradle", ".terraform",
})
ENVIRONMENT_MARKS = frozenset({"pyvenv.cfg", "conda-meta"})  # a folder holding one of these is a virtual environment
# timestamps come from a coarse clock: a file written again this soon after a walk may keep its stat, so such a
# file is read again on the next walk (git's "racily clean" entries); on a file system that keeps whole seconds
# only (its change times end in 0 ns), within the second too
RACY_NS = 50_000_000
RACY_WHOLE_SECONDS_NS = 1_050_000_000
MAX_PATHS = 200_000  # a tree larger than this is no work directory to keep (a home, a disk): checkpoints stop


class TooLarge(Exception):
    """The tree is too large to keep at every step."""


@dataclass(frozen=True, slots=True)
class Entry:
    kind: str  # "file", "link" or "folder"
    mode: int = 0  # permission bits (files and folders)
    size: int = 0  # bytes (files)
    digest: str = ""  # sha256 of a file's content, "" when its content is not kept
    target: str = ""  # where a link points
    not_kept: str = ""  # why a file's content is not kept ("over 50 MB", "holds a secret", "unreadable")

    def to_json(self) -> dict:
        data: dict = {"kind": self.kind}
        if self.kind != "link":
            data["mode"] = self.mode
        if self.kind == "file":
            data.update(size=self.size, digest=self.digest)
            if self.not_kept:
                data["not_kept"] = self.not_kept
        if self.kind == "link":
            data["target"] = self.target
        return data

    @classmethod
    def from_json(cls, data: dict | None) -> Entry | None:
        if data is None:
            return None
        return cls(str(data["kind"]), int(data.get("mode", 0)), int(data.get("size", 0)), str(data.get("digest", "")),
                   str(data.get("target", "")), str(data.get("not_kept", "")))

    def same_as(self, other: Entry | None) -> bool:
        """Whether `other` holds the same thing. A file whose content was not kept is known by its size only."""
        if other is None or (self.kind, self.mode, self.target) != (other.kind, other.mode, other.target):
            return False
        if self.kind != "file":
            return True
        if self.digest and other.digest:
            return self.digest == other.digest
        return self.size == other.size


def signature(info: os.stat_result) -> tuple:
    """What tells that a path may have changed without reading it."""
    return info.st_mode, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino


# reads a regular file (an open descriptor, its stat, its path) into the store: its Entry
Keep = Callable[[int, os.stat_result, str], Entry]


@dataclass
class Walk:
    """What one walk found: every path's stat signature and entry, and what it left out."""

    entries: dict[str, tuple[tuple, Entry]]
    fresh: list[str]  # the paths whose entry was made anew (the others are as the walk before found them)
    ignored: list[str]  # folders not entered
    started_ns: int


def _listing(folder: int, prefix: str, seen: int) -> list[os.DirEntry] | None:
    """What a folder holds; None for a folder below the top that code made unreadable (what it holds is not seen)."""
    try:
        with os.scandir(folder) as listing:
            found = list(listing)
    except OSError:
        if not prefix:
            raise
        return None
    if seen + len(found) > MAX_PATHS:
        raise TooLarge(f"the work directory holds over {MAX_PATHS:,} files and folders")
    return found


def walk(root: str, previous: dict[str, tuple[tuple, Entry]], keep: Keep, racy_before: int = 0,
         skip: frozenset[str] = frozenset()) -> Walk:
    """The tree under root. A path whose signature is as in `previous` keeps its entry, unless it was written
    within RACY_NS of the walk before (`racy_before`: when that walk started); every other regular file is read
    through `keep`. Sockets, FIFOs and devices are left out, and so are the folders in `skip` (miniagi's own home,
    when the work directory holds it: the checkpoints would keep themselves)."""
    started = time.time_ns()
    settled_fine, settled_coarse = racy_before - RACY_NS, racy_before - RACY_WHOLE_SECONDS_NS
    earlier, is_dir, is_link, is_file = previous.get, stat.S_ISDIR, stat.S_ISLNK, stat.S_ISREG
    entries: dict[str, tuple[tuple, Entry]] = {}
    fresh: list[str] = []
    ignored: list[str] = []
    top = os.open(root, DIR_FLAGS)
    stack: list[tuple[int, str]] = [(top, "")]
    try:
        while stack:
            folder, prefix = stack.pop()
            try:
                found = _listing(folder, prefix, len(entries))
                if found is None:
                    continue
                if prefix and not ENVIRONMENT_MARKS.isdisjoint([item.name for item in found]):
                    ignored.append(prefix.rstrip("/"))
                    del entries[prefix.rstrip("/")]
                    fresh.remove(prefix.rstrip("/"))
                    continue
                for item in found:
                    path = prefix + item.name
                    try:
                        info = item.stat(follow_symlinks=False)
                    except OSError:  # gone since the listing
                        continue
                    mode = info.st_mode
                    if is_dir(mode):
                        if path in skip:
                            continue
                        if item.name in IGNORED_FOLDERS:
                            ignored.append(path)
                            continue
                        try:
                            child = os.open(item.name, DIR_FLAGS, dir_fd=folder)
                        except OSError:  # swapped for a link, or not ours to read
                            continue
                        stack.append((child, path + "/"))
                        entries[path] = (signature(info), Entry("folder", stat.S_IMODE(mode)))
                        fresh.append(path)
                        continue
                    changed_ns, modified_ns = info.st_ctime_ns, info.st_mtime_ns
                    sign = (mode, info.st_size, modified_ns, changed_ns, info.st_ino)  # signature(info), inline
                    before = earlier(path)
                    if before is not None and before[0] == sign and (modified_ns if modified_ns > changed_ns else
                                                                     changed_ns) < (settled_fine if changed_ns %
                                                                                    1_000_000_000 else settled_coarse):
                        entries[path] = before
                        continue
                    if is_link(mode):
                        try:
                            entries[path] = (sign, Entry("link", target=os.readlink(item.name, dir_fd=folder)))
                        except OSError:
                            continue
                    elif is_file(mode):
                        entries[path] = (sign, read_file(folder, item.name, info, path, keep))
                    else:
                        continue
                    fresh.append(path)
            finally:
                os.close(folder)
    finally:
        for folder, _ in stack:
            os.close(folder)
    return Walk(entries, fresh, ignored, started)


def inside(root: Path, folder: Path) -> frozenset[str]:
    """`folder` as a path under `root` (both resolved), to skip; nothing when it lies elsewhere."""
    try:
        return frozenset({folder.resolve().relative_to(root.resolve()).as_posix()}) - {"."}
    except (ValueError, OSError):
        return frozenset()


def read_file(folder: int, name: str, info: os.stat_result, path: str, keep: Keep) -> Entry:
    try:
        descriptor = os.open(name, FILE_FLAGS, dir_fd=folder)
    except OSError:
        return Entry("file", stat.S_IMODE(info.st_mode), info.st_size, not_kept="unreadable")
    try:
        opened = os.fstat(descriptor)
        if not stat.S_ISREG(opened.st_mode):  # swapped since the listing
            return Entry("file", stat.S_IMODE(info.st_mode), info.st_size, not_kept="unreadable")
        return keep(descriptor, opened, path)
    finally:
        os.close(descriptor)
