"""`miniagi` as a user runs it: a real subprocess, the real model client, a scripted endpoint on 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

from memory.budget import Budget

from .conftest import MEMORY_ON, act, run_dirs
from .fake_llm import Fail, Hang


def load_run(home):
    (directory,) = run_dirs(home)
    result = json.loads((directory / "result.json").read_text())
    trace = [json.loads(line) for line in (directory / "trace.jsonl").read_text().splitlines()]
    return directory, result, trace


def observations(trace):
    return {e["step"]: e["text"] for e in trace if e["type"] == "observation"}


def test_multi_step_run_keeps_python_state_and_prints_answer(cli, llm, isolated):
    llm.add(act("execute_python", "secret_number = 6 * 7\nprint('stored')", "first compute the number"),
            act("execute_shell", "echo from-shell > note.txt && cat note.txt"),
            act("execute_python", "```python\nprint(secret_number + 1)\n```"),
            act("done", "The answer is 43."))
    proc = cli("-y", "--unattended", "Compute 6*7+1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "The answer is 43."
    directory, result, trace = load_run(isolated.home)
    assert directory.name in proc.stderr  # the run id is announced on stderr
    assert result["status"] == "done" and result["answer"] == "The answer is 43."
    assert result["steps"] == 4 and result["llm_calls"] == 4
    assert result["prompt_tokens"] > 0 and result["completion_tokens"] > 0 and result["cost_usd"] > 0
    seen = observations(trace)
    assert "stored" in seen[1]
    assert "from-shell" in seen[2] and "exit code 0" in seen[2]
    assert seen[3].strip() == "43"
    assert (isolated.work / "note.txt").read_text().strip() == "from-shell"
    assert {e["type"] for e in trace} >= {"run_start", "llm_call", "action", "observation", "run_end"}
    assert all("step" in e and "type" in e for e in trace)
    raw = [e["response"] for e in trace if e["type"] == "llm_call"]
    assert raw[2].startswith("<r>thinking</r><c>execute_python</c>\n```python")  # the RAW reply is kept
    # the model saw the observation of step 1 in its step 2 prompt
    second_prompt = json.dumps(llm.agent_requests()[1]["messages"])
    assert "stored" in second_prompt


def test_json_output_is_the_result_object(cli, llm, isolated):
    llm.add(act("done", "42"))
    proc = cli("--json", "answer")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["status"] == "done" and summary["answer"] == "42" and summary["steps"] == 1


def test_step_limit_exits_3_and_resume_with_higher_limit_finishes(cli, llm, isolated):
    llm.add(act("execute_python", "open('log.txt','a').write('one\\n')"),
            act("execute_python", "open('log.txt','a').write('two\\n')"))
    proc = cli("-y", "--max-steps", "2", "write a log")
    assert proc.returncode == 3, proc.stderr
    directory, result, _ = load_run(isolated.home)
    assert result["status"] == "limit" and result["steps"] == 2
    assert "resume" in proc.stderr
    llm.add(act("done", "logged"))
    proc = cli("resume", directory.name, "--max-steps", "5")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "logged"
    assert (isolated.work / "log.txt").read_text() == "one\ntwo\n"  # completed steps did not run again
    _, result, trace = load_run(isolated.home)
    assert result["status"] == "done" and result["steps"] == 3 and result["llm_calls"] == 3


def test_the_cost_limit_is_never_crossed_and_exits_3(cli, llm, isolated):
    """A call is made only when its prompt and a full reply fit in what is left of the limit."""
    llm.add(*[act("memorize_thoughts", f"note {i}") for i in range(20)])
    proc = cli("--max-cost", "0.02", "--max-reply-tokens", "500", "--model", "gpt-4o", "spend")
    assert proc.returncode == 3, proc.stderr
    _, result, trace = load_run(isolated.home)
    assert result["status"] == "limit" and 1 <= result["steps"] < 20 and len(llm.requests) == result["steps"]
    assert result["cost_usd"] <= 0.02 and "the next model call could cost up to" in proc.stderr
    # it stopped near the limit, not long before: one more call with a full reply ($10/M) would have crossed it
    largest = max(e["cost_usd"] for e in trace if e["type"] == "llm_call")
    assert result["cost_usd"] + largest + 500 * 10 / 1e6 > 0.02 * 0.9

    proc = cli("--max-cost", "0.0000001", "--model", "gpt-4o", "spend")  # not even one call fits
    assert proc.returncode == 3 and "cost limit" in proc.stderr and len(llm.requests) == result["steps"]


def test_three_malformed_replies_exit_4_and_the_model_is_told_the_format(cli, llm, isolated):
    llm.add("I think I should list the files.", "<r>still thinking</r>", "```\nls -la\n```")
    proc = cli("list files")
    assert proc.returncode == 4, proc.stderr
    _, result, trace = load_run(isolated.home)
    assert result["status"] == "format_error" and result["steps"] == 3
    assert [e["type"] for e in trace].count("format_error") == 3
    messages = llm.agent_requests()[1]["messages"]
    feedback = messages[-1]["content"]
    # a filled-in example, not a placeholder a model could copy as a command
    assert "could not be used" in feedback and "<c>execute_shell</c>\npython3 --version" in feedback
    assert "<c>command</c>" not in feedback
    # the bad reply stands in the history as the model's own message, not quoted back a second time
    assert messages[-2] == {"role": "assistant", "content": "I think I should list the files."}
    assert "I think I should list the files." not in feedback


def test_a_good_reply_resets_the_format_error_count(cli, llm, isolated):
    llm.add("no tags", "still none", act("memorize_thoughts", "ok"), "again none", "none", act("done", "fine"))
    proc = cli("tolerate")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "fine"


def test_unknown_command_is_an_observation_naming_the_commands(cli, llm, isolated):
    llm.add(act("browse_web", "http://example.com"), act("done", "ok"))
    proc = cli("go")
    assert proc.returncode == 0, proc.stderr
    feedback = llm.agent_requests()[1]["messages"][-1]["content"]
    assert "'browse_web' is not a command" in feedback and "execute_python" in feedback


def test_repeating_the_same_action_warns_then_exits_5(cli, llm, isolated):
    llm.add(*[act("execute_shell", "ls /nonexistent-dir")] * 6)
    proc = cli("-y", "loop forever")
    assert proc.returncode == 5, proc.stderr
    _, result, trace = load_run(isolated.home)
    assert result["status"] == "stuck" and result["steps"] == 5
    assert any(e["type"] == "loop_warning" for e in trace)
    assert "WARNING: you are going round in circles" in llm.agent_requests()[3]["messages"][-1]["content"]


def test_retries_after_429_and_500_then_succeeds(cli, llm, isolated):
    llm.add(Fail(429, {"Retry-After": "0"}, "rate limited"), Fail(500), Fail(503), act("done", "survived"))
    proc = cli("retry please")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "survived"
    assert len(llm.requests) == 4
    _, result, _ = load_run(isolated.home)
    assert result["llm_calls"] == 1


def test_endpoint_failing_past_the_retries_exits_2_and_is_resumable(cli, llm, isolated):
    llm.add(act("memorize_thoughts", "step one done"), *[Fail(503, {"Retry-After": "0"})] * 5)
    proc = cli("fragile")
    assert proc.returncode == 2, proc.stderr
    directory, result, _ = load_run(isolated.home)
    assert result["status"] == "error" and result["steps"] == 1
    assert "kept failing" in proc.stderr and "Traceback" not in proc.stderr
    llm.add(act("done", "recovered"))
    proc = cli("resume", directory.name)
    assert proc.returncode == 0 and proc.stdout.strip() == "recovered"


def test_the_same_server_error_twice_is_not_retried_further(cli, llm, isolated):
    """A 500 that says the request is wrong ("Conversation roles must alternate") comes back the same each time."""
    llm.add(*[Fail(500, {"Retry-After": "0"}, "Conversation roles must alternate user/assistant")] * 5)
    proc = cli("fragile")
    assert proc.returncode == 2 and "twice with the same error" in proc.stderr, proc.stderr
    assert len(llm.requests) == 2


def test_endpoint_error_that_retrying_cannot_fix_exits_2(cli, llm, isolated):
    llm.add(Fail(400, message="this model does not exist in that form"))
    proc = cli("bad request")
    assert proc.returncode == 2 and "internal error" not in proc.stderr  # the endpoint refused us: not our bug
    assert len(llm.requests) == 1  # not retried
    assert "does not exist in that form" in proc.stderr and "resume" not in proc.stderr
    assert not (isolated.home / "runs").exists() or not any((isolated.home / "runs").iterdir())  # no junk run
    assert "Traceback" not in proc.stderr


def test_configuration_errors_exit_2_with_one_line(cli, isolated):
    no_key = cli("hello", env={"OPENAI_API_KEY": None, "OPENAI_BASE_URL": None})
    assert no_key.returncode == 2
    assert no_key.stderr.strip().count("\n") == 0 and "OPENAI_API_KEY" in no_key.stderr
    unreachable = cli("hello", env={"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"})
    assert unreachable.returncode == 2
    assert unreachable.stderr.strip().count("\n") == 0 and "OPENAI_BASE_URL" in unreachable.stderr
    bad_value = cli("--max-steps", "many", "hello")
    assert bad_value.returncode == 2 and "--max-steps" in bad_value.stderr and "Traceback" not in bad_value.stderr
    bad_env = cli("hello", env={"MINIAGI_CRITIC": "perhaps"})
    assert bad_env.returncode == 2 and "MINIAGI_CRITIC" in bad_env.stderr
    too_small = cli("--max-context-tokens", "50", "hello")
    assert too_small.returncode == 2 and "--max-context-tokens" in too_small.stderr
    assert run_dirs(isolated.home) == []  # nothing was started


def test_while_true_is_stopped_by_exec_timeout_and_the_run_goes_on(cli, llm, isolated):
    llm.add(act("execute_python", "counter = 1"), act("execute_python", "while True: pass"),
            act("execute_python", "print('counter is', counter)"), act("execute_shell", "sleep 30"),
            act("done", "ok"))
    proc = cli("-y", "--exec-timeout", "1", "spin")
    assert proc.returncode == 0, proc.stderr
    _, _, trace = load_run(isolated.home)
    seen = observations(trace)
    assert "Timed out after 1 s" in seen[2]
    assert "counter is 1" in seen[3]  # the interrupted session kept its state
    assert "Timed out after 1 s" in seen[4] and "process group were killed" in seen[4]


def test_os_exit_in_a_snippet_restarts_the_worker_and_says_state_was_lost(cli, llm, isolated):
    llm.add(act("execute_python", "value = 5"), act("execute_python", "import os\nprint('bye')\nos._exit(1)"),
            act("execute_python", "print(value)"), act("execute_python", "import sys; sys.exit(2)"),
            act("execute_python", "print('alive')"), act("done", "ok"))
    proc = cli("-y", "crash it")
    assert proc.returncode == 0, proc.stderr
    _, _, trace = load_run(isolated.home)
    seen = observations(trace)
    assert "bye" in seen[2] and "exited with code 1" in seen[2] and "lost" in seen[2]
    assert "NameError" in seen[3]
    assert "SystemExit: 2" in seen[4]
    assert "alive" in seen[5]


def test_a_10_mb_print_is_capped_before_it_reaches_the_context(cli, llm, isolated):
    llm.add(act("execute_python", "print('x' * 10_000_000 + 'END')"), act("done", "ok"))
    proc = cli("-y", "--max-context-tokens", "6000", "flood")
    assert proc.returncode == 0, proc.stderr
    directory, _, trace = load_run(isolated.home)
    seen = observations(trace)[1]
    # capped to characters (twice those of the room one output has at 6,000 tokens) long before 10 MB
    assert len(seen) < Budget(context=6000).item_chars + 200 and "cut" in seen and seen.rstrip().endswith("END")
    assert (directory / "trace.jsonl").stat().st_size < 200_000
    second_prompt = json.dumps(llm.agent_requests()[1]["messages"])
    assert len(second_prompt) < 6000 * 4


def test_secrets_are_invisible_to_code_and_absent_from_run_files(cli, llm, isolated):
    secrets = {"OPENAI_API_KEY": "sk-very-secret-openai-key", "GITHUB_TOKEN": "ghp_tokenvalue12345",
               "DB_PASSWORD": "hunter2-password"}
    (isolated.work / ".env").write_text("STRIPE_SECRET_KEY=sk_live_dotenvsecret99\n")
    llm.add(act("execute_python", "import os\nprint(sorted(os.environ.items()))"),
            act("execute_shell", "env; cat .env"),
            act("execute_python", "print(open('.env').read())"),
            act("done", "checked"))
    proc = cli("-y", "look around", env={**secrets, **MEMORY_ON})
    assert proc.returncode == 0, proc.stderr
    directory, _, trace = load_run(isolated.home)
    seen = observations(trace)
    assert "PATH" in seen[1]
    assert "STRIPE_SECRET_KEY" not in seen[2] + seen[3]  # the sandbox hides .env from code (docs/sandbox.md)
    # every file of the run and of the persistent memory (chromadb's sqlite included)
    everything = "".join(path.read_bytes().decode("utf-8", "replace") for path in isolated.home.rglob("*")
                         if path.is_file())
    everything += json.dumps(llm.requests) + proc.stdout + proc.stderr
    for value in [*secrets.values(), "sk_live_dotenvsecret99"]:
        assert value not in everything
    for name in ("OPENAI_API_KEY", "GITHUB_TOKEN", "DB_PASSWORD"):
        assert name not in seen[1] and name not in seen[2]


def test_without_yes_and_without_a_terminal_code_is_refused_with_advice(cli, llm, isolated):
    llm.add(act("execute_shell", "touch should-not-exist"), act("talk_to_user", "Shall I go on?"), act("done", "ok"))
    proc = cli("try to run")
    assert proc.returncode == 0, proc.stderr
    assert not (isolated.work / "should-not-exist").exists()
    _, _, trace = load_run(isolated.home)
    seen = observations(trace)
    assert "-y" in seen[1] and "Not run" in seen[1]
    assert "No user is present" in seen[2]


def _wait_for(predicate, timeout=180.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _start(llm, isolated, *args, **popen):
    env = dict(os.environ, OPENAI_BASE_URL=llm.url, OPENAI_API_KEY="sk-test-key-123456")
    return subprocess.Popen([sys.executable, "-m", "miniagi", *args], cwd=isolated.work, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **popen)


def test_interrupt_saves_state_exits_130_and_resume_finishes_without_repeating(cli, llm, isolated):
    llm.add(act("execute_python", "open('steps.txt','a').write('step1\\n')\ntotal = 10"),
            act("execute_shell", "echo step2 >> steps.txt"),
            Hang(60))
    process = _start(llm, isolated, "-y", "count steps")
    assert _wait_for(lambda: len(llm.requests) == 3)  # the model is "thinking" about step 3
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=180)
    assert process.returncode == 130, stderr
    directory, result, trace = load_run(isolated.home)
    assert result["status"] == "interrupted" and result["steps"] == 2

    llm.script.clear()
    llm.add(act("execute_python", "print(open('steps.txt').read())"), act("done", "two steps"))
    proc = cli("resume", directory.name, "-y")  # a trace grants no approval: -y again
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "two steps"
    assert (isolated.work / "steps.txt").read_text() == "step1\nstep2\n"
    _, result, trace = load_run(isolated.home)
    assert result["status"] == "done" and result["steps"] == 4
    assert [e["step"] for e in trace if e["type"] == "action"] == [1, 2, 3, 4]
    resumed_prompt = json.dumps(llm.agent_requests()[-2]["messages"])
    assert "echo step2" in resumed_prompt and "resumed" in resumed_prompt


def test_ctrl_c_works_even_when_started_with_sigint_ignored(llm, isolated):
    # a shell without job control starts background commands with SIGINT ignored (`miniagi … &` in a script, a
    # batch run in the background): the interrupt must still stop the run with its state saved
    llm.add(Hang(60))
    process = _start(llm, isolated, "wait", preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert _wait_for(lambda: len(llm.requests) == 1)
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=180)
    assert process.returncode == 130
    _, result, _ = load_run(isolated.home)
    assert result["status"] == "interrupted"


def test_sigterm_is_an_interrupt_too(llm, isolated):
    llm.add(Hang(60))
    process = _start(llm, isolated, "wait")
    assert _wait_for(lambda: len(llm.requests) == 1)
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=180)
    assert process.returncode == 130
    _, result, _ = load_run(isolated.home)
    assert result["status"] == "interrupted"


def test_runs_and_show_list_and_explain_runs(cli, llm, isolated):
    llm.add(act("execute_python", "print(2 + 2)", "add"), act("done", "four"))
    assert cli("-y", "add numbers").returncode == 0
    llm.add("garbage", "garbage", "garbage")
    assert cli("break format").returncode == 4
    listing = cli("runs")
    assert listing.returncode == 0
    assert listing.stdout.index("break format") < listing.stdout.index("add numbers")  # newest first
    header, newest = listing.stdout.splitlines()[:2]
    assert header.split("\t")[:3] == ["id", "started", "status"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d", newest.split("\t")[1])
    as_json = json.loads(cli("runs", "--json").stdout)
    assert [r["status"] for r in as_json] == ["format_error", "done"]
    only_done = json.loads(cli("runs", "--status", "done", "--json").stdout)
    assert [r["objective"] for r in only_done] == ["add numbers"]
    shown = cli("show", only_done[0]["run_id"])
    assert shown.returncode == 0
    for expected in ("step 1", "execute_python", "print(2 + 2)", "4", "answer", "four", "tokens"):
        assert expected in shown.stdout
    raw = cli("show", only_done[0]["run_id"], "--raw")
    assert "<r>add</r><c>execute_python</c>" in raw.stdout
    missing = cli("show", "nope")
    assert missing.returncode == 2 and "no run" in missing.stderr


def test_endpoint_url_mistakes_are_named_with_the_fix(cli, llm, isolated):
    # https:// to a server that speaks plain http: said at once (no retries), with the http:// URL to use
    tls = cli("-y", "hello", env={"OPENAI_BASE_URL": llm.url.replace("http://", "https://")})
    assert tls.returncode == 2 and "does not speak TLS" in tls.stderr and f"OPENAI_BASE_URL={llm.url}" in tls.stderr
    assert llm.requests == [] and run_dirs(isolated.home) == []  # no retries, no junk run
    # a base URL without /v1, answered 404: the hint names the URL with /v1
    bare = llm.url.rsplit("/v1", 1)[0]
    llm.add(Fail(404, message="Not Found"))
    missing = cli("-y", "hello", env={"OPENAI_BASE_URL": bare})
    assert missing.returncode == 2 and f"try OPENAI_BASE_URL={bare}/v1" in missing.stderr, missing.stderr
