"""The three reply protocols (tags, tools, json) over one loop, against the scripted OpenAI-compatible server and the
real model client; and what a real small model taught the tag format."""

from __future__ import annotations

import json

import pytest

from miniagi.commands import COMMANDS
from miniagi.model import Completion, ToolCall
from miniagi.protocols import Decision, MalformedReply, formats, lenient_json, one_command_line
from miniagi.protocols.tags import parse_reply

from .conftest import act, one_line, run_dirs
from .fake_llm import Calls, Fail


def load(home):
    (directory,) = run_dirs(home)
    result = json.loads((directory / "result.json").read_text())
    trace = [json.loads(line) for line in (directory / "trace.jsonl").read_text().split("\n") if line]
    return result, trace


def observations(trace):
    return {e["step"]: e["text"] for e in trace if e["type"] == "observation"}


# --- tools ----------------------------------------------------------------------------------------------------
def test_a_tools_run_uses_native_calls_and_sends_observations_as_tool_messages(cli, llm, isolated):
    llm.add(Calls([("execute_python", json.dumps({"code": "total = 6 * 7\nprint(total)"}))], "compute it"),
            Calls([("execute_shell", '{"command_line": "echo shell-ran"}'),
                   ("execute_python", '{"code": "print(1)"}')]),  # two calls: the first runs, the model is told
            Calls([("execute_python", "{'code': 'print(total + 1)'}")]),  # single quotes: read leniently
            Calls([("execute_python", '{"code": "print(2"')]),  # malformed JSON: a format error, the usual feedback
            Calls([("done", json.dumps({"answer": "The total is 42."}))]))
    proc = cli("-y", "--unattended", "--protocol", "tools", "Compute 6*7")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("The total is 42.")
    result, trace = load(isolated.home)
    seen = observations(trace)
    assert "42" in seen[1] and "shell-ran" in seen[2] and "only the first (execute_shell) was run" in seen[2]
    assert "43" in seen[3]
    errors = [e for e in trace if e["type"] == "format_error"]
    assert len(errors) == 1 and errors[0]["step"] == 4 and "not valid JSON" in errors[0]["error"]
    assert next(e for e in trace if e["type"] == "run_start")["settings"]["protocol"] == "tools"

    requests = llm.agent_requests()
    names = [tool["function"]["name"] for tool in requests[0]["tools"]]
    assert names[-1] == "done" and "execute_python" in names and "ingest_data" in names
    python_tool = next(t["function"] for t in requests[0]["tools"] if t["function"]["name"] == "execute_python")
    assert python_tool["parameters"]["required"] == ["code"]
    # the history: each step as an assistant tool call and a tool message with the same id, in order
    later = requests[2]["messages"]
    calls = [m for m in later if m["role"] == "assistant" and m.get("tool_calls")]
    results = [m for m in later if m["role"] == "tool"]
    assert [c["tool_calls"][0]["id"] for c in calls] == [r["tool_call_id"] for r in results] == ["call_1", "call_2"]
    assert json.loads(calls[0]["tool_calls"][0]["function"]["arguments"]) == {"code": "total = 6 * 7\nprint(total)"}
    assert "42" in results[0]["content"]
    # each prompt extends the one before (the prompt cache serves it)
    first, second = requests[1]["messages"], requests[2]["messages"]
    assert second[:len(first) - 1] == first[:-1]


