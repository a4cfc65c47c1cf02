"""What a run's code or model can write is not trusted later: ./.env settings, a run's trace (resume, replay), the
terminal (escape sequences), and run ids given as paths. Issue 20's attacks, tried again."""

from __future__ import annotations

import json

import pytest

from miniagi.cli import main

from .conftest import act, one_line, run_dirs
from .test_end_to_end import load_run
from .test_interactive import run_in_terminal

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
    panel = proc.stderr[proc.stderr.index("run this?"):proc.stderr.index("Run it?")]
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


def test_a_replay_is_marked_and_counts_no_model_calls(cli, llm, isolated, capsys):
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
    assert f"(replay of {original.name}) say hi" in out
    code, out, _ = in_process(capsys, "show", replayed.name)
    assert f"a replay of run {original.name}" in out and "0 model calls (2 replayed responses)" in out
