"""What comes back from executed code: its output, read from a file only the agent (and the code's own process)
holds open — no path to it exists, so nothing can be swapped in for it (a link to /proc/self/environ, a FIFO,
/dev/zero) — and read bounded, head and tail, however much was written."""

from __future__ import annotations

import fcntl
import os
import stat
import tempfile
from dataclasses import dataclass
from typing import BinaryIO


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