def test_a_tools_prompt_and_its_tool_schemas_together_fit_the_budget(cli, llm, isolated):
    """The schemas go with every request and the endpoint counts them as prompt: the messages get the rest."""
    from memory.context import MESSAGE_OVERHEAD, REPLY_PRIMING, message_text
    from memory.tokens import counter_for

    def respond(request):
        if request["model"] == "reader":
            return "Summary: the agent printed reports on numbered topics; nothing else happened."
        step = len([r for r in llm.agent_requests() if r["model"] != "reader"])
        if step >= 12:
            return Calls([("done", json.dumps({"answer": "reported"}))])
        code = f"print('report {step}: ' + ' '.join(str(i * {step}) for i in range(200)))"
        return Calls([("execute_python", json.dumps({"code": code}))], f"report {step}")

    llm.responder = respond
    proc = cli("-y", "--unattended", "--protocol", "tools", "--max-context-tokens", "2500", "--summarizer-model",
               "reader", "--model", "gpt-4o", "Print twelve reports")
    assert proc.returncode == 0, proc.stderr
    counter = counter_for("gpt-4o")
    agent = [r for r in llm.agent_requests() if r["model"] == "gpt-4o"]
    assert len(agent) == 12
    schemas = counter.count(json.dumps(agent[0]["tools"]))
    assert schemas > 500
    for request in agent:
        messages = sum(counter.count(message_text(m)) + MESSAGE_OVERHEAD for m in request["messages"])
        assert messages + REPLY_PRIMING + schemas <= 2500


def test_a_reply_without_a_tool_call_is_a_format_error_with_the_usual_cap(cli, llm, isolated):
    llm.add("I will think about it.", Calls([], "still no call"), "nothing")
    proc = cli("-y", "--unattended", "--protocol", "tools", "Do something")
    assert proc.returncode == 4, proc.stderr
    _, trace = load(isolated.home)
    assert [e["type"] for e in trace].count("format_error") == 3
    assert "called no tool" in llm.agent_requests()[1]["messages"][-1]["content"]


def test_an_endpoint_that_refuses_tools_gives_one_line_suggesting_another_protocol(cli, llm, isolated):
    llm.add(Fail(400, message="tools is not supported for this model"))
    proc = cli("-y", "--unattended", "--protocol", "tools", "Do something")
    assert proc.returncode == 2
    assert one_line(proc.stderr.splitlines()[-1]) and "--protocol" in proc.stderr and "tags" in proc.stderr
    assert run_dirs(isolated.home) == []  # refused before any answer: no junk run left behind


