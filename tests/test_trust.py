"""What a run's code or model can write is not trusted later: ./.env settings, a run's trace (resume, replay), the
terminal (escape sequences), and run ids given as paths. Issue 20's attacks, tried again."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from miniagi.cli import main

from . import test_ui
from .conftest import act, one_line, run_dirs
from .test_end_to_end import load_run
from .test_interactive import run_in_terminal

ui = test_ui.ui  # the web UI served over the test's home (a fixture)
ESC = "\x1b"
# erase the line, go up one, erase it, go to column 1: what hid os.system(...) from the person approving it
HIDING = f"{ESC}[2K{ESC}[1A{ESC}[2K{ESC}[1G"
OSC = [f"{ESC}]52;c;ZXZpbCBjbGlwYm9hcmQ={ESC}\\", f"{ESC}]0;owned title\x07",
       f"{ESC}]8;;http://evil.example/{ESC}\\click me{ESC}]8;;{ESC}\\"]
BIDI = "\u202e"  # right-to-left override: shows `txt.exe` as `exe.txt`


def in_process(capsys, *args: str) -> tuple[int, str, str]:
    """`miniagi ARGS` run in this process (no model needed): exit code, stdout, stderr."""
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_inert(text: str) -> None:
    assert ESC not in text and "\x07" not in text and BIDI not in text and "\x9b" not in text, repr(text[:400])


# --- the terminal ----------------------------------------------------------------------------------------------------
def test_the_approval_prompt_shows_the_exact_code_escape_sequences_included(llm, isolated):
    tail = "x" * 150 + " and_this_end_of_a_long_line()"
    code = f"import os\nos.system('touch pwned')  # {HIDING}print('hello, world')\n\tprint('tabs stay')  # {tail}"
    llm.add(act("execute_python", code), act("done", "stopped"))
    proc = run_in_terminal(llm, isolated, "n\n", "tidy up")
    assert proc.returncode == 0, proc.stderr
    assert not (isolated.work / "pwned").exists()
    assert_inert(proc.stderr)
    prompt = proc.stderr.index("Run it?")
    panel = proc.stderr[proc.stderr.rindex("╭", 0, prompt):prompt]
    shown = "".join("".join(line.strip("│") for line in panel.splitlines()[1:-1]).split())
    # every character that will run, in order (wrapped lines joined, spaces aside), the escapes made visible
    assert shown == "".join(code.replace(ESC, "\\x1b").split())
    assert "│     print('tabs stay')" in panel  # a tab stays a tab, a newline a newline


def test_escape_sequences_from_the_model_and_from_code_reach_no_output_raw(cli, llm, isolated, capsys):
    hostile = "".join(OSC) + BIDI + "gnp.exe" + HIDING + "\x9b2J" + "over\rwritten"
    printed = "".join(OSC).replace(ESC, "\\x1b").replace("\x07", "\\x07")  # Python escapes: ESC once executed
    llm.add(act("execute_python", f"print('{printed}')", thought=f"thinking {hostile}"),
            act("done", f"the answer {hostile}"))
    proc = cli("-y", f"objective {BIDI}reversed")
    assert proc.returncode == 0, proc.stderr
    directory, result, trace = load_run(isolated.home)
    assert ESC in json.dumps(trace, ensure_ascii=False) or "\\u001b" in json.dumps(trace)  # recorded as it was
    assert_inert(proc.stderr)
    assert_inert(proc.stdout)
    assert "\\x1b]52;c;ZXZpbCBjbGlwYm9hcmQ=" in proc.stderr  # the observation, shown escaped
    assert proc.stdout.startswith("the answer \\x1b]52;") and "\\u202egnp.exe" in proc.stdout
    assert "over\\rwritten" in proc.stdout  # a carriage return would have written over the line
    for args in (("show", directory.name, "--raw"), ("runs",), ("show", "last", "--json"), ("runs", "--json")):
        code, out, err = in_process(capsys, *args)
        assert code == 0, err
        assert_inert(out)
    code, out, _ = in_process(capsys, "show", directory.name, "--json")
    assert json.loads(out)["result"]["answer"] == result["answer"]  # JSON escapes are read back as they were
    as_json = cli("-y", "--json", "again", env={})
    assert_inert(as_json.stdout)


# --- run ids ---------------------------------------------------------------------------------------------------------
def test_run_ids_are_names_never_paths_and_last_and_prefixes_work(cli, llm, isolated, capsys):
    (isolated.home / "runs").mkdir(parents=True)
    (isolated.home / "secret.txt").write_text("the home's own file")
    for bad in ("..", "../..", "../../etc", "/etc", "a/b", "*", "2025*"):
        code, out, err = in_process(capsys, "show", bad)
        assert code == 2 and one_line(err) and "is not a run id" in err and "home's own" not in out, bad
    code, _, err = in_process(capsys, "show", "last")
    assert code == 2 and "there is no run" in err
    llm.add(act("done", "first"))
    assert cli("first objective").returncode == 0
    llm.add(act("done", "second"))
    assert cli("second objective").returncode == 0
    first, second = run_dirs(isolated.home)
    code, out, _ = in_process(capsys, "show", "last")
    assert code == 0 and "second objective" in out
    code, out, _ = in_process(capsys, "show", second.name[:-2])
    assert code == 0 and "second objective" in out
    code, _, err = in_process(capsys, "show", second.name[:8])  # the day: both runs
    assert code == 2 and "matches 2 runs" in err and first.name in err
    # not an id: the closest ids, and the hint for an objective that starts with a command's name
    code, _, err = in_process(capsys, "show", "2099")
    assert code == 2 and "no run '2099'" in err and second.name in err and 'miniagi run "show 2099"' in err


def test_continue_and_last_follow_the_newest_run_of_this_work_directory(cli, llm, isolated, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    llm.add(act("done", "here"))
    assert cli("the objective here").returncode == 0
    llm.add(act("done", "there"))
    assert cli("the objective elsewhere", cwd=elsewhere).returncode == 0
    here = run_dirs(isolated.home)
    for follow in (("-c",), ("--cid", "last")):
        llm.add(act("done", "followed"))
        proc = cli(*follow, "and then?")
        assert proc.returncode == 0, proc.stderr
        prompt = json.dumps(llm.agent_requests()[-1]["messages"])
        assert "the objective here" in prompt and "the objective elsewhere" not in prompt, (follow, prompt)
    assert len(run_dirs(isolated.home)) == len(here) + 2


def test_a_replay_is_marked_and_counts_no_model_calls(cli, llm, isolated, capsys, ui):

    llm.add(act("execute_shell", "echo hi"), act("done", "said hi"))
    assert cli("-y", "say hi").returncode == 0
    (original,) = run_dirs(isolated.home)
    proc = cli("replay", "last", "-y", env={"OPENAI_BASE_URL": None, "OPENAI_API_KEY": None})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 model calls (2 replayed responses)" in proc.stderr
    replayed = next(d for d in run_dirs(isolated.home) if d != original)
    result = json.loads((replayed / "result.json").read_text())
    assert (result["replay_of"], result["llm_calls"], result["replayed_responses"]) == (original.name, 0, 2)
    code, out, _ = in_process(capsys, "runs")
    assert code == 0 and f"(replay of {original.name}) say hi" in out
    code, out, _ = in_process(capsys, "show", replayed.name)
    assert code == 0 and f"a replay of run {original.name}" in out and "0 model calls (2 replayed responses)" in out
    assert f"replay of {original.name}</span> say hi" in ui.client.get(ui + "/").text
    page = ui.client.get(f"{ui}/runs/{replayed.name}").text
    assert f'0 model calls (a replay of <a href="/runs/{original.name}">' in page


def in_terminal(isolated, typed: str, *args: str) -> subprocess.CompletedProcess:
    """miniagi with a pseudo-terminal as stdin (what the person types queued up front), the endpoint from ./.env."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_BASE_URL", "OPENAI_API_KEY")}
    return run_in_terminal(None, isolated, typed, *args, env=dict(env, MINIAGI_MEMORY_SCOPE="off"))


