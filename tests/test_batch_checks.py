"""Batches that know whether an objective succeeded: `check`, `expect` and `setup` per line, a fresh work directory
per objective, `--repeat N`, `miniagi batch report`. The batch and the report run in-process (their objectives are
real `miniagi run` processes against the scripted endpoint); what needs a process of its own gets one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from .conftest import act, one_line
from .fake_llm import Fail
from .test_batch_replay import Scripted, objective_of, write_batch

KEY = "sk-test-key-123456"


def results(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line]  # U+2028 kept


def test_checks_expect_and_setup_judge_each_objective_in_a_fresh_work_directory(cli, llm, isolated):
    seed = isolated.work / "seed"
    seed.mkdir()
    (seed / "n.txt").write_text("21\n")
    responder = Scripted({
        "Double the number": [act("execute_shell", "echo $(( $(cat n.txt) * 2 )) > out.txt; touch stray.txt"),
                              act("done", "doubled")],
        "Halve the number": [act("execute_shell", "echo 4 > out.txt"), act("done", "halved")],
        "Run the missing checker": [act("done", "ok")],
        "Name the answer\u2028on one line": [act("done", "answer: 42")],  # U+2028 is no line break in a .jsonl
        "Name a wrong answer": [act("done", "answer: 41")],
        "Just finish": [act("done", "finished")],
        "Start from a broken setup": [act("done", "started")],
        "Look around": [act("execute_shell", "ls"), act("done", "looked")],
    })
    llm.responder = responder
    lines = [
        {"id": "pass", "objective": "Double the number", "setup": "seed", "check": 'test "$(cat out.txt)" = 42'},
        {"id": "fail", "objective": "Halve the number", "setup": "echo 10 > n.txt",
         "check": 'echo "got $(cat out.txt)"; test "$(cat out.txt)" = 5'},
        {"id": "error", "objective": "Run the missing checker", "check": "no-such-checker --strict"},
        {"id": "expect", "objective": "Name the answer\u2028on one line", "expect": "^answer: 42$"},
        {"id": "expect-wrong", "objective": "Name a wrong answer", "expect": "^answer: 42$"},
        {"id": "plain", "objective": "Just finish"},
        {"id": "broken-setup", "objective": "Start from a broken setup", "setup": "touch leftover; echo nope; exit 3",
         "check": "true"},
        {"id": "fresh", "objective": "Look around", "setup": "touch mine.txt",
         "check": "test -e mine.txt && test ! -e stray.txt && test ! -e n.txt"}]
    write_batch(isolated.work / "jobs.jsonl", lines)
    out = isolated.work / "out"
    proc = cli("batch", "jobs.jsonl", "--out", str(out), "--workers", "3", "-y")
    assert proc.returncode == 3, proc.stderr
    records = {r["id"]: r for r in results(out / "results.jsonl")}
    assert {id_: (r["status"], r.get("check")) for id_, r in records.items()} == {
        "pass": ("done", "pass"), "fail": ("done", "fail"), "error": ("done", "error"), "expect": ("done", "pass"),
        "expect-wrong": ("done", "fail"), "plain": ("done", None), "broken-setup": ("error", "error"),
        "fresh": ("done", "pass")}
    assert "check" not in records["plain"]  # an objective without a check is counted as before
    assert "got 4" in records["fail"]["check_output"]
    assert "not found" in records["error"]["check_output"]
    assert "does not match" in records["expect-wrong"]["check_output"]
    assert records["expect"]["objective"] == "Name the answer\u2028on one line"
    broken = records["broken-setup"]["message"]
    assert broken.startswith("setup failed") and "nope" in broken
    assert "Start from a broken setup" not in responder.seen  # no run without its setup
    work = out / "work"
    assert records["pass"]["workdir"] == str(work / "pass") and (work / "pass" / "out.txt").read_text() == "42\n"
    assert not (seed / "out.txt").exists() and not (isolated.work / "out.txt").exists()  # a copy; not the cwd
    assert "7/8 done · 4/8 passed (50%)" in proc.stderr and "per passed objective" in proc.stderr
    assert "pass done check pass" in proc.stderr and "fail done check fail" in proc.stderr  # the live lines

    lines[6]["setup"] = "touch mine.txt"  # fixed: the rerun starts that one clean, and runs nothing else
    lines[6]["check"] = "test -e mine.txt && test ! -e leftover"
    write_batch(isolated.work / "jobs.jsonl", lines)
    responder.seen.clear()
    rerun = cli("batch", "jobs.jsonl", "--out", str(out), "-y")
    assert set(responder.seen) == {"Start from a broken setup"}
    last = results(out / "results.jsonl")[-1]
    assert (last["id"], last["status"], last["check"]) == ("broken-setup", "done", "pass")
    assert rerun.returncode == 3 and "8/8 done · 5/8 passed (62%)" in rerun.stderr  # a failed check stays a result


def test_a_check_runs_contained_like_executed_code(cli, llm, isolated):
    llm.responder = Scripted({"Finish": [act("done", "finished")]})
    snoop = ("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done; kill -9 $PPID 1 2>/dev/null; "
             "echo home=$HOME; "
             "printenv OPENAI_API_KEY || echo no-key-here; echo escaped > ../../../escaped.txt; echo still-here")
    write_batch(isolated.work / "jobs.jsonl", [
        {"id": "snoop", "objective": "Finish", "setup": "true", "check": snoop},
        {"id": "hang", "objective": "Finish", "setup": "true", "check": "sleep 600", "exec_timeout": 3}])
    proc = cli("batch", "jobs.jsonl", "-y", timeout=180, process=True)  # kill -9 $PPID: not at pytest
    assert proc.returncode == 3, proc.stderr
    records = {r["id"]: r for r in results(isolated.work / "jobs-jsonl-results" / "results.jsonl")}
    said = records["snoop"]["check_output"]
    assert records["snoop"]["check"] == "pass" and "still-here" in said
    processes = said.split("\nhome=")[0]  # their command lines: its own shell, not the batch's or the runs'
    assert "printenv OPENAI_API_KEY" in processes and "-m miniagi" not in processes
    assert f"home={records['snoop']['workdir']}" in said and "no-key-here" in said  # the allow-list, as code gets
    assert records["hang"]["check"] == "error" and "--exec-timeout" in records["hang"]["check_output"]
    assert not (isolated.work / "escaped.txt").exists()  # the sandbox: only its own work directory is writable


def test_repeats_count_k_of_n_a_rerun_skips_what_is_complete_and_report_compares_folders(cli, llm, isolated):
    lock, failed = threading.Lock(), threading.Event()
    answers = ["answer: 41", "answer: 42", "answer: 42"]  # one of the three repeats is wrong
    flaky = []  # the requests for "Start up": the first of all fails

    def respond(request):
        objective = objective_of(request)
        with lock:
            if objective == "Name the answer":
                return act("done", answers.pop(0))
            flaky.append(objective)
            if failed.is_set():
                return act("done", "fine")
            failed.set()
            return Fail(400, {}, "the model is unwell")

    llm.responder = respond
    write_batch(isolated.work / "jobs.jsonl", [{"id": "answer", "objective": "Name the answer", "expect": "42"},
                                               {"id": "flaky", "objective": "Start up"}])
    first = cli("batch", "jobs.jsonl", "--repeat", "3", "--out", "A", "-y")
    assert first.returncode == 3, first.stderr
    lines = results(isolated.work / "A" / "results.jsonl")
    assert sorted((r["id"], r["repeat"]) for r in lines) == [(i, n) for i in ("answer", "flaky") for n in range(3)]
    assert sum(r["status"] == "error" for r in lines) == 1 and not answers
    assert {p.name for p in (isolated.work / "A" / "logs").iterdir()} >= {"answer.log", "answer@1.log",
                                                                           "answer@2.log"}
    assert "2/3 pass" in first.stderr and "2/3 done" in first.stderr and "4/6 passed (67%)" in first.stderr

    flaky.clear()
    rerun = cli("batch", "jobs.jsonl", "--repeat", "3", "--out", "A", "-y")
    assert len(flaky) == 1  # only the attempt that ended in error ran again; answers had its three results
    assert len(results(isolated.work / "A" / "results.jsonl")) == 7
    assert rerun.returncode == 3 and "5/6 passed (83%)" in rerun.stderr

    answers.append("answer: 42")  # the same suite once more, into a second folder (another model, say)
    assert cli("batch", "jobs.jsonl", "--out", "B", "-y").returncode == 0

    single = cli("batch", "report", "A")
    assert single.returncode == 0 and "5/6 passed (83%)" in single.stdout and "median" in single.stdout
    both = cli("batch", "report", "A", "B")
    assert both.returncode == 0
    rows = {line.split()[0]: line.split() for line in both.stdout.splitlines() if line.strip()}
    assert rows["answer"][1] == "2/3" and rows["flaky"][1] == "3/3"
    assert rows["all"][1:3] == ["5/6", "83%"] and "2/2" in rows["all"] and "100%" in rows["all"]
    assert "[1] A" in both.stdout and "[2] B" in both.stdout
    figures = json.loads(cli("batch", "report", "A", "B", "--json").stdout)
    (a, b) = figures["folders"]
    assert (a["total"]["passed"], a["total"]["runs"], b["total"]["pass_rate"]) == (5, 6, 1.0)
    assert {o["id"]: o["passed"] for o in a["objectives"]} == {"answer": 2, "flaky": 3}
    assert a["total"]["median_steps"] == 1 and a["total"]["median_seconds"] > 0
    missing = cli("batch", "report", "nowhere")
    assert missing.returncode == 2 and one_line(missing.stderr) and "nowhere" in missing.stderr


def test_a_batch_and_its_report_end_quietly_when_the_reader_leaves(cli, llm, isolated, tmp_path):
    llm.responder = Scripted({"one": [act("done", "1")], "two": [act("done", "2")], "three": [act("done", "3")]})
    (isolated.work / "jobs.txt").write_text("one\ntwo\nthree\n")
    env = dict(os.environ)
    env.update(OPENAI_BASE_URL=llm.url, OPENAI_API_KEY=KEY, MINIAGI_MEMORY_SCOPE="off")
    batch = subprocess.Popen([sys.executable, "-m", "miniagi", "batch", "jobs.txt", "--workers", "1"],
                             cwd=isolated.work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
    assert batch.stdout.readline().startswith(b"batch 3 objectives")  # `2>&1 | head -1`
    batch.stdout.close()
    assert batch.wait(timeout=180) == 0  # the batch went on to its end and its own exit code
    assert len(results(isolated.work / "jobs-txt-results" / "results.jsonl")) == 3
    report = subprocess.Popen([sys.executable, "-m", "miniagi", "batch", "report", "jobs-txt-results"],
                              cwd=isolated.work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    report.stdout.close()  # gone before the first line
    assert report.wait(timeout=60) == 0 and b"Traceback" not in report.stderr.read()


def test_results_are_read_bounded_and_only_from_a_results_file(tmp_path):
    from miniagi.batch_report import latest, read_results

    path = tmp_path / "results.jsonl"
    line = json.dumps({"id": "a", "repeat": 0, "status": "error", "message": "x" * 1000}) + "\n"
    path.write_text(line * 200 + json.dumps({"id": "a", "repeat": 0, "status": "done"}) + "\n")
    records, cut = read_results(path, max_bytes=10_000)
    assert cut and 5 <= len(records) <= 10  # the end of the file: the latest results, whole lines only
    assert latest(records)[("a", 0)]["status"] == "done"
    fifo = tmp_path / "fifo" / "results.jsonl"
    fifo.parent.mkdir()
    os.mkfifo(fifo)  # a FIFO named like a results file: refused at once, never waited on
    with pytest.raises(OSError):
        read_results(fifo)
    (tmp_path / "link").mkdir()
    (tmp_path / "link" / "results.jsonl").symlink_to("/etc/passwd")
    with pytest.raises(OSError):
        read_results(tmp_path / "link" / "results.jsonl")
