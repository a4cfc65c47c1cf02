"""A person at a terminal: approval of code, feedback, talk_to_user; and headless use from Python."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys

from miniagi import Agent, ScriptedModel, Settings

from .conftest import act, run_dirs


def run_in_terminal(llm, isolated, typed: str, *args, env: dict | None = None) -> subprocess.CompletedProcess:
    """miniagi with a real pseudo-terminal as stdin; what the person types is queued up front. The endpoint is
    `llm`, unless `env` is given whole."""
    master, slave = pty.openpty()
    env = dict(os.environ, OPENAI_BASE_URL=llm.url, OPENAI_API_KEY="sk-test-key-123456") if env is None else env
    try:
        os.write(master, typed.encode())
        return subprocess.run([sys.executable, "-m", "miniagi", *args], cwd=isolated.work, env=env, stdin=slave,
                              capture_output=True, text=True, timeout=120)
    finally:
        os.close(master)
        os.close(slave)


def test_approval_refuse_feedback_then_approve(llm, isolated):
    llm.add(act("execute_shell", "touch refused.txt"),
            act("execute_shell", "touch with-feedback.txt"),
            act("execute_python", "open('approved.txt', 'w').write('yes')"),
            act("talk_to_user", "What colour?"),
            act("done", "finished"))
    proc = run_in_terminal(llm, isolated, "n\nplease do not create files named like that\ny\nblue\n", "go")
    assert proc.returncode == 0, proc.stderr
    assert not (isolated.work / "refused.txt").exists()
    assert not (isolated.work / "with-feedback.txt").exists()
    assert (isolated.work / "approved.txt").read_text() == "yes"
    assert "Run it?" in proc.stderr and "touch refused.txt" in proc.stderr
    assert proc.stderr.count("touch refused.txt") == 1  # shown once, in the approval panel, not also above it
    (directory,) = run_dirs(isolated.home)
    seen = {e["step"]: e["text"] for e in map(json.loads, (directory / "trace.jsonl").read_text().splitlines())
            if e["type"] == "observation"}
    assert "refused" in seen[1]
    assert "please do not create files named like that" in seen[2]
    assert seen[4] == "The user replied: blue"


def test_headless_python_api_with_a_scripted_model(isolated):
    model = ScriptedModel([act("execute_python", "x = 20"), act("execute_python", "print(x + 1)"),
                           act("done", "21")])
    result = Agent(Settings(yes=True, unattended=True, workdir=str(isolated.work)), model=model).run("add one")
    assert (result.status, result.answer, result.exit_code, result.steps) == ("done", "21", 0, 3)
    assert "Observation (step 2):\n21" in model.calls[2][-1]["content"]
    assert result.summary["llm_calls"] == 3


def test_headless_api_against_an_endpoint(llm, isolated):
    from miniagi import OpenAIModel
    from miniagi.config import Endpoint

    llm.add(act("done", "hello"))
    model = OpenAIModel(Endpoint(api_key="k", base_url=llm.url))
    result = Agent(Settings.from_environment(model="gpt-4o-mini", unattended=True), model=model).run("say hello")
    assert result.answer == "hello" and result.cost_usd > 0
    assert [p.name for p in (isolated.home / "runs").iterdir()] == [result.run_id]  # MINIAGI_HOME was followed


def test_debug_prints_context_and_raw_response_and_keeps_prompts(cli, llm, isolated):
    llm.add(act("done", "RAW-ANSWER-TEXT", thought="debug thought"))
    proc = cli("--debug", "debug me")
    assert proc.returncode == 0
    assert "OBJECTIVE:" in proc.stderr and "<c>done</c>" in proc.stderr
    (directory,) = run_dirs(isolated.home)
    calls = [e for e in map(json.loads, (directory / "trace.jsonl").read_text().splitlines())
             if e["type"] == "llm_call"]
    assert calls[0]["messages"][0]["role"] == "system"


def test_replay_asks_before_running_recorded_code_and_never_takes_approval_from_the_trace(cli, llm, isolated):
    llm.add(act("execute_shell", "echo replayed >> marker.txt"), act("done", "ok"))
    assert cli("-y", "mark").returncode == 0  # recorded with -y
    (recorded,) = run_dirs(isolated.home)
    (isolated.work / "marker.txt").unlink()
    headless = cli("replay", recorded.name)
    assert headless.returncode == 2 and "give -y" in headless.stderr and not (isolated.work / "marker.txt").exists()
    asked = run_in_terminal(llm, isolated, "n\n", "replay", recorded.name)
    assert "Run it?" in asked.stderr and not (isolated.work / "marker.txt").exists()
    assert asked.returncode == 1  # refused, so the replay differs from the recording
    approved = run_in_terminal(llm, isolated, "y\n", "replay", recorded.name)
    assert approved.returncode == 0, approved.stderr
    assert (isolated.work / "marker.txt").read_text() == "replayed\n"
    assert f"commands run in {isolated.work}" in approved.stderr and "replayed response" in approved.stderr


def test_the_approval_prompt_shows_its_choices_and_ctrl_d_stops_the_run(llm, isolated):
    llm.add(act("execute_shell", "touch never.txt"))
    proc = run_in_terminal(llm, isolated, "\x04", "go")  # Ctrl-D at the prompt
    assert "[Y]es / [n]o" in proc.stderr
    assert proc.returncode == 130 and "Traceback" not in proc.stderr and "EOFError" not in proc.stderr
    assert not (isolated.work / "never.txt").exists()


def test_ctrl_c_at_a_prompt_leaves_the_next_message_on_a_line_of_its_own(capsys):
    import pytest

    from miniagi.terminal import Terminal

    terminal = Terminal(interactive=True)

    def interrupted(prompt):  # the person presses Ctrl-C: the terminal echoes ^C after the prompt, no newline
        terminal.console.file.write(prompt + "^C")
        raise KeyboardInterrupt

    terminal.console.input = interrupted
    with pytest.raises(KeyboardInterrupt):
        terminal.ask_user("Which colour?")
    assert capsys.readouterr().err.endswith("^C\n")


def test_the_models_own_read_of_a_file_the_sandbox_hides_needs_a_yes_even_with_y(llm, isolated):
    """The model (steered by a page) read ~/.netrc with ingest_data, asked nothing, and sent it out in a URL at the
    next step. Reading a hidden file for the model now takes the person's yes, -y or not; one yes per file."""
    home = isolated.work.parent / "user-home"
    home.mkdir(exist_ok=True)
    (home / ".netrc").write_text("# NETRC-BODY-1\nmachine api.example.com login alice password Pw-4471x\n")
    (home / ".pgpass").write_text("PGPASS-BODY-2 is in here\n")
    llm.responder = lambda request: "It is a note." if request["messages"][0]["role"] != "system" else None
    llm.add(act("process_data", "What is it?|~/.netrc"), act("process_data", "What is it?|~/.pgpass"),
            act("process_data", "What is it?|~/.pgpass"), act("done", "ok"))
    proc = run_in_terminal(llm, isolated, "n\ny\n", "-y", "--sandbox", "bwrap", "read the dotfiles")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("The model asks to read") == 2, proc.stderr
    seen = json.dumps(llm.requests)
    assert "NETRC-BODY-1" not in seen and f"did not let the agent read {home / '.netrc'}" in seen
    assert seen.count("PGPASS-BODY-2") >= 2  # read after the yes, and again without asking


