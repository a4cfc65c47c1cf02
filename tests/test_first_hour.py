"""The first hour of a new user: words that are not runs, `setup` and the user's own settings file, `tools`,
`--version`, and what `show last` says before any run."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys

import pytest

from miniagi import __version__

from .conftest import act, one_line, run_dirs
from .test_mcp import PROBE, write_config


@pytest.mark.parametrize("word, meant", [
    ("help", "miniagi --help"), ("version", "miniagi --version"), ("list", "miniagi runs"), ("ls", "miniagi runs"),
    ("config", "miniagi setup"), ("mcp", "miniagi tools"), ("logs", "miniagi show last"), ("rusn", "miniagi runs"),
    ("shwo", "miniagi show"), ("resum", "miniagi resume"), ("Help", "miniagi --help"),
])
def test_a_lone_word_that_means_a_command_starts_nothing(cli, llm, isolated, word, meant):
    (isolated.work / ".mcp.json").write_text(json.dumps({"mcpServers": {"probe": {"command": sys.executable,
                                                                                  "args": [PROBE]}}}))
    proc = cli(word)
    assert proc.returncode == 2 and one_line(proc.stderr), proc.stderr
    assert f"did you mean {meant}" in proc.stderr and f"miniagi run {word}" in proc.stderr
    assert llm.requests == [] and run_dirs(isolated.home) == [] and proc.stdout == ""
    assert "MCP" not in proc.stderr  # nothing was asked about, nothing started


def test_the_same_word_after_options_is_caught_and_run_word_is_a_one_word_objective(cli, llm, isolated):
    proc = cli("-y", "--max-steps", "3", "ls")
    assert proc.returncode == 2 and "did you mean miniagi runs" in proc.stderr and llm.requests == []
    llm.add(act("done", "listed"))
    proc = cli("run", "ls")
    assert proc.returncode == 0 and proc.stdout == "listed\n"
    (run,) = run_dirs(isolated.home)
    assert json.loads((run / "result.json").read_text())["objective"] == "ls"


@pytest.mark.parametrize("objective", [["hello"], ["show settings"], ["list", "the", "files"], ["ls -la"]])
def test_a_word_that_may_be_an_objective_and_more_words_still_run(cli, llm, objective):
    llm.add(act("done", "hi there"))
    proc = cli("-y", *objective)
    assert proc.returncode == 0 and proc.stdout == "hi there\n", proc.stderr


def test_version_prints_the_name_and_version(cli):
    proc = cli("--version")
    assert proc.returncode == 0 and proc.stdout == f"miniagi {__version__}\n"
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__)


def test_tools_lists_the_built_in_commands_and_the_mcp_tools_with_their_arguments(cli, llm, isolated, tmp_path):
    config = write_config(tmp_path / "probe.json", {"probe": {"command": sys.executable, "args": [PROBE]}})
    proc = cli("tools", "--mcp-config", config)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "execute_python code: str" in out and "done answer: str" in out
    assert "MCP tools (servers: probe)" in out and 'probe__add {"a": 0, "b": 0}' in out
    assert "[MCP server probe] Add two whole numbers." in out
    assert llm.requests == [] and run_dirs(isolated.home) == []  # no run, no model call
    listed = json.loads(cli("tools", "--mcp-config", config, "--json").stdout)
    add = next(c for c in listed if c["name"] == "probe__add")
    assert add["server"] == "probe" and add["input_schema"]["required"] == ["a", "b"]
    bare = cli("tools")
    assert bare.returncode == 0 and "no MCP tools" in bare.stdout and "probe__add" not in bare.stdout


def test_tools_without_a_terminal_does_not_use_an_unconfirmed_mcp_json(cli, isolated):
    (isolated.work / ".mcp.json").write_text(json.dumps({"mcpServers": {"probe": {"command": sys.executable,
                                                                                  "args": [PROBE]}}}))
    proc = cli("tools")
    assert proc.returncode == 0 and "probe__add" not in proc.stdout and "was not used" in proc.stderr


def test_show_last_before_any_run_is_one_line(cli, isolated):
    proc = cli("show", "last")
    assert proc.returncode == 2 and one_line(proc.stderr) and "there is no run" in proc.stderr, proc.stderr


def test_batch_says_where_each_objective_works(cli, isolated):
    text = " ".join(cli("batch", "--help").stdout.split())
    assert "DIR/work/ID" in text
    (isolated.work / "jobs.txt").write_text("say hi\n")
    proc = cli("batch", "jobs.txt", "--workers", "1", "-y", env={"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"})
    first = proc.stderr.splitlines()[0]
    assert "work directories in" in first and str(isolated.work / "jobs-txt-results" / "work") in first


# --- the user's own settings ----------------------------------------------------------------------------------------
def user_env(isolated) -> "os.PathLike":
    return isolated.work.parent / "user-home" / ".miniagi" / ".env"


def test_the_users_env_file_is_read_from_any_folder_after_the_environment_and_dotenv(cli, llm, isolated):
    path = user_env(isolated)
    path.parent.mkdir(parents=True)
    path.write_text(f'OPENAI_BASE_URL="{llm.url}"\nOPENAI_API_KEY="sk-user-file-key-99"\nMINIAGI_MODEL=from-user\n'
                    "MINIAGI_MAX_STEPS=7\n")
    deep = isolated.work / "a" / "b"
    deep.mkdir(parents=True)
    (deep / ".env").write_text("MINIAGI_MAX_STEPS=9\n")
    llm.add(act("done", "found it"))
    proc = cli("-y", "say where", cwd=deep, env={"OPENAI_BASE_URL": None, "OPENAI_API_KEY": None,
                                                 "MINIAGI_MODEL": None})
    assert proc.returncode == 0 and proc.stdout == "found it\n", proc.stderr
    assert llm.requests[-1]["model"] == "from-user"  # the file's model
    (run,) = run_dirs(isolated.home)
    start = json.loads((run / "trace.jsonl").read_text().splitlines()[0])
    assert start["settings"]["max_steps"] == 9  # ./.env wins over the user's file
    assert "sk-user-file-key-99" not in (run / "trace.jsonl").read_text()  # its key is a secret like any
    llm.add(act("done", "again"))
    proc = cli("-y", "--max-steps", "4", "again", cwd=deep, env={"OPENAI_BASE_URL": None, "OPENAI_API_KEY": None,
                                                                 "MINIAGI_MODEL": "from-environment"})
    assert proc.returncode == 0 and llm.requests[-1]["model"] == "from-environment"


def test_no_endpoint_says_miniagi_setup(cli, isolated):
    proc = cli("say hi", env={"OPENAI_BASE_URL": None, "OPENAI_API_KEY": None})
    assert proc.returncode == 2 and one_line(proc.stderr) and "`miniagi setup`" in proc.stderr
    assert str(user_env(isolated)) in proc.stderr


def test_setup_at_a_terminal_asks_checks_and_writes_the_users_file(llm, isolated, tmp_path):
    from .test_live_terminal import Screen

    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "MINIAGI_"))}
    env["HOME"] = str(tmp_path / "user-home")
    screen = Screen(["setup"], isolated.work, env)
    screen.wait_for(r"Endpoint \(Enter for OpenAI, or a URL\):$")
    os.write(screen.master, f"{llm.url}\n".encode())
    screen.wait_for(r"API key \(hidden as you type; Enter for none: a local server\):$")
    os.write(screen.master, b"sk-setup-secret-4242\n")
    screen.wait_for(r"1\. gpt-4o-mini[\s\S]*Model \(a number or a name; Enter for gpt-4o-mini\)")  # /models' list
    llm.add("OK")
    os.write(screen.master, b"1\n")
    assert screen.finish() == 0
    shown = screen.text()
    assert "it works: gpt-4o-mini answered 'OK'" in shown and "sk-setup-secret-4242" not in shown
    path = user_env(isolated)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert f'OPENAI_BASE_URL="{llm.url}"' in text and 'OPENAI_API_KEY="sk-setup-secret-4242"' in text
    assert 'MINIAGI_MODEL="gpt-4o-mini"' in text
    assert len(llm.requests) == 1 and llm.headers[0]["authorization"] == "Bearer sk-setup-secret-4242"


def test_setup_says_what_failed_asks_again_and_writes_only_what_worked(cli, llm, isolated):
    from .fake_llm import Fail

    path = user_env(isolated)
    path.parent.mkdir(parents=True)
    path.write_text("# mine\nMINIAGI_MAX_COST=5\nMINIAGI_MODEL=old-model\n")
    llm.add(Fail(404, message="The model `no-such` does not exist"), "OK")
    # piped answers: a URL without a scheme, then the endpoint, no key, a model it refuses, then the listed one
    answers = f"localhost:1\n{llm.url}\n\nno-such\n{llm.url}\n\n\n"
    proc = cli("setup", input=answers, env={"OPENAI_BASE_URL": None, "OPENAI_API_KEY": None})
    assert proc.returncode == 0, proc.stderr
    assert "has no scheme" in proc.stderr and "does not serve model 'no-such'" in proc.stderr
    assert "it works" in proc.stderr
    text = path.read_text()
    assert "# mine" in text and "MINIAGI_MAX_COST=5" in text and "old-model" not in text
    assert 'MINIAGI_MODEL="gpt-4o-mini"' in text and "OPENAI_API_KEY" not in text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_setup_stopped_writes_nothing(cli, isolated):
    proc = cli("setup", input="http://127.0.0.1:9/v1\n")
    assert proc.returncode == 1 and "nothing was written" in proc.stderr
    assert not user_env(isolated).exists()


def test_the_mcp_json_question_names_each_server_and_its_command_line(llm, isolated):
    from .test_interactive import run_in_terminal

    (isolated.work / ".mcp.json").write_text(json.dumps({"mcpServers": {
        "probe": {"command": sys.executable, "args": [PROBE, "--flag"], "env": {"PROBE_SECRET": "hush-hush-123"}},
        "far": {"url": "http://127.0.0.1:9/mcp"}}}))
    llm.add(act("done", "ok"))
    env = dict(os.environ, OPENAI_BASE_URL=llm.url, OPENAI_API_KEY="sk-test-key-123456", MINIAGI_MEMORY_SCOPE="off")
    proc = run_in_terminal(llm, isolated, "n\n", "-y", "add", env=env)
    assert proc.returncode == 0, proc.stderr
    question = proc.stderr[proc.stderr.index("asks to start MCP servers"):proc.stderr.index("Start them?")]
    assert f"  probe: {sys.executable} -I {PROBE} --flag (with PROBE_SECRET set)" in question
    assert "  far: http://127.0.0.1:9/mcp" in question and "hush-hush-123" not in proc.stderr


# --- a reader that goes away -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("closed", ["stderr", "stdout and stderr"])
def test_a_closed_pipe_does_not_end_the_run_and_its_record_is_right(llm, isolated, closed):
    import threading

    from .fake_llm import Stream, Wait

    pipes_closed = threading.Event()
    llm.add(Stream(["<r>", "Writing ", "now", Wait(pipes_closed), "</r><c>execute_python</c>\n",
                    "open('out.txt', 'w').write('kept')\nfor i in range(2000):\n    print('line', i)"]),
            act("done", "written " * 500))  # more than a pipe holds, after its reader left
    process = subprocess.Popen([sys.executable, "-m", "miniagi", "-y", "write the file"], cwd=isolated.work,
                               env=dict(os.environ, OPENAI_BASE_URL=llm.url, OPENAI_API_KEY="sk-test-key-123456",
                                        MINIAGI_MEMORY_SCOPE="off"),
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert "started" in process.stderr.readline()  # like `head -1`: one line, then the reader is gone
    process.stderr.close()
    if closed == "stdout and stderr":
        process.stdout.close()
    pipes_closed.set()
    assert process.wait(120) == 0
    (run,) = run_dirs(isolated.home)
    result = json.loads((run / "result.json").read_text())
    assert (result["status"], result["steps"], result["llm_calls"]) == ("done", 2, 2)
    assert result["cost_usd"] > 0 and result["ended_at"] and (isolated.work / "out.txt").read_text() == "kept"
    if closed == "stderr":
        assert process.stdout.read().startswith("written written")


def test_a_killed_runs_clock_stops_where_it_died(cli, llm, isolated):
    import signal

    from .test_end_to_end import _start, _wait_for

    llm.add(act("execute_python", "import time\nopen('started', 'w').close()\ntime.sleep(300)"))
    process = _start(llm, isolated, "-y", "long work")
    assert _wait_for(lambda: (isolated.work / "started").exists())
    process.send_signal(signal.SIGKILL)
    process.wait()
    (run,) = run_dirs(isolated.home)
    died = max((run / "trace.jsonl").stat().st_mtime, (run / "result.json").stat().st_mtime)
    (listed,) = json.loads(cli("runs", "--json").stdout)
    assert listed["status"] == "interrupted"
    ended = listed["ended_at"]
    from datetime import datetime

    assert abs(datetime.fromisoformat(ended.replace("Z", "+00:00")).timestamp() - died) < 1.5
    assert json.loads(cli("runs", "--json").stdout)[0]["ended_at"] == ended  # read again later: the same end


# --- a resume after an interrupted command -------------------------------------------------------------------------
def _interrupted_in_code(llm, isolated):
    """A run stopped by Ctrl-C while step 2's code runs (it appended a line to a file first)."""
    import signal

    from .test_end_to_end import _start, _wait_for

    llm.add(act("memorize_thoughts", "a plan"),
            act("execute_python", "open('log.txt', 'a').write('ran\\n')\nimport time\ntime.sleep(0.5 if "
                                  "open('log.txt').read().count('ran') > 1 else 300)\nprint('slept')",
                thought="append then wait"))
    process = _start(llm, isolated, "-y", "append and wait")
    assert _wait_for(lambda: (isolated.work / "log.txt").exists())
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    return len(llm.requests)