# --- .env: read once, and not obeyed after a run could have written it ------------------------------------------------
def test_a_dotenv_that_a_run_rewrote_is_not_obeyed_without_the_user(cli, llm, isolated):
    from .fake_llm import FakeLLM

    no_endpoint = {"OPENAI_BASE_URL": None, "OPENAI_API_KEY": None}
    dotenv = isolated.work / ".env"
    dotenv.write_text(f"OPENAI_BASE_URL={llm.url}\nOPENAI_API_KEY=sk-dotenv-key-123456\nMINIAGI_MAX_STEPS=9\n")
    with FakeLLM() as thief:
        planted = f"OPENAI_BASE_URL={thief.url}\nMINIAGI_PASS_ENV=AWS_SECRET_ACCESS_KEY\n"
        llm.add(act("execute_python", f"open('.env', 'a').write({planted!r})"), act("done", "planted"))
        # (no sandbox: under bwrap code cannot see .env at all; this guard holds without one)
        first = cli("-y", "--sandbox", "none", "tidy up", env=no_endpoint)  # a .env never used: taken as it is
        assert first.returncode == 0, first.stderr
        assert f"{dotenv} changed during this run" in first.stderr
        # the next ordinary run: the key is not sent to the planted endpoint, no secret is passed
        second = cli("-y", "next", env={**no_endpoint, "AWS_SECRET_ACCESS_KEY": "aws-secret-value-777"})
        assert second.returncode == 2 and one_line(second.stderr), second.stderr
        assert "OPENAI_BASE_URL=" + thief.url in second.stderr and "MINIAGI_PASS_ENV" in second.stderr
        assert "sk-dotenv" not in second.stderr and "MINIAGI_MAX_STEPS" not in second.stderr
        assert thief.requests == [] and len(llm.requests) == 2
        # the user's say, at a terminal: no refuses, yes uses it, and from then on it is trusted
        refused = in_terminal(isolated, "n\n", "next")
        assert refused.returncode == 2 and "Use it?" in refused.stderr and thief.requests == []
        thief.add(act("done", "via the new endpoint"))
        confirmed = in_terminal(isolated, "y\n", "next")
        assert confirmed.returncode == 0, confirmed.stderr
        thief.add(act("done", "again"))
        assert cli("-y", "again", env=no_endpoint).returncode == 0 and len(thief.requests) == 2
        # a setting given in the environment wins over the .env, so its changed value is not asked about
        # (the key's line goes too, the environment gives it; the step limit's stays: a line removed is a change)
        dotenv.write_text("OPENAI_BASE_URL=http://127.0.0.1:9/v1\nMINIAGI_PASS_ENV=AWS_SECRET_ACCESS_KEY\n"
                          "MINIAGI_MAX_STEPS=9\n")
        llm.add(act("done", "env wins"))
        assert cli("env wins").returncode == 0


