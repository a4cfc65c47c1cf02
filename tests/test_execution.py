"""The Python worker and the shell runner, on real processes."""

from __future__ import annotations

import os

from miniagi.execution import cap_text
from miniagi.execution.python import PythonSession
from miniagi.execution.shell import run_shell
from miniagi.redaction import child_environment


def test_cap_text_keeps_head_and_tail_and_says_how_much_was_cut():
    text = "A" * 1000 + "B" * 1000
    capped = cap_text(text, 300)
    assert capped.startswith("A" * 200) and capped.endswith("B" * 100) and "1,700 characters cut" in capped


def test_a_snippet_timeout_kills_what_it_started_but_keeps_the_session(tmp_path):
    session = PythonSession(tmp_path, child_environment(), timeout_s=60, max_chars=4000)
    try:
        session.run("import subprocess, signal\nkept = 'yes'\nchild = subprocess.Popen(['sleep', '300'], "
                    "preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))")
        session.timeout_s = 1  # only the loop is timed: starting a process can take a second on a loaded machine
        result = session.run("while True: pass")
        assert "Timed out" in result.note and "keeps its variables" in result.note, result.note
        assert session.run("print(kept, child.wait(timeout=5))").output.strip() == "yes -9"
    finally:
        session.close()


def test_an_interrupted_snippet_waiting_for_its_own_child_keeps_the_session(tmp_path):
    """The snippet answers the interrupt by waiting for a child that ignores it (as a pool's clean-up does): the
    child is killed, not the worker, and the session's state survives."""
    session = PythonSession(tmp_path, child_environment(), timeout_s=60, max_chars=4000)
    try:
        session.run("import subprocess\nkept = 'yes'\n"
                    "child = subprocess.Popen(['sh', '-c', 'trap \"\" INT; sleep 300'])")
        session.timeout_s = 1
        # the loop does some work: CPython 3.11 raises the KeyboardInterrupt of a bare `while True: pass` outside
        # the try around it
        result = session.run("try:\n    while True: sum(range(100))\nexcept KeyboardInterrupt:\n    child.wait()\n"
                             "    raise")
        assert "keeps its variables" in result.note, result.note
        assert session.run("print(kept, child.returncode)").output.strip() == "yes -9"
    finally:
        session.close()


def test_a_worker_that_ignores_the_interrupt_is_killed_and_replaced(tmp_path):
    session = PythonSession(tmp_path, child_environment(), timeout_s=1, max_chars=4000)
    try:
        session.run("x = 1")
        result = session.run("import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass")
        assert "killed with its whole process group" in result.note and "lost" in result.note
        assert "NameError" in session.run("x").output
    finally:
        session.close()
    assert session.output.closed


def test_code_runs_in_the_workdir_with_no_stdin_and_child_output_is_captured(tmp_path):
    session = PythonSession(tmp_path, child_environment(), timeout_s=10, max_chars=4000)
    try:
        result = session.run("import os, subprocess\nprint(os.getcwd())\nsubprocess.run(['echo', 'from-child'])\n"
                             "input()")
        assert str(tmp_path) in result.output and "from-child" in result.output and "EOFError" in result.output
        assert session.run("if __name__ == '__main__':\n    print('main')").output.strip() == "main"
        assert session.run("[1, 2][0]").output.strip() == "1"
        assert session.run("None").output == ""
    finally:
        session.close()


def test_shell_reports_exit_code_and_interactive_programs_fail_fast(tmp_path):
    result = run_shell("echo out; echo err >&2; exit 3", tmp_path, child_environment(), 10, 4000)
    assert "out" in result.output and "err" in result.output and result.note == "exit code 3" and not result.ok
    result = run_shell("read answer; echo got:$answer", tmp_path, child_environment(), 60, 4000)
    assert "got:" in result.output and "Timed out" not in result.note


def test_shell_timeout_kills_the_process_group_including_background_children(tmp_path):
    result = run_shell("(sleep 300; touch survived) & sleep 60", tmp_path, child_environment(), 1, 4000)
    assert "Timed out after 1 s" in result.note
    assert not processes_in(tmp_path)  # the background job went with the command, at once


def test_huge_output_is_read_without_loading_it(tmp_path):
    result = run_shell("head -c 50000000 /dev/zero | tr '\\0' 'z'; echo; echo LAST", tmp_path,
                       child_environment(), 60, 2000)
    assert len(result.output) < 3000 and "bytes cut" in result.output and result.output.rstrip().endswith("LAST")


def processes_in(directory) -> list[int]:
    """Processes whose working directory is `directory` (seen from outside any namespace)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.readlink(f"/proc/{entry}/cwd") == str(directory):
                found.append(int(entry))
        except OSError:
            continue
    return found