def test_a_tools_run_replays_with_no_model(cli, llm, isolated, tmp_path):
    llm.add(Calls([("execute_shell", '{"command_line": "echo replayed > out.txt && cat out.txt"}')], "write it"),
            Calls([("done", '{"answer": "written"}')]))
    assert cli("-y", "--unattended", "--protocol", "tools", "Write a file").returncode == 0
    (original,) = run_dirs(isolated.home)
    served = len(llm.requests)
    proc = cli("replay", original.name, "-y", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["reproduced"] and report["model_calls"] == 0 and report["steps"] == 2
    assert len(llm.requests) == served  # nothing reached the endpoint


# --- json -----------------------------------------------------------------------------------------------------
def test_a_json_run_reads_lenient_objects_and_asks_for_the_schema(cli, llm, isolated):
    llm.add(json.dumps({"thought": "compute", "command": "execute_python", "arg": "x = 20\nprint(x)"}),
            "Sure! Here is my action:\n```json\n{\"thought\": \"add\", \"command\": \"execute_python\", "
            "\"arg\": \"print(x + 1)\"}\n```",
            "{'thought': 'finish', 'command': 'done', 'arg': 'x + 1 is 21'}")
    proc = cli("-y", "--unattended", "--protocol", "json", "Add one to twenty")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("x + 1 is 21")
    _, trace = load(isolated.home)
    assert observations(trace)[2].strip().endswith("21")
    first = llm.agent_requests()[0]
    schema = first["response_format"]["json_schema"]["schema"]
    assert first["response_format"]["type"] == "json_schema" and "done" in schema["properties"]["command"]["enum"]
    # the history shows each action back in the standard form
    shown = llm.agent_requests()[2]["messages"]
    replies = [json.loads(m["content"]) for m in shown if m["role"] == "assistant"]
    # (the older {"arg": text} form is read too, so recorded runs replay)
    assert replies[1] == {"thought": "add", "command": "execute_python", "args": {"code": "print(x + 1)"}}


def test_json_falls_back_when_the_endpoint_refuses_schemas_and_remembers_it(cli, llm, isolated):
    def refuse_schemas(request):
        kind = (request.get("response_format") or {}).get("type")
        if kind == "json_schema":
            return Fail(400, message="response_format json_schema is not supported")
        if kind == "json_object" and "schema" in request["response_format"]:
            return Fail(500, message="unknown field schema")  # llama.cpp-like: the same 500 again is not retried
        return None

    llm.responder = refuse_schemas
    llm.add('{"thought": "t", "command": "execute_python", "arg": "print(5)"}',
            '{"thought": "t", "command": "done", "arg": "five"}')
    proc = cli("-y", "--unattended", "--protocol", "json", "Print five")
    assert proc.returncode == 0, proc.stderr
    formats = [(r.get("response_format") or {}) for r in llm.agent_requests()]
    kinds = [f.get("type", "") + ("+schema" if "schema" in f else "") for f in formats]
    # json_schema refused once, json_object+schema refused (two identical 500s), then plain json_object for good
    assert kinds == ["json_schema", "json_object+schema", "json_object+schema", "json_object", "json_object"]
    assert "asking with json_object" in proc.stderr


# --- the tag format, as a real small model wrote it -----------------------------------------------------------
def test_an_unknown_command_names_the_closest_one():
    with pytest.raises(MalformedReply) as caught:
        formats()["tags"].read(Completion("<r>x</r><c>execute_shel</c>\nls", "m", 0, 0, 0.0, 0.0))
    assert "Did you mean execute_shell?" in str(caught.value)


def test_reversed_tags_and_a_tag_inside_prose():
    action = parse_reply("<c>execute_shell</c><r>list the files</r>\nls -la")
    assert (action.command, action.thought, action.arg) == ("execute_shell", "list the files", "ls -la")
    with pytest.raises(MalformedReply, match="inside a sentence"):
        parse_reply("I will list the files using the command <c>execute_shell</c> to see them.")
    assert parse_reply("<r>t</r><c>execute_shell</c> ls -la").arg == "ls -la"  # an argument on the tag's line


def test_a_multi_line_shell_argument_runs_its_first_line_and_says_what_was_dropped():
    def shell(line, command="execute_shell"):
        parameter = "command_line" if command == "execute_shell" else "code"
        return one_command_line(Decision("t", COMMANDS[command], {parameter: line}))

    cut = shell("ls -la\nObservation (step 1):\nfile.txt")
    assert cut.arg == "ls -la" and "Dropped: 2 more line(s)" in cut.note
    for whole in ("for f in a b; do\n  echo $f\ndone", "cat <<EOF > x.txt\nhello\nEOF", "echo a \\\n  b"):
        assert (shell(whole).arg, shell(whole).note) == (whole, "")
    assert shell("a = 1\nprint(a)", "execute_python").arg == "a = 1\nprint(a)"


def test_a_multi_line_shell_argument_in_a_run(cli, llm, isolated):
    llm.add(act("execute_shell", "echo first-line\necho SECOND-LINE-RAN"), act("done", "ok"))
    assert cli("-y", "--unattended", "Echo").returncode == 0
    _, trace = load(isolated.home)
    seen = observations(trace)[1]
    assert "first-line" in seen and "SECOND-LINE-RAN" not in seen.split("Note:")[0] and "Dropped" in seen


def test_lenient_json_and_tool_arguments():
    assert lenient_json("{'a': 'b'}") == {"a": "b"}
    with pytest.raises(ValueError):
        lenient_json('{"a": ')
    completion = Completion("", "m", 0, 0, 0.0, 0.0, tool_calls=(ToolCall("c1", "web_search", '{"q": "tides"}'),))
    assert formats()["tools"].read(completion).arg == "tides"  # the only value, whatever its name


def test_temperature_is_sent_and_configurable(cli, llm, isolated):
    llm.add(act("done", "ok"))
    assert cli("-y", "--unattended", "--temperature", "0.7", "Say ok").returncode == 0
    assert llm.agent_requests()[0]["temperature"] == 0.7
    bad = cli("--temperature", "5", "x")
    assert bad.returncode == 2 and one_line(bad.stderr)


def test_loops_are_detected_on_the_commands_output_with_line_numbers_normalised(cli, llm, isolated):
    """Five different double-action replies are not a loop (the note about the second action is not the
    output); the same error three times is."""
    llm.add(*[act("execute_python", f"print({i})") + "\n" + act("execute_shell", "ls") for i in range(5)],
            *[act("execute_shell", f"bash -c 'echo {'x;' * i} no-such-cmd-here' ; exit 3") for i in range(1, 4)],
            act("done", "ok"))
    proc = cli("-y", "--unattended", "Loop test")
    assert proc.returncode == 0, proc.stderr
    _, trace = load(isolated.home)
    warnings = [e for e in trace if e["type"] == "loop_warning"]
    assert [w["step"] for w in warnings] == [8]  # steps 1-5 are no loop; 6-8 meet the same error three times
    notes = [e for e in trace if e["type"] == "observation" and e.get("note")]
    assert len(notes) == 5 and "more than one action" in notes[0]["note"]


def test_a_repeated_bash_error_at_other_lines_is_a_loop():
    from miniagi.loop_detector import LoopDetector

    detector = LoopDetector()
    # echoed transcript text run by bash: other commands each time, the same error at other lines
    lengths = [detector.observe("execute_shell", f"echo step {i}\nObservation: ...", f"bash: line {189 + 37 * i}: "
                                "Observation:: command not found\nexit code 127") for i in range(3)]
    assert lengths == [1, 2, 3]


def test_tracebacks_name_the_step_and_the_endpoint_url_is_not_redacted(cli, llm, isolated):
    llm.add(act("memorize_thoughts", "first"), act("execute_python", "1 / 0"),
            *[Fail(502, message="bad gateway")] * 5)
    proc = cli("-y", "--unattended", "Divide")
    assert proc.returncode == 2
    result, trace = load(isolated.home)
    assert 'File "<step 2>", line 1' in observations(trace)[2]
    assert llm.url in result["message"] and "REDACTED" not in result["message"]


# --- follow-ups and chat ----------------------------------------------------------------------------------------
def test_a_follow_up_with_c_carries_the_previous_answer(cli, llm, isolated):
    llm.add(act("execute_python", "value = 6 * 7\nprint(value)"), act("memorize_thoughts", "value holds 42"),
            act("done", "The value is 42."))
    assert cli("-y", "--unattended", "Compute six times seven").returncode == 0
    (first,) = run_dirs(isolated.home)
    llm.add(act("done", "Doubled: 84."))
    proc = cli("-y", "--unattended", "-c", "Now double it")
    assert proc.returncode == 0, proc.stderr
    head = llm.agent_requests()[-1]["messages"][1]["content"]
    assert "The value is 42." in head and "Compute six times seven" in head and "value holds 42" in head
    assert "Python variables" in head and "gone" in head  # a new process: the session did not carry over
    second = next(d for d in run_dirs(isolated.home) if d != first)
    start = json.loads((second / "trace.jsonl").read_text().split("\n")[0])
    assert start["follows"] == first.name and start["objective"] == "Now double it"
    llm.add(act("done", "Again."))
    assert cli("-y", "--unattended", "--cid", first.name[:-1], "Once more").returncode == 0
    assert "The value is 42." in llm.agent_requests()[-1]["messages"][1]["content"]
    bad = cli("-y", "--unattended", "--cid", "no-such-run", "x")
    assert bad.returncode == 2 and one_line(bad.stderr)


def test_c_continues_the_newest_run_of_this_work_directory(cli, llm, isolated):
    other = isolated.work.parent / "other-project"
    other.mkdir()
    llm.add(act("done", "Here: 1."))
    assert cli("-y", "Count here").returncode == 0
    (here,) = run_dirs(isolated.home)
    llm.add(act("done", "There: 2."))
    assert cli("-y", "Count there", cwd=other).returncode == 0
    # the newest run anywhere is the other folder's: -c from here continues this folder's run, and says which
    llm.add(act("done", "Continued."))
    proc = cli("-y", "-c", "And again")
    assert proc.returncode == 0, proc.stderr
    assert f"continues run {here.name}" in proc.stderr.splitlines()[0]
    assert "Count here" in llm.agent_requests()[-1]["messages"][1]["content"]
    # continuing, with --cid, a run of another folder tells the model where its files really are
    there = next(d for d in run_dirs(isolated.home) if load_one(d)[0]["objective"] == "Count there")
    llm.add(act("done", "Ok."))
    assert cli("-y", "--cid", there.name, "Go on").returncode == 0
    head = llm.agent_requests()[-1]["messages"][1]["content"]
    assert f"another directory, {other}" in head and "not in this run's working directory" in head
    # a folder with no runs: -c is refused, naming the newest run elsewhere
    empty = isolated.work.parent / "empty"
    empty.mkdir()
    refused = cli("-y", "-c", "x", cwd=empty)
    assert refused.returncode == 2 and one_line(refused.stderr) and "--cid" in refused.stderr


def test_chat_keeps_the_python_session_between_objectives(cli, llm, isolated):
    llm.add(act("execute_python", "basket = ['apple', 'pear']\nprint(len(basket))"), act("done", "Two fruits."),
            act("execute_python", "basket.append('plum')\nprint(basket)"), act("done", "Three fruits now."))
    proc = cli("chat", "-y", "--unattended", input="Put two fruits in a basket\n\nAdd a plum\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["Two fruits.", "Three fruits now."]
    # two runs, the second following the first (their ids may sort either way within one second)
    second, first = sorted(run_dirs(isolated.home), key=lambda d: "follows" not in load_one(d)[0])
    assert "'apple', 'pear', 'plum'" in observations(load_one(second))[1]  # the variable from the first objective
    start = load_one(second)[0]
    assert start["follows"] == first.name and "carries over" in start["background"]


def load_one(directory):
    return [json.loads(line) for line in (directory / "trace.jsonl").read_text().split("\n") if line]


# --- a call's arguments survive the trip ------------------------------------------------------------------------
AWKWARD = {"question": 'Which is larger, 2|3? Answer with one number | nothing else.\n"Quoted" \'too\' — ünïcødé ✓ ',
           "sources": ["missing|file.md", "notes  two.md"]}


@pytest.mark.parametrize("protocol", ["tools", "json"])
def test_a_calls_arguments_come_back_exactly_in_the_history_and_the_trace(cli, llm, isolated, protocol):
    sent = json.dumps(AWKWARD, ensure_ascii=False)
    if protocol == "tools":
        llm.add(Calls([("process_data", sent)], "compare"), Calls([("done", '{"answer": "3"}')]))
    else:
        llm.add(json.dumps({"thought": "compare", "command": "process_data", "args": AWKWARD}, ensure_ascii=False),
                '{"thought": "finish", "command": "done", "args": {"answer": "3"}}')
    proc = cli("-y", "--unattended", "--protocol", protocol, "Compare")
    assert proc.returncode == 0, proc.stderr
    _, trace = load(isolated.home)
    action = next(e for e in trace if e["type"] == "action")
    assert action["args"] == AWKWARD  # one JSON object in the trace, characters and types as sent
    shown = llm.agent_requests()[1]["messages"]
    (reply,) = [m for m in shown if m["role"] == "assistant"]
    if protocol == "tools":
        assert reply["tool_calls"][0]["function"]["arguments"] == sent  # byte-identical
    else:
        assert json.loads(reply["content"])["args"] == AWKWARD
        assert json.dumps(AWKWARD, ensure_ascii=False) in reply["content"]


def test_a_resumed_run_shows_the_recorded_call_not_a_re_split_text(cli, llm, isolated):
    llm.add(Calls([("process_data", json.dumps(AWKWARD))], "compare"))
    proc = cli("-y", "--unattended", "--protocol", "tools", "--max-steps", "1", "Compare")
    assert proc.returncode != 0
    (directory,) = run_dirs(isolated.home)
    llm.add(Calls([("done", '{"answer": "3"}')]))
    proc = cli("resume", directory.name, "-y", "--unattended", "--max-steps", "3")
    assert proc.returncode == 0, proc.stderr
    shown = llm.agent_requests()[-1]["messages"]
    (reply,) = [m for m in shown if m["role"] == "assistant"]
    assert json.loads(reply["tool_calls"][0]["function"]["arguments"]) == AWKWARD
