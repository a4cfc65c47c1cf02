"""The critic, loop detection, contained execution, and surviving faults mid-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from .conftest import act, run_dirs
from .fake_llm import summarizing
from .test_end_to_end import _start, _wait_for, load_run, observations


def critic_requests(llm):
    return [r for r in llm.requests if r["model"] == "critic-model"]


def agent_requests(llm):
    return [r for r in llm.requests if r["model"] != "critic-model"]


def test_a_repeated_action_is_warned_criticized_and_stopped(cli, llm, isolated):
    llm.responder = lambda request: ("CRITICISM: you keep listing a missing folder.\nNEXT: create it first."
                                     if request["model"] == "critic-model" else None)
    llm.add(*[act("execute_shell", "ls /no-such-folder")] * 6)
    proc = cli("-y", "--critic", "--critic-model", "critic-model", "--critic-every", "50", "list it")
    assert proc.returncode == 5, proc.stderr
    _, result, trace = load_run(isolated.home)
    assert result["status"] == "stuck" and result["steps"] == 5
    reviews = [e for e in trace if e["type"] == "critic"]
    assert reviews and reviews[0]["loop"] and reviews[0]["step"] == 3  # the loop called the critic at once
    assert "GOING ROUND IN CIRCLES" in critic_requests(llm)[0]["messages"][-1]["content"]
    fourth_prompt = agent_requests(llm)[3]["messages"][-1]["content"]
    assert "WARNING: you are going round in circles" in fourth_prompt
    assert "you keep listing a missing folder" in fourth_prompt


def test_alternating_actions_and_the_same_error_count_as_loops(cli, llm, isolated):
    llm.add(act("execute_shell", "cat a.txt"), act("execute_shell", "cat b.txt"),
            act("execute_shell", "cat a.txt"), act("execute_shell", "cat b.txt"), act("execute_shell", "cat a.txt"),
            act("execute_shell", "cat b.txt"))
    alternating = cli("-y", "alternate")
    assert alternating.returncode == 5 and "the same action with the same result" in alternating.stderr
    llm.add(act("execute_python", "import missing_module_one"), act("execute_python", "1/0"),
            act("execute_python", "1 / 0"), act("execute_python", "x = 1/0"), act("execute_python", "y = 2/0"),
            act("execute_python", "z = 3/0"))
    proc = cli("-y", "divide")
    assert proc.returncode == 5 and "the same error" in proc.stderr


def test_varied_progress_is_not_a_loop(cli, llm, isolated):
    llm.add(*[act("execute_python", f"open('f{i}.txt', 'w').write('x')") for i in range(8)], act("done", "made 8"))
    proc = cli("-y", "make files")
    assert proc.returncode == 0, proc.stderr  # eight silent steps with different code: no loop


def test_the_critic_reviews_every_n_steps_and_its_criticism_is_replaced(cli, llm, isolated):
    reviews = iter(["CRITICISM: first review.\nNEXT: a", "CRITICISM: second review.\nNEXT: b"])
    llm.responder = lambda request: next(reviews) if request["model"] == "critic-model" else None
    llm.add(*[act("memorize_thoughts", f"fact {i}") for i in range(5)], act("done", "ok"))
    proc = cli("-y", "--critic", "--critic-model", "critic-model", "--critic-every", "2", "--max-steps", "5",
               "take notes")
    assert proc.returncode == 3, proc.stderr
    _, _, trace = load_run(isolated.home)
    assert [e["step"] for e in trace if e["type"] == "critic"] == [2, 4]
    fifth = agent_requests(llm)[4]["messages"][-1]["content"]
    assert "second review" in fifth and "first review" not in fifth
    third = agent_requests(llm)[2]["messages"][-1]["content"]
    assert "first review" in third


def test_a_rejected_final_answer_goes_back_and_is_revised(cli, llm, isolated):
    verdicts = iter(["REJECT: the answer gives the sum, but the objective asked for the product.",
                     "ACCEPT: correct product."])
    llm.responder = lambda request: next(verdicts) if request["model"] == "critic-model" else None
    llm.add(act("done", "The result is 12."), act("done", "The product is 35."))
    proc = cli("--critic", "--critic-model", "critic-model", "--critic-every", "99", "Multiply 5 by 7")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "The product is 35."
    _, result, trace = load_run(isolated.home)
    finals = [e for e in trace if e["type"] == "critic" and e["kind"] == "final"]
    assert [f["accepted"] for f in finals] == [False, True]
    assert "REJECTED: the answer gives the sum" in observations(trace)[1]
    assert "The result is 12." in critic_requests(llm)[0]["messages"][-1]["content"]
    assert result["steps"] == 2 and result["llm_calls"] == 4


def test_a_final_answer_rejected_twice_is_accepted_the_third_time(cli, llm, isolated):
    llm.responder = lambda request: "REJECT: still wrong." if request["model"] == "critic-model" else None
    llm.add(act("done", "a"), act("done", "b"), act("done", "c"))
    proc = cli("--critic", "--critic-model", "critic-model", "stubborn")
    assert proc.returncode == 0 and proc.stdout.strip() == "c"
    assert len(critic_requests(llm)) == 2


def test_a_fork_bomb_and_a_huge_allocation_are_contained(cli, llm, isolated):
    # a long traceback is kept whole while the prompt has room: when it leaves the view, the summarizer is asked
    llm.responder = lambda request: "Summary: misbehaving code ran." if summarizing(request) else None
    llm.add(act("execute_python", "survivor = 'still here'"),
            act("execute_python", "import os\nwhile True:\n    os.fork()"),
            act("execute_python", "block = bytearray(50 * 2**30)"),
            act("execute_shell", "python3 -c 'bytearray(50 * 2**30)' ; echo shell-survived"),
            act("execute_python", "print(survivor)"),
            act("done", "contained"))
    proc = cli("-y", "--exec-timeout", "20", "misbehave", timeout=300)
    assert proc.returncode == 0, proc.stderr
    _, _, trace = load_run(isolated.home)
    seen = observations(trace)
    assert "Resource temporarily unavailable" in seen[2] or "Timed out" in seen[2]
    assert "MemoryError" in seen[3]
    assert "MemoryError" in seen[4] and "shell-survived" in seen[4]
    assert seen[5].startswith("still here"), seen
    assert subprocess.run(["true"]).returncode == 0  # the machine can still start processes


def test_executed_code_has_the_workdir_as_home_and_limits_applied(cli, llm, isolated):
    llm.add(act("execute_python", "import os, resource\nprint(os.environ['HOME'], os.getcwd())\n"
                                  "print(resource.getrlimit(resource.RLIMIT_FSIZE)[0] // 2**20)"),
            act("execute_shell", "ulimit -f; ulimit -c"), act("done", "ok"))
    assert cli("-y", "inspect").returncode == 0
    _, _, trace = load_run(isolated.home)
    seen = observations(trace)
    assert seen[1].splitlines()[0] == f"{isolated.work} {isolated.work}" and seen[1].splitlines()[1] == "1024"
    assert seen[2].splitlines()[:2] == [str(1024 * 1024), "0"]


def test_a_run_killed_with_sigkill_mid_step_resumes_with_nothing_lost(cli, llm, isolated):
    llm.add(act("execute_shell", "echo one >> log.txt"),
            act("execute_python", "import os, time\nagain = os.path.exists('started.txt')\n"
                                  "open('started.txt', 'w').write('x')\ntime.sleep(0 if again else 60)"))
    process = _start(llm, isolated, "-y", "long work")
    assert _wait_for(lambda: (isolated.work / "started.txt").exists())
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)
    directory, result, trace = load_run(isolated.home)
    assert result["status"] == "running"  # it never got to say otherwise
    llm.add(act("execute_shell", "echo two >> log.txt"), act("done", "resumed"))
    proc = cli("resume", directory.name, "-y")  # a trace grants no approval: -y again
    assert proc.returncode == 0, proc.stderr
    assert "step 2's code was cut off (its process ended); it will run again" in proc.stderr
    assert (isolated.work / "log.txt").read_text() == "one\ntwo\n"
    _, result, trace = load_run(isolated.home)
    assert result["status"] == "done" and result["steps"] == 4
    assert result["llm_calls"] == 4  # the cut-off step's recorded reply was taken again: its call made once
    steps = [(e["type"], e["step"]) for e in trace if e["type"] in ("action", "observation")]
    assert steps == [("action", 1), ("observation", 1), ("action", 2), ("observation", 2), ("action", 3),
                     ("observation", 3), ("action", 4)]


def test_a_full_disk_ends_the_run_cleanly_and_resume_continues(llm, isolated):
    note = "This is a long note that fills the trace. " * 120  # ~5 KB a step
    llm.add(*[act("memorize_thoughts", f"{i}: {note}") for i in range(20)])
    env = dict(os.environ, OPENAI_BASE_URL=llm.url, OPENAI_API_KEY="sk-test-key-123456",
               MINIAGI_MEMORY_SCOPE="off")
    limited = subprocess.run(["bash", "-c", 'ulimit -f 48; exec "$0" -m miniagi "$@"', sys.executable, "-y",
                              "fill the disk"], cwd=isolated.work, env=env, capture_output=True, text=True,
                             timeout=60, stdin=subprocess.DEVNULL)
    assert limited.returncode == 1, limited.stderr
    assert "cannot write the run's files" in limited.stderr and "Traceback" not in limited.stderr
    (directory,) = run_dirs(isolated.home)
    events = [json.loads(line) for line in (directory / "trace.jsonl").read_text().splitlines() if line.strip()
              and line.startswith("{") and line.endswith("}")]
    done_steps = max(e["step"] for e in events if e["type"] == "observation")
    assert 2 <= done_steps < 20
    llm.script = [act("done", "finished after the disk was freed")]
    proc = subprocess.run([sys.executable, "-m", "miniagi", "resume", directory.name], cwd=isolated.work, env=env,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((directory / "result.json").read_text())
    lines = (directory / "trace.jsonl").read_text().splitlines()
    trace = [json.loads(line) for line in lines[:-1] if line.endswith("}")] + [json.loads(lines[-1])]
    assert sum(not line.endswith("}") for line in lines) <= 1  # at most the one line the full disk cut off
    assert result["status"] == "done"
    observed = [e["step"] for e in trace if e["type"] == "observation"]
    assert observed == list(range(1, max(observed) + 1))  # every completed step kept, none repeated
    assert result["steps"] == max(observed) + 1
