"""How well --exec-disk holds within ONE command: each attack tries to leave 1.2 GB on disk under a 20 MB limit, in
one execute_shell or execute_python, under each sandbox kind; printed is what it left in the work directory (blocks,
each file once however many links it has), and whether the command was stopped.

    python scripts/bench_exec_disk.py               # every kind that works here
    python scripts/bench_exec_disk.py --limit 50

Figures are printed, never asserted: what a writer gets past the meter depends on how fast it writes between two
looks (every CHECK_EVERY_S).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from miniagi.config import ConfigError, Settings  # noqa: E402
from miniagi.execution import CodeRunner  # noqa: E402
from miniagi.execution.limits import _allocated  # noqa: E402

ATTACKS = {
    "fallocate(1) 60 x 20 MB": ("shell", "for i in $(seq 60); do fallocate -l 20M f$i; done"),
    "posix_fallocate 60 x 20 MB": ("python", "import os\nfor i in range(60):\n"
                                             "    fd = os.open(f'p{i}', os.O_CREAT | os.O_WRONLY)\n"
                                             "    os.posix_fallocate(fd, 0, 20 * 2**20)\n    os.close(fd)"),
    "sparse files 60 x 1 GB": ("shell", "for i in $(seq 60); do truncate -s 1G s$i; done"),
    "many small files 20,000 x 64 KB": ("python", "b = b'x' * 65536\nfor i in range(20000):\n"
                                                  "    open(f'm{i}', 'wb').write(b)"),
    "head -c 60 x 20 MB": ("shell", "for i in $(seq 60); do head -c 20000000 /dev/zero > w$i; done"),
    "hard links 1 x 10 MB, 500 links": ("shell", "head -c 10000000 /dev/zero > one; "
                                                 "for i in $(seq 500); do ln one l$i; done"),
}


def attack(kind: str, limit_mb: int, language: str, code: str) -> tuple[float, bool] | str:
    """MB left in the work directory by one command, and whether it was stopped; or why the kind cannot be had."""
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(workdir=f"{tmp}/work", home=f"{tmp}/home", sandbox=kind, exec_timeout=120,
                            exec_disk=limit_mb)
        try:
            runner = CodeRunner(settings, {"PATH": "/usr/local/bin:/usr/bin:/bin"}, 4000)
        except ConfigError as exc:
            return str(exc)
        try:
            result = runner.run_python(code) if language == "python" else runner.run_shell(code)
            left = _allocated((Path(tmp) / "work",))[0] / 2**20
            return left, "--exec-disk" in (result.note or "") + result.output
        finally:
            runner.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=20, help="--exec-disk in MB")
    args = parser.parse_args()
    print(f"--exec-disk {args.limit} MB; MB left on disk by one command (stopped: the meter ended it)")
    print(f"{'attack':<34} {'bwrap':>14} {'namespace':>14} {'none':>14}")
    for name, (language, code) in ATTACKS.items():
        cells = []
        for kind in ("bwrap", "namespace", "none"):
            found = attack(kind, args.limit, language, code)
            cells.append("n/a" if isinstance(found, str) else f"{found[0]:,.0f}{' stopped' if found[1] else ''}")
        print(f"{name:<34} {cells[0]:>14} {cells[1]:>14} {cells[2]:>14}")


if __name__ == "__main__":
    main()
