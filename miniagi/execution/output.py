"""What comes back from executed code: its output, read from a file only the agent (and the code's own process)
holds open — no path to it exists, so nothing can be swapped in for it (a link to /proc/self/environ, a FIFO,
/dev/zero) — and read bounded, head and tail, however much was written."""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
import threading
from dataclasses import dataclass
from typing import BinaryIO, Callable

TAIL_EVERY_S = 0.1  # how often new output is looked for while code runs, when someone watches
TAIL_MAX_BYTES = 4 << 20  # a watcher sees at most this much of one command's output (the model's share is capped)


@dataclass(frozen=True)
class ExecResult:
    output: str
    note: str = ""  # what the model must know besides the output: timeout, lost state, exit code
    ok: bool = True

    def observation(self) -> str:
        parts = [self.output.rstrip("\n") if self.output.strip() else "(no output)"]
        if self.note:
            parts.append(self.note)
        return "\n".join(parts)


def cut_marker(cut_chars: int) -> str:
    return f"\n[… {cut_chars:,} characters cut from the middle …]\n"


def cap_text(text: str, max_chars: int) -> str:
    """Keep the head and the tail of a long text and say how much was cut."""
    if len(text) <= max_chars:
        return text
    head = max_chars * 2 // 3
    tail = max_chars - head
    return text[:head] + cut_marker(len(text) - head - tail) + text[len(text) - tail:]


def output_file() -> BinaryIO:
    """An unnamed file for a process's stdout and stderr. Opened for appending, so that after `clear` the
    process's writes start again at the beginning."""
    handle = tempfile.TemporaryFile(prefix="miniagi-output-")
    fcntl.fcntl(handle.fileno(), fcntl.F_SETFL, fcntl.fcntl(handle.fileno(), fcntl.F_GETFL) | os.O_APPEND)
    return handle


def clear(handle: BinaryIO) -> None:
    os.ftruncate(handle.fileno(), 0)


def read_capped(handle: BinaryIO, max_chars: int) -> str:
    """The head and tail of a possibly huge output file, reading no more than needed, through our descriptor."""
    fd = handle.fileno()
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # cannot happen with output_file(); never read anything else
        return ""
    size = info.st_size
    # utf-8 is at most 4 bytes a character; reading 4x the characters is always enough
    if size <= max_chars * 4:
        return cap_text(os.pread(fd, size, 0).decode("utf-8", "replace"), max_chars)
    head_chars = max_chars * 2 // 3
    tail_chars = max_chars - head_chars
    head = os.pread(fd, head_chars * 4, 0).decode("utf-8", "replace")[:head_chars]
    tail = os.pread(fd, tail_chars * 4, size - tail_chars * 4).decode("utf-8", "replace")[-tail_chars:]
    approx_cut = size - len(head.encode()) - len(tail.encode())
    return head + f"\n[… about {approx_cut:,} bytes cut from the middle …]\n" + tail


class Tail:
    """Each whole line code writes to `handle` from now on, told to `on_line` as it comes (by a thread that reads the
    file every TAIL_EVERY_S) until `stop`, which tells what is left, a last unfinished line included. The file is
    read through our descriptor, at most TAIL_MAX_BYTES. With no `on_line`, nothing is read."""

    def __init__(self, handle: BinaryIO, on_line: Callable[[str], None] | None):
        self.on_line = on_line
        self.fd = os.dup(handle.fileno()) if on_line is not None else -1  # its own: never another file's
        self.start = self.offset = 0  # the file is new, or cleared, for each command
        self.rest = b""
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        if on_line is not None:
            threading.Thread(target=self._follow, name="output-tail", daemon=True).start()

    def _follow(self) -> None:
        while not self.stopped.wait(TAIL_EVERY_S):
            with contextlib.suppress(OSError):  # closed by stop() meanwhile
                self._read()

    def _read(self, final: bool = False) -> None:
        with self.lock:
            if self.stopped.is_set() != final:  # stop() has read the rest (and closed the descriptor)
                return
            while self.offset - self.start < TAIL_MAX_BYTES:
                data = os.pread(self.fd, min(1 << 16, self.start + TAIL_MAX_BYTES - self.offset), self.offset)
                if not data:
                    break
                self.offset += len(data)
                *lines, self.rest = (self.rest + data).split(b"\n")
                for line in lines:
                    self.on_line(line.decode("utf-8", "replace"))
            if final and self.rest:
                self.on_line(self.rest.decode("utf-8", "replace"))
                self.rest = b""

    def stop(self) -> None:
        if self.on_line is not None and not self.stopped.is_set():
            self.stopped.set()
            try:
                self._read(final=True)
            finally:
                with self.lock:
                    os.close(self.fd)


@contextlib.contextmanager
def watched(handle: BinaryIO, on_line: Callable[[str], None] | None):
    """The body's output told line by line (a Tail), also when it is interrupted."""
    tail = Tail(handle, on_line)
    try:
        yield tail
    finally:
        tail.stop()