def test_a_dotenv_is_read_once_per_start(isolated):
    from miniagi.config import forget_dotenv, read_dotenv

    dotenv = isolated.work / ".env"
    dotenv.write_text("MINIAGI_MODEL=first\n")
    forget_dotenv()
    assert read_dotenv()["MINIAGI_MODEL"] == "first"
    dotenv.write_text("MINIAGI_MODEL=second\nOPENAI_BASE_URL=http://127.0.0.1:9/v1\n")  # code of a run, say
    assert read_dotenv() == {"MINIAGI_MODEL": "first"}  # the rest of this process goes on with what it read
    forget_dotenv()  # the next start (main() does this)
    assert read_dotenv()["MINIAGI_MODEL"] == "second"


def test_a_dotenv_beside_the_code_is_remembered_and_its_home_cannot_move_its_trust(cli, llm, isolated, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    llm.add(act("execute_shell", "printf 'MINIAGI_HOME=/tmp/elsewhere\\nMINIAGI_MAX_COST=0\\n' > .env"),
            act("done", "ok"))
    default_home = {"MINIAGI_HOME": None}  # ~/.miniagi
    # the run works in project/ from elsewhere: the .env beside its code is remembered as it was (absent)
    assert cli("-y", "--sandbox", "none", "--workdir", str(project), "work there", env=default_home).returncode == 0
    trusted = json.loads((Path.home() / ".miniagi" / "trusted-env.json").read_text())
    assert trusted[str(project / ".env")] == {}
    llm.add(act("done", "never"))
    # MINIAGI_HOME from that .env would move the record it is checked against: the default home's is used
    proc = cli("-y", "run there", cwd=project, env=default_home)
    assert proc.returncode == 2 and "MINIAGI_MAX_COST=0" in proc.stderr and "MINIAGI_HOME=" in proc.stderr, \
        proc.stderr
    assert len(llm.requests) == 2


# --- resume and replay: a trace grants nothing ------------------------------------------------------------------------
def tamper(directory, **settings) -> None:
    """What code that found the home did: rewrite the run's recorded settings."""
    trace = directory / "trace.jsonl"
    lines = trace.read_text().splitlines()
    start = json.loads(lines[0])
    start["settings"].update(settings)
    trace.write_text("\n".join([json.dumps(start), *lines[1:]]) + "\n")


WIDER = {"pass_env": ["AWS_SECRET_ACCESS_KEY"], "max_cost": 0, "max_calls": 10**6, "exec_timeout": 99999, "yes": True,
         "memory_url": "http://127.0.0.1:9/", "embedding_model": "text-embedding-3-small"}


def test_resume_takes_no_widening_setting_from_the_trace(cli, llm, isolated):
    llm.add(act("memorize_thoughts", "step one"))
    assert cli("--max-steps", "1", "two steps").returncode == 3
    (directory,) = run_dirs(isolated.home)
    tamper(directory, **WIDER)
    llm.add(act("execute_python", "import os; print('passed:', 'AWS_SECRET_ACCESS_KEY' in os.environ)"),
            act("done", "resumed"))
    proc = cli("resume", "last", "--max-steps", "5", env={"AWS_SECRET_ACCESS_KEY": "aws-secret-value-777"})
    assert proc.returncode == 0, proc.stderr
    said = proc.stderr[proc.stderr.index("not taken from the run's trace"):]
    for shown in ("--pass-env AWS_SECRET_ACCESS_KEY (now none)", "--max-cost 0: no limit (now 2.0)",
                  "--exec-timeout 99999", "--yes on (now off)", "--memory-url http://127.0.0.1:9/ (now none)",
                  "--max-calls 1000000 (now 500)"):
        assert shown in said, shown
    _, _, trace = load_run(isolated.home)
    resumed = next(e for e in trace if e["type"] == "resume")["settings"]
    assert (resumed["pass_env"], resumed["max_cost"], resumed["exec_timeout"], resumed["yes"],
            resumed["memory_url"]) == ([], 2.0, 120.0, False, None)
    observation = next(e["text"] for e in trace if e["type"] == "observation" and e["step"] == 2)
    assert observation.startswith("Not run: execute_python needs the user's approval"), observation  # no -y granted
    # a limit the user raised at the start is not taken either: they raise it again
    llm.add(act("memorize_thoughts", "one"))
    assert cli("--max-steps", "1", "--max-cost", "7", "again").returncode == 3
    llm.add(act("done", "fine"))
    proc = cli("resume", "last", "--max-steps", "3")
    assert proc.returncode == 0 and "--max-cost 7.0 (now 2.0)" in proc.stderr, proc.stderr
    llm.add(act("memorize_thoughts", "one"), act("done", "fine"))
    assert cli("--max-steps", "1", "--max-cost", "7", "and again").returncode == 3
    proc = cli("resume", "last", "--max-steps", "3", "--max-cost", "7")
    assert proc.returncode == 0 and "not taken" not in proc.stderr, proc.stderr


def test_replay_contacts_nothing_and_takes_nothing_wider_from_the_trace(cli, llm, isolated):
    from .pages import Site

    site = Site()
    try:
        llm.add(act("process_data", f"What is it about?|{site.url('/plain.txt')}"), "gardening",
                act("done", "gardening"))
        assert cli("-y", "what is the page about").returncode == 0
        (directory,) = run_dirs(isolated.home)
        tamper(directory, **WIDER, memory_scope="global")
        calls, hits = len(llm.requests) + len(llm.embedding_requests), len(site.hits)
        proc = cli("replay", directory.name, "-y", env={"AWS_SECRET_ACCESS_KEY": "aws-secret-value-777"})
        assert "a replay contacts nothing" in proc.stderr, proc.stderr
        assert "not taken from the recording" in proc.stderr and "--pass-env AWS_SECRET_ACCESS_KEY" in proc.stderr
        assert proc.returncode == 1  # the page was not read again: the observation differs, and says why
        assert "a replay contacts nothing" in proc.stdout
        assert (len(llm.requests) + len(llm.embedding_requests), len(site.hits)) == (calls, hits)
    finally:
        site.close()


# --- the web UI -------------------------------------------------------------------------------------------------------
def test_the_ui_answers_only_to_its_own_names_and_takes_run_ids_as_names(cli, llm, isolated, ui):
    test_ui.make_run(cli, llm)
    (run,) = run_dirs(isolated.home)
    port = ui.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "LOCALHOST"):
        response = ui.client.get(ui + "/api/runs", headers={"Host": host})
        assert response.status_code == 200 and run.name in response.text, host
    # a page of evil.example whose name now points at 127.0.0.1 (DNS rebinding) reads nothing
    for path in ("/", "/api/runs", f"/runs/{run.name}", "/memory?q=x"):
        response = ui.client.get(ui + path, headers={"Host": f"evil.example:{port}"})
        assert response.status_code == 421 and run.name not in response.text, path
    (isolated.home / "not-a-run.txt").write_text("the home's own file")
    for bad in ("%2e%2e", "..%2f..%2fetc", "%2fetc", "2025%2a", "%2e%2e%5cx"):
        response = ui.client.get(f"{ui}/runs/{bad}")
        assert "is not a run id" in response.text or response.status_code == 404, bad  # (a / ends the route)
        assert "home's own" not in response.text and run.name not in response.text
        assert ui.client.get(f"{ui}/runs/{bad}/events").status_code == 404
    assert ui.client.get(f"{ui}/runs/{run.name}/events?after=x").status_code == 400


