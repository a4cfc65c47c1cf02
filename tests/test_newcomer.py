"""What a new user hits first: the rough edges of the command line, tried as a user would."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from .conftest import MEMORY_ON, act, one_line, run_dirs
from .fake_llm import Fail, Hang
from .test_end_to_end import _start, _wait_for, load_run, observations
from .test_interactive import run_in_terminal


def test_a_workdir_that_is_a_file_is_refused_and_a_missing_one_is_made(cli, llm, isolated):
    (isolated.work / "afile").write_text("x")
    proc = cli("-y", "--workdir", "afile", "do things")
    assert proc.returncode == 2 and one_line(proc.stderr) and "is a file, not a directory" in proc.stderr
    assert run_dirs(isolated.home) == []
    llm.add(act("execute_shell", "pwd"), act("done", "ok"))
    made = cli("-y", "--workdir", "new/place", "do things")
    assert made.returncode == 0, made.stderr
    assert "created the work directory" in made.stderr and (isolated.work / "new" / "place").is_dir()
    assert observations(load_run(isolated.home)[2])[1].startswith(str(isolated.work / "new" / "place"))


def test_an_objective_starting_with_a_command_name_gets_a_hint(cli):
    proc = cli("show", "me", "the", "largest", "file")
    assert proc.returncode == 2 and 'miniagi run "show me the largest file"' in proc.stderr


@pytest.mark.parametrize("argv, expected", [
    (["--modle", "gpt-4o", "hello"], "unknown option: --modle (did you mean --model?)"),
    (["--max-step", "3", "hello"], "unknown option: --max-step (did you mean --max-steps?)"),  # no abbreviations
    (["show", "--rwa", "x"], "unknown option: --rwa (did you mean --raw?)"),
    (["batch", "jobs.txt", "--worker", "3"], "unknown arguments: --worker (did you mean --workers?), 3"),
])
def test_an_unknown_option_is_named_with_the_closest_one(argv, expected, capsys):
    from miniagi.cli import main

    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and expected in err and "quote it" not in err
    # one line, not the usage first; it names the command's own help
    assert one_line(err) and f"`miniagi {argv[0] if argv[0] in ('show', 'batch') else 'run'} --help`" in err


def test_help_shows_defaults_and_what_prompt_user_means(capsys):
    from miniagi.cli import main

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "spending limit in USD, 0 for none (exit 3) (default: 2)" in text and "(default: gpt-4o-mini)" in text
    assert "PROMPT_USER=false means the same" in text


def test_a_killed_run_is_listed_as_interrupted_not_running(cli, llm, isolated):
    llm.add(act("execute_python", "import time\nopen('started', 'w').close()\ntime.sleep(300)"))
    process = _start(llm, isolated, "-y", "long work")
    assert _wait_for(lambda: (isolated.work / "started").exists())
    process.send_signal(signal.SIGKILL)
    process.wait()
    (listed,) = json.loads(cli("runs", "--json").stdout)
    assert listed["status"] == "interrupted" and "is gone" in listed["message"]
    assert json.loads(cli("runs", "--status", "running", "--json").stdout) == []


def test_a_refused_model_leaves_no_run_behind(cli, llm, isolated):
    llm.add(Fail(404, message="The model `gpt-7` does not exist"))
    proc = cli("--model", "gpt-7", "hello")
    assert proc.returncode == 2 and "does not serve model 'gpt-7'; it serves: gpt-4o-mini" in proc.stderr
    assert run_dirs(isolated.home) == []
    run_id = proc.stderr.split("run ", 1)[1].split()[0]  # said when it started: the error says it was not kept
    assert f"run {run_id} was not kept" in proc.stderr.splitlines()[-1]


def test_a_batch_rerun_resumes_what_a_limit_stopped_and_file_kinds_keep_their_results_apart(cli, llm, isolated):
    llm.add(act("execute_shell", "echo one >> log.txt"), act("execute_shell", "echo two >> log.txt"))
    (isolated.work / "jobs.txt").write_text("count to three\n")
    first = cli("batch", "jobs.txt", "-y", "--max-steps", "2")
    assert first.returncode == 3, first.stderr
    llm.add(act("execute_shell", "echo three >> log.txt"), act("done", "counted"))
    second = cli("batch", "jobs.txt", "-y", "--max-steps", "10")
    assert second.returncode == 0, second.stderr
    # went on, did not start over, in the objective's own work directory (never the folder of the results)
    assert (isolated.work / "jobs-txt-results" / "work" / "1" / "log.txt").read_text() == "one\ntwo\nthree\n"
    lines = [json.loads(line) for line in (isolated.work / "jobs-txt-results" / "results.jsonl").read_text()
             .splitlines()]
    assert [r["status"] for r in lines] == ["limit", "done"] and lines[0]["run_id"] == lines[1]["run_id"]
    assert len(run_dirs(isolated.home)) == 1
    (isolated.work / "jobs.jsonl").write_text('{"id": "a", "objective": "other"}\n')
    llm.add(act("done", "other done"))
    assert cli("batch", "jobs.jsonl").returncode == 0
    assert (isolated.work / "jobs-jsonl-results" / "results.jsonl").exists()
    assert len((isolated.work / "jobs-txt-results" / "results.jsonl").read_text().splitlines()) == 2


def test_small_things_said_right(cli, llm, isolated):
    (isolated.work / ".env").write_text("MINIAGI_MAX_STEPS=5\nthis line is not a setting\n")
    llm.add(act("done", "ok"))
    proc = cli("hello")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("could not parse") == 1 and ".env" in proc.stderr
    assert "1 step · 1 model call ·" in proc.stderr
    zero = cli("--exec-timeout", "0", "hello")
    assert zero.returncode == 2 and "--exec-timeout" in zero.stderr and "more than 0" in zero.stderr


def test_piped_output_is_not_wrapped_and_show_keeps_its_labels(cli, llm, isolated):
    objective = "Write a report " + "about many long things " * 12 + "END-OF-OBJECTIVE"
    llm.add(act("execute_python", "print('x' * 300)", "a thought"), act("done", "ok"))
    proc = cli("-y", "--max-steps", "3", objective)
    assert proc.returncode == 0
    listing = cli("runs").stdout
    assert any(objective[:150] in line for line in listing.splitlines())
    run_id = run_dirs(isolated.home)[0].name
    shown = cli("show", run_id).stdout.splitlines()
    for label in ("thought: a thought", "argument:", "observation:"):
        assert any(line.startswith(label) for line in shown), label
    assert any(line.strip() == "x" * 300 for line in shown)  # one line, as printed


def test_waiting_on_the_endpoint_is_said(cli, llm, isolated):
    llm.add(Fail(429, headers={"Retry-After": "1"}, message="slow down"), act("done", "ok"))
    proc = cli("hello")
    assert proc.returncode == 0, proc.stderr
    assert "retrying in 1 s (attempt 2 of 5)" in proc.stderr


def test_recall_keeps_to_relevant_memories_of_this_workdir(cli, llm, isolated, tmp_path):
    default_scope = {"MINIAGI_MEMORY_SCOPE": None}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    llm.add(act("execute_shell", "ls -la /"), act("memorize_thoughts", "The vault code is PLUM-4471."),
            act("done", "listed"))
    assert cli("-y", "List the root directory and note the vault code", env=default_scope,
               cwd=elsewhere).returncode == 0
    llm.add(act("done", "391"))
    assert cli("What is 17 * 23?", env=default_scope).returncode == 0
    assert "RELEVANT MEMORIES" not in json.dumps(llm.agent_requests()[-1]["messages"])  # nothing from elsewhere
    llm.add(act("done", "PLUM-4471"))
    assert cli("What is the vault code?", "--memory-scope", "global", env=default_scope).returncode == 0
    prompt = json.dumps(llm.agent_requests()[-1]["messages"])
    assert "PLUM-4471" in prompt and "ls -la" not in prompt  # the relevant memory, not the listing


def test_clearing_all_memory_asks_first_in_a_terminal(cli, llm, isolated):
    llm.add(act("memorize_thoughts", "The spare key is under the blue flowerpot."), act("done", "ok"))
    assert cli("remember", env=MEMORY_ON).returncode == 0
    found = cli("memory", "search", "where is the spare key")
    assert "similarity 0." in found.stdout and "note · run " in found.stdout and "flowerpot" in found.stdout
    unrelated = cli("memory", "search", "quarterly tax rates in Belgium")  # only what is relevant is shown
    assert "no relevant memories found" in unrelated.stdout and "--all shows them" in unrelated.stdout
    kept = run_in_terminal(llm, isolated, "n\n", "memory", "clear")
    assert kept.returncode == 1 and "nothing was deleted" in kept.stdout and "Delete ALL" in kept.stdout
    assert json.loads(cli("memory", "stats", "--json").stdout)["items"] > 0
    refused = cli("memory", "clear")  # no terminal to ask in: nothing is deleted without --yes
    assert refused.returncode == 2 and one_line(refused.stderr) and "--yes" in refused.stderr
    assert json.loads(cli("memory", "stats", "--json").stdout)["items"] > 0
    unknown = cli("memory", "clear", "--run", "nosuchrun", "--yes")
    assert unknown.returncode == 2 and "nosuchrun" in unknown.stderr and one_line(unknown.stderr)
    cleared = cli("memory", "clear", "--json", "--yes")
    assert cleared.returncode == 0 and json.loads(cleared.stdout)["removed"] > 0


def test_memory_takes_a_memory_url_and_an_unreachable_one_is_one_line(cli):
    proc = cli("memory", "stats", "--memory-url", "http://127.0.0.1:9")
    assert proc.returncode in (1, 2) and one_line(proc.stderr) and "127.0.0.1:9" in proc.stderr


def test_a_batch_objective_interrupted_while_starting_is_recorded_as_interrupted(llm, isolated, tmp_path):
    # a run process that is still starting: Python's start-up waits here until the test lets it go
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    started, release = tmp_path / "started", tmp_path / "release"
    (hooks / "sitecustomize.py").write_text(
        "import os, time\n"
        "if os.environ.get('HOLD_START') and 'batch' not in ' '.join(__import__('sys').argv):\n"
        f"    open({str(started)!r}, 'w').close()\n"
        f"    while not os.path.exists({str(release)!r}):\n"
        "        time.sleep(0.05)\n")
    (isolated.work / "jobs.txt").write_text("say hi\n")
    env = dict(os.environ, OPENAI_BASE_URL=llm.url, OPENAI_API_KEY="sk-test", MINIAGI_MEMORY_SCOPE="off",
               PYTHONPATH=f"{hooks}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", HOLD_START="1")
    batch = subprocess.Popen([sys.executable, "-m", "miniagi", "batch", "jobs.txt"], cwd=isolated.work, env=env,
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert _wait_for(started.exists)
        batch.send_signal(signal.SIGINT)
        _, stderr = batch.communicate(timeout=180)
    finally:
        release.touch()
    assert batch.returncode == 130, stderr
    (record,) = [json.loads(line) for line in (isolated.work / "jobs-txt-results" / "results.jsonl").read_text()
                 .splitlines()]
    assert record["status"] == "interrupted"


def test_the_python_api_can_be_quiet_and_a_resume_says_where_it_goes_on(isolated, capfd):
    from miniagi import Agent, ScriptedModel, Settings

    settings = Settings(yes=True, unattended=True, workdir=str(isolated.work), home=str(isolated.home),
                        memory_scope="off", max_steps=1)
    stopped = Agent(settings, model=ScriptedModel([act("execute_python", "print(6 * 7)")]),
                    quiet=True).run("six sevens")
    assert stopped.status == "limit" and capfd.readouterr().err == ""  # nothing printed at all
    loud = Agent(settings.with_overrides({"max_steps": 3}), model=ScriptedModel([act("done", "42")]))
    assert loud.resume(stopped.run_id).answer == "42"
    assert f"run {stopped.run_id} resuming at step 2" in capfd.readouterr().err


def test_a_dotenv_question_is_asked_after_the_spinner_with_its_choices_and_the_answer_echoed(cli, llm, isolated):
    from .test_live_terminal import Screen

    (isolated.work / ".env").write_text(f"OPENAI_BASE_URL={llm.url}\n")
    llm.add(act("done", "first"), act("done", "second"))
    assert cli("hello").returncode == 0  # the first sight of this .env: taken as it is, and remembered
    (isolated.work / ".env").write_text(f"OPENAI_BASE_URL={llm.url}/\n")  # changed since
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_BASE_URL"}
    screen = Screen(["hello again"], isolated.work, dict(env, OPENAI_API_KEY="sk-test-key-123456",
                                                         MINIAGI_MEMORY_SCOPE="off"))
    shown = screen.wait_for(r"\[y\]es / \[N\]o: ?$")
    assert "starting…" not in shown and "Use it?" in shown
    os.write(screen.master, b"y\r")
    assert screen.finish() == 0
    assert "[y]es / [N]o: y\n" in screen.text() and "second" in screen.text()


def test_miniagis_own_env_example_works_as_written_and_its_ignored_names_are_said_once(cli, llm, isolated):
    # tests/data/miniagi.env_example: MiniAGI's .env_example, from its repository (muellerberndt/mini-agi)
    example = (Path(__file__).parent / "data" / "miniagi.env_example").read_text()
    assert "\nWORK_DIR=\n" in example and "SUMMARIZER_CHUNK_SIZE=3000" in example
    (isolated.work / ".env").write_text(example)
    llm.add(act("execute_shell", "pwd"), act("done", "one"), act("done", "two"), act("done", "three"))
    first = cli("hello", process=True)
    assert first.returncode == 0, first.stderr
    assert first.stderr.count("SUMMARIZER_CHUNK_SIZE (a MiniAGI setting) is ignored") == 1
    assert "model gpt-4" in first.stderr  # MODEL="gpt-4" is taken
    _, result, trace = load_run(isolated.home)
    assert "needs the user's approval" in observations(trace)[1]  # PROMPT_USER=true: it asks; no one is there
    assert result["workdir"] == str(isolated.work)  # WORK_DIR= (empty): the default
    second = cli("hello", process=True)
    assert second.returncode == 0 and "is ignored" not in second.stderr  # the same file: said already
    (isolated.work / ".env").write_text(example.replace("SUMMARIZER_CHUNK_SIZE=3000", "SUMMARIZER_CHUNK_SIZE=1000"))
    third = cli("hello", process=True)
    assert third.returncode == 0 and "SUMMARIZER_CHUNK_SIZE (a MiniAGI setting) is ignored" in third.stderr


def test_the_readme_installs_in_a_way_an_externally_managed_python_allows():
    """The README's first command works where only Python and pip are (`pip install .`); Debian 12 and Ubuntu
    23.04+ refuse that into the system Python (PEP 668), so the README says, right under it, the line that works
    there (pipx, or a virtual environment)."""
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    first = readme.split("```bash\n", 1)[1].split("\n```", 1)[0]
    assert first.startswith("pip install . && miniagi setup")  # then the endpoint is asked for, not an error
    after = " ".join(readme.split(first, 1)[1].split("```bash", 1)[0].split())
    assert "externally-managed-environment" in after and "pipx install ." in after and "apt install pipx" in after
    assert "python3 -m venv" in after
    second = readme.split("```bash\n", 2)[2].split("\n```", 1)[0]
    assert second == 'pip install -e ".[test]" && python -m pytest -q'  # what CI runs (.ci/run), unchanged


def test_resume_hints_say_the_exact_command_with_y(cli, llm, isolated):
    llm.add(act("execute_shell", "echo one"), act("execute_shell", "echo two"))
    stopped = cli("-y", "--max-steps", "2", "--pass-env", "LANG", "count")
    assert stopped.returncode == 3
    (run_id,) = [path.name for path in run_dirs(isolated.home)]
    hint = f"`miniagi resume {run_id} -y --pass-env LANG --max-steps 4`"
    assert hint in stopped.stderr
    # followed from a script, the hint runs its commands again (without -y each would be refused)
    llm.add(act("execute_shell", "echo three > three.txt"), act("done", "counted"))
    resumed = cli(*hint.strip("`").split()[1:])
    assert resumed.returncode == 0 and (isolated.work / "three.txt").read_text() == "three\n"
    # given without -y, the notice says what to add
    llm.add(act("execute_shell", "echo four"))
    cli("-y", "--max-steps", "1", "again")
    newest = sorted(run_dirs(isolated.home))[-1].name
    notice = cli("resume", newest, "--max-steps", "1")
    assert "--yes on (now off)" in notice.stderr and "add `-y` to the command" in notice.stderr


def test_m_is_model_and_miniagi_help_shows_the_main_run_options(cli, llm, capsys):
    from miniagi.cli import main

    llm.add(act("done", "ok"))
    assert cli("-m", "tiny-model", "hello").returncode == 0 and llm.requests[0]["model"] == "tiny-model"
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for shown in ("-m, --model M", "-y, --yes", "--max-steps N", "--max-cost USD", "--workdir DIR"):
        assert shown in text, shown


def test_chat_opens_with_a_banner_and_handles_help_and_exit(llm, isolated):
    from .test_live_terminal import Screen

    llm.add(act("done", "Paris"))
    screen = Screen(["chat", "-m", "tiny-model"], isolated.work,
                    dict(os.environ, OPENAI_BASE_URL=llm.url, OPENAI_API_KEY="sk-test-key-123456",
                         MINIAGI_MEMORY_SCOPE="off"))
    banner = screen.wait_for(r"›$")
    assert f"model tiny-model · folder {isolated.work}" in banner and "exit" in banner and "Ctrl-D" in banner
    os.write(screen.master, b"/help\r")
    screen.wait_for(r"carry over[\s\S]*›$")
    os.write(screen.master, b"capital of France?\r")
    turn = screen.wait_for(r"Paris\n›$")
    assert "objective: capital of France?" not in turn  # not echoed back: it was just typed
    os.write(screen.master, b"exit\r")
    assert screen.finish() == 0
    assert len(llm.agent_requests()) == 1  # neither /help nor exit went to the model


@pytest.mark.parametrize("base_url, says", [
    ("{host}/v1", "has no scheme: write it with http:// (a local server) or https://, e.g. "
                  "OPENAI_BASE_URL=http://{host}/v1"),
    ("http://{host}/v1/chat/completions", "is a request path, not the base: miniagi adds /chat/completions; set "
                                          "OPENAI_BASE_URL=http://{host}/v1"),
])
def test_endpoint_mistakes_are_named_with_the_fix(cli, llm, isolated, base_url, says):
    host = llm.url.removeprefix("http://").removesuffix("/v1")
    proc = cli("hello", env={"OPENAI_BASE_URL": base_url.format(host=host)})
    assert proc.returncode == 2 and one_line(proc.stderr) and says.format(host=host) in proc.stderr
    assert llm.requests == [] and run_dirs(isolated.home) == []


def test_approval_takes_ok_and_sure_as_yes_and_the_prompt_says_so(llm, isolated):
    from .test_live_terminal import Screen

    for name in ("ok", "sure", "enter", "refused", "feedback"):
        llm.add(act("execute_shell", f"touch {name}.txt"))
    llm.add(act("done", "finished"))
    screen = Screen(["make files"], isolated.work, dict(os.environ, OPENAI_BASE_URL=llm.url,
                                                       OPENAI_API_KEY="sk-test-key-123456",
                                                       MINIAGI_MEMORY_SCOPE="off"))
    for number, typed in enumerate(["OK", "sure", "", "no", "call it other.txt"], start=1):
        shown = screen.wait_for(rf"(?:Run it\?[\s\S]*){{{number}}}:$")  # the number-th question, waiting
        os.write(screen.master, typed.encode() + b"\r")
    assert screen.finish() == 0
    assert ("[Y]es / [n]o / [a]ll (this and every later command of this run) / or type feedback for the agent (Enter, "
            "y, yes, ok, sure: run it):") in " ".join(shown.split())
    assert shown.count("touch ok.txt") == 1  # in a terminal too, the code is shown once: in the approval panel
    made = {path.name for path in isolated.work.iterdir()}
    assert {"ok.txt", "sure.txt", "enter.txt"} <= made and not {"refused.txt", "feedback.txt"} & made
    trace = load_run(isolated.home)[2]
    assert "refused" in observations(trace)[4] and "call it other.txt" in observations(trace)[5]


def test_the_sandbox_is_named_in_the_header_and_described_only_when_weaker_or_asked(cli, llm, isolated, tmp_path):
    import shutil

    from .test_sandbox import refusing

    if not shutil.which("bwrap"):
        pytest.skip("bubblewrap is not installed")
    llm.add(act("done", "ok"), act("done", "ok"))
    quiet = cli("hello")
    assert "· sandbox: bwrap" in quiet.stderr.splitlines()[0]  # the choice is said, in the header
    assert "sandbox: bwrap —" not in quiet.stderr and "warning" not in quiet.stderr
    assert "sandbox: bwrap — work directory read-write" in cli("--debug", "hello").stderr
    # weaker: described at the start; what it does not protect is said when code first runs, not before
    llm.add(act("done", "no code"))
    weaker = cli("hello", env={"PATH": refusing(tmp_path, "bwrap")})
    assert "sandbox: namespace — " in weaker.stderr and "warning" not in weaker.stderr
    llm.add(act("execute_shell", "echo one"), act("execute_shell", "echo two"), act("done", "code"))
    coded = cli("-y", "hello", env={"PATH": refusing(tmp_path, "bwrap")})
    assert coded.stderr.count("warning: executed code is not in a file-system sandbox") == 1
    assert coded.stderr.index("warning:") > coded.stderr.index("step 1")


def test_a_read_only_work_directory_is_said_to_be_read_only(llm, isolated, tmp_path):
    import shutil
    import sys

    if not shutil.which("bwrap") or not shutil.which("unshare"):
        pytest.skip("needs bubblewrap and unshare")
    folder = tmp_path / "ro"
    folder.mkdir()
    llm.add(act("done", "ok"))
    # a read-only mount of its own (root in a mount namespace); a folder without the w bit is writable by root
    script = (f"mount --bind {folder} {folder} && mount -o remount,bind,ro {folder} && "
              f"exec {sys.executable} -m miniagi --workdir {folder} hello")
    proc = subprocess.run(["unshare", "--mount", "sh", "-c", script], cwd=isolated.work, capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, OPENAI_BASE_URL=llm.url,
                                                          OPENAI_API_KEY="sk-test-key-123456",
                                                          MINIAGI_MEMORY_SCOPE="off"))
    if "mount:" in proc.stderr or "unshare:" in proc.stderr:
        pytest.skip(f"no read-only mount here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    assert "work directory read-only" in proc.stderr and "read-write" not in proc.stderr


def test_runs_and_show_say_the_folder_the_start_and_how_long(cli, llm, isolated):
    import re

    llm.add(act("done", "ok"))
    assert cli("hello").returncode == 0
    header, row = cli("runs").stdout.splitlines()[:2]
    columns = dict(zip(header.split("\t"), row.split("\t")))
    assert columns["folder"] == str(isolated.work) and re.fullmatch(r"\d+ s", columns["took"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d", columns["started"])
    shown = cli("show", "last").stdout
    assert re.search(rf"folder: {re.escape(str(isolated.work))} · started \d{{4}}-\d\d-\d\d \d\d:\d\d · took \d+ s",
                     shown)


def test_a_duration_reads_as_a_person_would_say_it():
    from miniagi.report import took

    def result(seconds: int) -> dict:
        hours, minutes = 10 + seconds // 3600, seconds % 3600 // 60
        return {"started_at": "2026-01-01T10:00:00+00:00",
                "ended_at": f"2026-01-01T{hours:02d}:{minutes:02d}:{seconds % 60:02d}+00:00"}

    assert [took(result(s)) for s in (42, 185, 3720)] == ["42 s", "3 m 05 s", "1 h 02 m"]
    assert took({"started_at": None}) == "?"


# --- every run id a failure prints is one `show` finds, or one the failure says was not kept --------------------
def printed_ids_are_shown_or_said_not_kept(cli, stderr: str) -> list[str]:
    """Each run id on stderr: `miniagi show ID` shows it, or a line naming it says "not kept" (and then `show` says
    why it finds none, without taking the id for an objective's words). Returns the ids."""
    import re

    from miniagi.run_store import WHOLE_RUN_ID

    ids = sorted(set(re.findall(WHOLE_RUN_ID.pattern, stderr)))
    for run_id in ids:
        said = [line for line in stderr.splitlines() if run_id in line]
        shown = cli("show", run_id)
        if any("not kept" in line for line in said):
            assert shown.returncode == 2 and "not kept" in shown.stderr, shown.stderr
            assert "is a miniagi command" not in shown.stderr
        else:
            assert shown.returncode == 0 and run_id in shown.stdout, (said, shown.stderr)
    return ids


@contextlib.contextmanager
def hanging_up_endpoint():
    """An endpoint that takes each connection and closes it at once: up for a connect, down for every request."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def hang_up():
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:  # closed: the test is over
                return
            connection.close()

    threading.Thread(target=hang_up, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    finally:
        listener.close()


RETRY_NOW = {"Retry-After": "0"}  # the retries without their waits


@pytest.mark.parametrize("failure, kept", [
    ("bad key", False), ("request refused", False), ("unknown model", False),
    ("endpoint down at the first request", True), ("endpoint failing", True),
    ("cost limit before the first call", True), ("interrupted at the first request", True),
    ("a chat turn refused", False),
])
def test_a_run_id_a_failure_prints_is_shown_or_said_not_kept(cli, llm, isolated, failure, kept):
    args, env = ["hello"], {}
    if failure == "bad key":
        llm.add(Fail(401, message="invalid api key"))
    elif failure == "request refused":
        llm.add(Fail(400, message="bad request"))
    elif failure == "unknown model":
        llm.add(Fail(404, message="The model `gpt-7` does not exist"))
        args = ["--model", "gpt-7", "hello"]
    elif failure == "endpoint failing":
        llm.add(*[Fail(500, RETRY_NOW)] * 5)
    elif failure == "cost limit before the first call":
        args = ["--model", "gpt-4o", "--max-cost", "0.0000001", "hello"]
    if failure == "endpoint down at the first request":
        with hanging_up_endpoint() as url:
            proc = cli(*args, env={"OPENAI_BASE_URL": url})
    elif failure == "interrupted at the first request":
        llm.add(Hang(60))
        process = _start(llm, isolated, *args)
        assert _wait_for(lambda: llm.requests)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
        proc = subprocess.CompletedProcess(args, process.returncode, out, err)
    elif failure == "a chat turn refused":
        llm.add(Fail(401, message="invalid api key"))
        proc = cli("chat", input="hello\n")
    else:
        proc = cli(*args, env=env)
    assert proc.returncode != 0
    (run_id,) = printed_ids_are_shown_or_said_not_kept(cli, proc.stderr)
    assert [p.name for p in run_dirs(isolated.home)] == ([run_id] if kept else [])


def test_a_refused_dotenv_prints_no_run_id(cli, llm, isolated):
    from .test_live_terminal import Screen

    (isolated.work / ".env").write_text(f"OPENAI_BASE_URL={llm.url}\n")
    llm.add(act("done", "first"))
    assert cli("hello").returncode == 0  # the first sight of this .env: taken, and remembered
    (isolated.work / ".env").write_text(f"OPENAI_BASE_URL={llm.url}/\n")  # changed since: asked
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_BASE_URL"}
    screen = Screen(["hello again"], isolated.work, dict(env, OPENAI_API_KEY="sk-test-key-123456",
                                                         MINIAGI_MEMORY_SCOPE="off"))
    screen.wait_for(r"\[y\]es / \[N\]o: ?$")
    os.write(screen.master, b"n\r")
    assert screen.finish() == 2
    assert "was not used" in screen.text() and printed_ids_are_shown_or_said_not_kept(cli, screen.text()) == []
    assert len(run_dirs(isolated.home)) == 1  # the first run only
