"""Writing files where executed code could have been: never through a link, never into another file.

A folder that code could reach (a batch's results folder, say) may hold a symbolic link where miniagi expects its own
file or folder, or a hard link to a file of the user's. Everything here goes through directory descriptors opened
without following links (so a folder swapped for a link half-way is refused, not followed), a whole file is written
to a new temporary file (O_EXCL) and renamed over its name (a hard link's other names keep their content), and an
append goes only to a regular file with one name.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def open_dir(path: Path) -> int:
    """A descriptor of the folder `path` (made when missing). Its own last name must not be a link."""
    path = Path(os.path.abspath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path)
    except FileExistsError:
        pass
    return os.open(path, DIR_FLAGS)


def open_path_dir(path: str) -> int:
    """A descriptor of the folder at this absolute path, opened one name at a time from / and never through a link
    (O_NOFOLLOW on each): a folder on the way swapped for a link is refused (OSError), not followed."""
    folder = os.open("/", DIR_FLAGS)
    try:
        for name in Path(os.path.abspath(path)).parts[1:]:
            inner = os.open(name, DIR_FLAGS, dir_fd=folder)
            os.close(folder)
            folder = inner
    except BaseException:
        os.close(folder)
        raise
    return folder


def identity(path) -> list[int]:
    """What a folder is, whatever its name: [st_dev, st_ino] (its own, not a link's target)."""
    found = os.lstat(path)
    return [found.st_dev, found.st_ino]


def sub_dir(parent: int, name: str) -> int:
    """A descriptor of the folder `name` in the folder `parent` (made when missing), never through a link."""
    try:
        os.mkdir(name, 0o755, dir_fd=parent)
    except FileExistsError:
        pass
    return os.open(name, DIR_FLAGS, dir_fd=parent)


def replace_file(folder: int, name: str, data: bytes, mode: int = 0o644) -> None:
    """`name` in `folder` becomes a new file holding data: written to a fresh temporary file, then renamed over it."""
    temporary = f".{name}.{secrets.token_hex(6)}.partial"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | getattr(os, "O_CLOEXEC", 0), mode, dir_fd=folder)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
        os.replace(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        try:
            os.unlink(temporary, dir_fd=folder)
        except OSError:
            pass
        raise


def append(folder: int, name: str, data: bytes) -> None:
    """data appended to `name` in `folder`: only to a regular file of one name (made when missing), never a link,
    a FIFO or a device."""
    descriptor = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                         | getattr(os, "O_CLOEXEC", 0), 0o644, dir_fd=folder)
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            raise OSError(f"{name} is not a regular file of its own (a link to another file?): not written")
        os.set_blocking(descriptor, True)
        view = memoryview(data)
        while view:
            view = view[os.write(descriptor, view):]
    finally:
        os.close(descriptor)


def write_new(path: Path, data: bytes, mode: int = 0o600) -> bool:
    """Create `path` holding data unless it exists (False then); never through a link."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | getattr(os, "O_CLOEXEC", 0), mode)
    except FileExistsError:
        return False
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
    return True