def tree(path) -> dict:
    """Every file under path, with its bytes; the vector store's files only by name (chromadb brings its own index
    up to date when a store is read)."""
    return {str(p.relative_to(path)): b"" if "memory" in p.relative_to(path).parts[:1] else p.read_bytes()
            for p in sorted(path.rglob("*")) if p.is_file()}


def test_the_ui_writes_nothing_and_shows_a_runs_recall_as_text_under_its_step(cli, llm, isolated, ui, capsys):
    from .conftest import MEMORY_ON

    before = tree(isolated.home)
    page = ui.client.get(ui + "/memory", params={"q": "anything"}, timeout=60).text
    assert "no memory under" in page and tree(isolated.home) == before  # no empty store made
    llm.add(act("memorize_thoughts", "The launch code of the rocket is PURPLE-SEVEN."), act("done", "noted"))
    assert cli("-y", "remember the rocket's launch code", env=MEMORY_ON).returncode == 0
    llm.add(act("done", "PURPLE-SEVEN"))
    assert cli("-y", "what is the launch code of the rocket?", env=MEMORY_ON).returncode == 0
    cli("memory", "stats", env=MEMORY_ON)  # runs that recall by words journal their items; a memory command stores them
    second = run_dirs(isolated.home)[-1]
    before = tree(isolated.home)
    assert "PURPLE-SEVEN" in ui.client.get(ui + "/memory", params={"q": "launch code"}, timeout=60).text
    page = ui.client.get(f"{ui}/runs/{second.name}", timeout=60).text
    assert tree(isolated.home) == before  # searching and showing wrote nothing
    recall = page[page.index("recalled for step 1"):]
    assert "The launch code of the rocket is PURPLE-SEVEN." in recall[:recall.index("</details>")]
    # the step comes first, then its reply and what was recalled for it
    assert page.index("step 1 ·") < page.index("raw agent reply · step 1") and \
        page.index("step 1 ·") < page.index("recalled for step 1")
    # memory's --run takes a run id as every command does: last, or a unique prefix
    first = run_dirs(isolated.home)[0]
    for run, other in ((first.name[:-1], second), ("last", first)):
        code, out, err = in_process(capsys, "memory", "search", "rocket launch code", "--run", run, "--all")
        assert code == 0 and out.strip() and other.name not in out, (run, out, err)