def test_unattended_the_models_read_of_a_hidden_file_is_refused_unless_sandbox_allow_names_it(cli, llm, isolated):
    home = isolated.work.parent / "user-home"
    home.mkdir(exist_ok=True)
    (home / ".netrc").write_text("# NETRC-BODY-1\nmachine api.example.com login alice password Pw-4471x\n")
    llm.responder = lambda request: "It is a note." if request["messages"][0]["role"] != "system" else None
    llm.add(act("process_data", "What is it?|~/.netrc"), act("done", "ok"))
    proc = cli("-y", "--sandbox", "bwrap", "read the dotfile")
    assert proc.returncode == 0, proc.stderr
    seen = json.dumps(llm.requests)
    assert "NETRC-BODY-1" not in seen and "needs the user's yes; no user is present" in seen
    llm.add(act("process_data", "What is it?|~/.netrc"), act("done", "ok"))
    proc = cli("-y", "--sandbox", "bwrap", "--sandbox-allow", str(home / ".netrc"), "read the dotfile")
    assert proc.returncode == 0, proc.stderr
    # read for the summarizer, the password redacted on the way (netrc's form)
    seen = json.dumps(llm.requests)
    assert "NETRC-BODY-1" in seen and "login alice password [REDACTED]" in seen and "Pw-4471x" not in seen
