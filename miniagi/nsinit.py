"""PID 1 of the namespace that executed code runs in (see sandbox.py). Standard library only: it is started as
`python -I -S nsinit.py LIFELINE_FD COMMAND…`, before any of miniagi could be imported.

It starts COMMAND, reaps every process that ends in the namespace (orphans are handed to PID 1, and nobody else
would collect them: 200 zombies once used up the run's process allowance), and exits with COMMAND's status —
which, PID 1 being gone, ends every process left in the namespace. It also ends everything when the agent is
gone (LIFELINE_FD, a pipe whose other end only the agent holds, reads end-of-file), so code that loops forever
does not outlive an agent that was killed.
"""

import os
import select
import signal
import sys


def main() -> int:
    lifeline, argv = int(sys.argv[1]), sys.argv[2:]
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