def test_the_ui_on_a_port_in_use_says_so_in_one_line_and_exits_2(cli):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        proc = cli("ui", "--port", port, timeout=60)
    assert proc.returncode == 2 and one_line(proc.stderr), proc.stderr
    assert f"port {port}" in proc.stderr and "--port" in proc.stderr and "http://" not in proc.stderr


def test_a_password_in_the_base_url_is_never_shown(cli, llm, isolated):
    port = llm.url.split(":")[2].split("/")[0]
    with_password = f"http://bob:pw-hunter2-xyz@127.0.0.1:{port}/v1"
    llm.add(act("execute_shell", "echo $OPENAI_BASE_URL; env | grep -i proxy"), act("done", "seen"))
    proc = cli("-y", "what is configured", env={"OPENAI_BASE_URL": with_password,
                                                "HTTPS_PROXY": "http://carol:pw-proxy-777@127.0.0.1:9"})
    assert proc.returncode == 0, proc.stderr
    down = cli("anything", env={"OPENAI_BASE_URL": "http://bob:pw-hunter2-xyz@127.0.0.1:9/v1"})
    assert down.returncode == 2 and "127.0.0.1:9" in down.stderr
    (directory, *_) = run_dirs(isolated.home)
    shown = proc.stdout + proc.stderr + down.stdout + down.stderr + json.dumps(llm.requests) + \
        "".join(p.read_bytes().decode("latin-1") for p in directory.rglob("*") if p.is_file())  # checkpoints too
    assert "pw-hunter2" not in shown and "pw-proxy" not in shown


def test_a_trace_may_keep_a_run_stricter_never_looser():
    from miniagi.config import Settings
    from miniagi.trust import narrowed

    mine = Settings(sandbox="auto", no_network=False, pass_env=("PATH_EXTRA",), max_cost=2.0, exec_disk=100)
    strict = Settings(sandbox="bwrap", no_network=True, pass_env=(), max_cost=1.0, exec_disk=50)
    kept, differences = narrowed(strict, mine)
    assert (kept.sandbox, kept.no_network, kept.max_cost, kept.exec_disk) == ("bwrap", True, 1.0, 50)
    assert kept.pass_env == ("PATH_EXTRA",) and set(differences) == {"pass_env"}  # yours, and said
    loose = Settings(sandbox="none", no_network=False, pass_env=("AWS_SECRET_ACCESS_KEY",), max_cost=0, exec_disk=10**6)
    kept, differences = narrowed(loose, Settings(no_network=True))
    assert (kept.sandbox, kept.no_network, kept.pass_env, kept.max_cost, kept.exec_disk) == \
        ("auto", True, (), 2.0, Settings().exec_disk)
    assert set(differences) == {"sandbox", "no_network", "pass_env", "max_cost", "exec_disk"}