def test_a_resume_says_the_command_was_cut_off_and_keeps_its_recorded_reply(cli, llm, isolated):
    asked = _interrupted_in_code(llm, isolated)
    (run,) = run_dirs(isolated.home)
    end = [json.loads(line) for line in (run / "trace.jsonl").read_text().splitlines()][-1]
    assert end["type"] == "run_end" and end["cut_short"]["step"] == 2 and end["cut_short"]["ran_s"] >= 0
    llm.add(act("done", "appended"))
    proc = cli("resume", "last", "-y")
    assert proc.returncode == 0, proc.stderr
    said = re.search(r"step 2's code was interrupted after (\d+\.\d) s; it will run again", proc.stderr)
    assert said and float(said.group(1)) == end["cut_short"]["ran_s"]
    assert "resuming at step 2" in proc.stderr and "step 2 execute_python" in proc.stderr  # shown again
    assert len(llm.requests) == asked + 1  # step 2's reply was not asked for again: only step 3's
    assert (isolated.work / "log.txt").read_text() == "ran\nran\n"  # its code did run again, as said
    events = [json.loads(line) for line in (run / "trace.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e["type"] == "action"] == [1, 2, 3]  # step 2 recorded once
    observed = {e["step"]: e["text"] for e in events if e["type"] == "observation"}
    assert "slept" in observed[2]
    resume = next(e for e in events if e["type"] == "resume")
    assert resume["kept_step"] == 2
    result = json.loads((run / "result.json").read_text())
    assert (result["status"], result["steps"], result["llm_calls"]) == ("done", 3, 3)
    shown = cli("show", "last")
    assert shown.returncode == 0 and shown.stdout.count("step 2 command: execute_python") == 1, shown.stdout
    assert "slept" in shown.stdout


def test_at_a_terminal_the_person_may_ask_the_model_anew(llm, isolated):
    from .test_interactive import run_in_terminal

    asked = _interrupted_in_code(llm, isolated)
    llm.add(act("execute_python", "print('another way')"), act("done", "asked anew"))
    env = dict(os.environ, OPENAI_BASE_URL=llm.url, OPENAI_API_KEY="sk-test-key-123456", MINIAGI_MEMORY_SCOPE="off")
    proc = run_in_terminal(llm, isolated, "y\n", "resume", "last", "-y", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "step 2's code was interrupted after" in proc.stderr and "Ask the model for step 2 anew" in proc.stderr
    assert len(llm.requests) == asked + 2 and (isolated.work / "log.txt").read_text() == "ran\n"
    (run,) = run_dirs(isolated.home)
    events = [json.loads(line) for line in (run / "trace.jsonl").read_text().splitlines()]
    assert "kept_step" not in next(e for e in events if e["type"] == "resume")
