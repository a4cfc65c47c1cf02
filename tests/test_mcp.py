"""MCP servers' tools as commands, with real servers: mcp-server-git on a local repository and mcp-server-time (from
PyPI, the test extra), and a small server of the tests' own (tests/mcp_server.py) for errors, timeouts, results that
are not text and a server that exits. The model is the scripted endpoint (tests/fake_llm.py)."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memory.budget import Budget

from .conftest import act, run_dirs
from .fake_llm import Calls, summarizing

# the real servers come with the test extra (pip install -e ".[test]"); the probe server needs only the SDK
real_servers = pytest.mark.skipif(not (importlib.util.find_spec("mcp_server_git")
                                       and importlib.util.find_spec("mcp_server_time")),
                                  reason="mcp-server-git and mcp-server-time are not installed")

PROBE = str(Path(__file__).with_name("mcp_server.py"))
FENCE = "<<<UNTRUSTED DATA: result of"


@pytest.fixture
def repo(tmp_path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    git = ["git", "-C", str(path), "-c", "user.name=Tess", "-c", "user.email=tess@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    (path / "notes.txt").write_text("first line\n")
    subprocess.run([*git, "add", "notes.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "Add the notes of the pelican survey"], check=True)
    (path / "notes.txt").write_text("first line\nan unstaged second line\n")
    return path


def write_config(path: Path, servers: dict) -> str:
    path.write_text(json.dumps({"mcpServers": servers}))
    return str(path)


def git_and_time(tmp_path, repo) -> str:
    return write_config(tmp_path / "servers.json", {
        "git": {"command": sys.executable, "args": ["-m", "mcp_server_git", "--repository", str(repo)]},
        "time": {"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}})


def probe_config(tmp_path, **env) -> str:
    return write_config(tmp_path / "probe.json", {"probe": {"command": sys.executable, "args": [PROBE],
                                                            "env": env}})


def trace_of(home: Path, index: int = -1) -> list[dict]:
    return [json.loads(line) for line in (run_dirs(home)[index] / "trace.jsonl").read_text().split("\n") if line]


def trace_for(home: Path, objective: str) -> list[dict]:
    """The trace of the run of this objective (run ids made in one second do not sort by time)."""
    (found,) = [trace for trace in (trace_of(home, i) for i in range(len(run_dirs(home))))
                if trace[0].get("objective") == objective]
    return found


def observations(trace: list[dict]) -> dict[int, str]:
    return {e["step"]: e["text"] for e in trace if e["type"] == "observation"}


def system_prompt(llm) -> str:
    return llm.agent_requests()[0]["messages"][0]["content"]


# --- the real servers, in each format ---------------------------------------------------------------------------
@real_servers
def test_tags_the_model_calls_git_and_time_tools_with_one_json_object(cli, llm, isolated, tmp_path, repo):
    llm.add(act("time__convert_time", '{"source_timezone": "Asia/Kolkata", "time": "16:30", '
                                      '"target_timezone": "Asia/Tokyo"}'),  # neither has summer time
            act("git__git_log", json.dumps({"repo_path": str(repo), "max_count": 1})),
            act("git__git_diff_unstaged", f"```json\n{json.dumps({'repo_path': str(repo)})}\n```"),
            act("done", "converted and read the log"))
    proc = cli("-y", "--mcp-config", git_and_time(tmp_path, repo), "When is 16:30 Kolkata in Tokyo? What changed?")
    assert proc.returncode == 0, proc.stderr
    prompt = system_prompt(llm)
    # the tags help: the command, its argument as one JSON object, the server's own description
    assert ('- time__convert_time {"source_timezone": "…", "time": "…", "target_timezone": "…"}: [MCP server time] '
            'Convert time between timezones') in prompt
    assert "- git__git_log {\"repo_path\": \"…\"} (optional: max_count, start_timestamp, end_timestamp)" in prompt
    seen = observations(trace_of(isolated.home))
    assert FENCE + " convert_time from the MCP server time" in seen[1] and "T20:00" in seen[1]  # +3.5 hours
    assert "Add the notes of the pelican survey" in seen[2] and FENCE in seen[2]
    assert "+an unstaged second line" in seen[3]
    calls = [e for e in trace_of(isolated.home) if e["type"] == "mcp_call"]
    assert [c["command"] for c in calls] == ["time__convert_time", "git__git_log", "git__git_diff_unstaged"]
    assert calls[1]["arguments"] == {"repo_path": str(repo), "max_count": 1} and all(c["ok"] for c in calls)


@real_servers
def test_tools_each_tool_is_a_native_tool_with_the_servers_input_schema(cli, llm, isolated, tmp_path, repo):
    llm.add(Calls([("git__git_status", json.dumps({"repo_path": str(repo)}))], "what is the state?"),
            Calls([("time__get_current_time", '{"timezone": "America/New_York"}')]),
            Calls([("done", json.dumps({"answer": "seen"}))]))
    proc = cli("-y", "--protocol", "tools", "--mcp-config", git_and_time(tmp_path, repo), "Look at the repository")
    assert proc.returncode == 0, proc.stderr
    tools = {t["function"]["name"]: t["function"] for t in llm.agent_requests()[0]["tools"]}
    status = tools["git__git_status"]
    assert status["parameters"]["required"] == ["repo_path"] and "repo_path" in status["parameters"]["properties"]
    assert status["description"] == "[MCP server git] Shows the working tree status"
    assert "execute_python" in tools and "done" in tools and "time__convert_time" in tools
    seen = observations(trace_of(isolated.home))
    assert "notes.txt" in seen[1] and "modified" in seen[1]
    assert '"timezone": "America/New_York"' in seen[2]
    # the history shows the call back as a tool call with its arguments as sent
    later = llm.agent_requests()[2]["messages"]
    call = next(m for m in later if m.get("tool_calls"))["tool_calls"][0]["function"]
    assert call["name"] == "git__git_status" and json.loads(call["arguments"]) == {"repo_path": str(repo)}


@real_servers
def test_json_the_command_is_in_the_enum_and_its_schema_in_the_args(cli, llm, isolated, tmp_path, repo):
    llm.add(json.dumps({"thought": "show the commit", "command": "git__git_show",
                        "args": {"repo_path": str(repo), "revision": "HEAD"}}),
            json.dumps({"thought": "done", "command": "done", "args": {"answer": "shown"}}))
    proc = cli("-y", "--protocol", "json", "--mcp-config", git_and_time(tmp_path, repo), "Show the last commit")
    assert proc.returncode == 0, proc.stderr
    schema = llm.agent_requests()[0]["response_format"]["json_schema"]["schema"]
    assert "git__git_show" in schema["properties"]["command"]["enum"]
    assert any(s.get("required") == ["repo_path", "revision"] for s in schema["properties"]["args"]["anyOf"])
    assert "- git__git_show(repo_path: str, revision: str): [MCP server git]" in system_prompt(llm)
    seen = observations(trace_of(isolated.home))
    assert "Add the notes of the pelican survey" in seen[1] and "+first line" in seen[1]


@real_servers
def test_python_code_calls_the_tools_as_functions_with_keyword_arguments(cli, llm, isolated, tmp_path, repo):
    code = ("import json\n"
            "now = json.loads(time__get_current_time(timezone='Asia/Tokyo'))\n"
            "print('zone', now['timezone'])\n"
            f"log = git__git_log({str(repo)!r}, max_count=1)\n"
            "print('pelican' in log)\n"
            "print(git__git_status(repo_path=" + repr(str(repo)) + "))")
    llm.add(act("execute_python", code), act("done", "ok"))
    proc = cli("-y", "--mcp-config", git_and_time(tmp_path, repo), "Use the tools from Python")
    assert proc.returncode == 0, proc.stderr
    assert ("and each MCP tool (the SERVER__TOOL commands), its JSON keys as keyword arguments, returning the "
            'result\'s text, e.g. git__git_status(repo_path="…")') in system_prompt(llm)
    seen = observations(trace_of(isolated.home))[1]
    assert "zone Asia/Tokyo" in seen and "\nTrue\n" in seen
    # printed whole, a result shows between the untrusted-data fence lines
    assert FENCE + " git_status from the MCP server git" in seen and "notes.txt" in seen
    assert [c["command"] for c in trace_of(isolated.home) if c["type"] == "mcp_call"] == [
        "time__get_current_time", "git__git_log", "git__git_status"]


# --- failures are observations ------------------------------------------------------------------------------------
def test_a_tool_error_a_timeout_and_a_server_that_exits_are_observations(cli, llm, isolated, tmp_path):
    code = ("try:\n    probe__fail(reason='from code')\nexcept Exception as error:\n"
            "    print(type(error).__name__, 'probe__fail failed' in str(error))\nprint(probe__add(a=1, b=2))")
    llm.add(act("execute_python", code),
            act("probe__add", '{"a": 2, "b": 40}'),
            act("probe__fail", '{"reason": "no pelicans today"}'),
            act("probe__add", "not json at all"),
            act("probe__slow", '{"seconds": 30}'),
            act("probe__picture", "{}"),
            act("probe__crash", "{}"),
            act("probe__add", '{"a": 1, "b": 1}'),
            act("done", "survived"))
    started = time.monotonic()
    proc = cli("-y", "--exec-timeout", "3", "--mcp-config", probe_config(tmp_path), "Try the probe")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("survived") and "Traceback" not in proc.stderr
    assert time.monotonic() - started < 25  # the slow call was abandoned at the time limit
    seen = observations(trace_of(isolated.home))
    assert "ToolError True\n" in seen[1] and "\n3" in seen[1]  # from code, a tool's error is an exception
    seen = {step - 1: text for step, text in seen.items() if step > 1}  # then the model's own calls
    assert FENCE + " add from the MCP server probe" in seen[1] and "\n42\n" in seen[1]
    assert seen[2].startswith("probe__fail failed: <<<UNTRUSTED DATA: error of fail")
    assert "probe__add needs its arguments as one JSON object; nothing was done" in seen[3]
    assert 'Write it as: <c>probe__add</c>\n{"a": 0, "b": 0}' in seen[3]
    assert "no answer from the MCP server probe within 3 s" in seen[4]
    assert "a red dot follows" in seen[5] and "[an image (image/png" in seen[5] and "the notes" in seen[5]
    assert "the MCP server probe is gone" in seen[6]
    assert "the MCP server probe is not available" in seen[7]


def test_a_result_is_bounded_and_redacted_and_the_server_stops_with_the_run(cli, llm, isolated, tmp_path):
    key = "sk-test-key-123456"  # the endpoint's key (the cli fixture's): a secret wherever it appears
    llm.add(act("probe__secret", "{}"), act("probe__big", '{"lines": 50000}'),
            act("execute_python", "print(probe__secret())"), act("done", "ok"))
    # the big result is shown as whole as the prompt has room for: the summary it then needs comes from here
    llm.responder = lambda request: ("The probe told a secret and printed a long result." if summarizing(request)
                                     else None)
    proc = cli("-y", "--mcp-config", probe_config(tmp_path, PROBE_SECRET=key), "Tell the secret")
    assert proc.returncode == 0, proc.stderr
    seen = observations(trace_for(isolated.home, "Tell the secret"))
    assert "the secret is" in seen[1] and "the secret is" in seen[3]
    assert key not in json.dumps(trace_for(isolated.home, "Tell the secret"))
    assert key not in json.dumps(llm.agent_requests()) and key not in proc.stdout + proc.stderr
    # a secret known only to the server's configuration is hidden as well
    llm.add(act("probe__secret", "{}"), act("done", "ok"))
    own = "mcp-only-value-98765"
    assert cli("-y", "--mcp-config", probe_config(tmp_path, PROBE_SECRET=own), "Again").returncode == 0
    assert "the secret is [REDACTED]" in observations(trace_for(isolated.home, "Again"))[1]
    assert own not in json.dumps(llm.agent_requests())
    # 1.5 MB of text, bounded: capped to characters (twice those of the room one output has) long before the model
    assert "line 0 of the long result" in seen[2] and len(seen[2]) < Budget().item_chars + 1000
    assert not running(PROBE)


def running(script: str) -> list:
    """This process's descendants that run the script."""
    import psutil

    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if script in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.Error:  # gone meanwhile
            continue
    return found


def test_a_tool_asks_for_approval_like_execute_and_is_refused_with_no_one_to_ask(cli, llm, isolated, tmp_path):
    llm.add(act("probe__add", '{"a": 2, "b": 2}'), act("done", "not allowed"))
    proc = cli("--mcp-config", probe_config(tmp_path), "Add")
    assert proc.returncode == 0, proc.stderr
    seen = observations(trace_of(isolated.home))
    assert seen[1].startswith("Not run: probe__add needs the user's approval")
    assert not [e for e in trace_of(isolated.home) if e["type"] == "mcp_call"]


def test_a_server_that_cannot_start_is_one_line_and_the_run_goes_on(cli, llm, isolated, tmp_path):
    config = write_config(tmp_path / "broken.json", {
        "broken": {"command": sys.executable, "args": ["-c", "import sys; print('no such tool here', "
                                                               "file=sys.stderr); sys.exit(1)"]},
        "probe": {"command": sys.executable, "args": [PROBE], "env": {"PROBE_SECRET": "kept-in-env"}}})
    llm.add(act("probe__secret", "{}"), act("done", "ok"))
    proc = cli("-y", "--mcp-config", config, "Go")
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "broken" in line]
    assert len(said) == 1 and "MCP server broken could not start" in said[0] and "no such tool here" in said[0]
    assert "broken__" not in system_prompt(llm)
    # the configuration's env reaches the server (and, secret by its name, is redacted from what comes back)
    assert "the secret is [REDACTED]" in observations(trace_of(isolated.home))[1]


def test_a_configuration_that_cannot_be_read_is_refused_in_one_line(cli, llm, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    proc = cli("-y", "--mcp-config", str(bad), "Go")
    assert proc.returncode == 2 and "is not valid JSON" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    bad.write_text(json.dumps({"mcpServers": {"x": {"args": []}}}))
    proc = cli("-y", "--mcp-config", str(bad), "Go")
    assert proc.returncode == 2 and "server 'x': needs a \"command\"" in proc.stderr


# --- .mcp.json ----------------------------------------------------------------------------------------------------
def test_a_planted_mcp_json_is_refused_without_a_terminal_unless_given(cli, llm, isolated, tmp_path):
    marker = tmp_path / "started"
    planted = {"mcpServers": {"planted": {"command": sys.executable,
                                          "args": ["-c", f"open({str(marker)!r}, 'w').write('ran')"]}}}
    (isolated.work / ".mcp.json").write_text(json.dumps(planted))
    llm.add(act("done", "nothing"))
    proc = cli("-y", "Go")
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if ".mcp.json" in line]
    assert len(said) == 1 and "was not used" in said[0] and "--mcp-config" in said[0]
    assert not marker.exists()  # nothing it names was started

    probe = {"mcpServers": {"probe": {"command": sys.executable, "args": [PROBE]}}}
    (isolated.work / ".mcp.json").write_text(json.dumps(probe))
    llm.add(act("probe__add", '{"a": 1, "b": 2}'), act("done", "given"))
    proc = cli("-y", "--mcp-config", str(isolated.work / ".mcp.json"), "Go")
    assert proc.returncode == 0 and ".mcp.json" not in proc.stderr
    assert "\n3\n" in observations(trace_of(isolated.home))[1]


def test_a_trusted_mcp_json_is_used_until_it_changes(isolated, tmp_path):
    from miniagi.config import Settings
    from miniagi.mcp_tools import configured_servers

    class Person:
        interactive, asked, said = True, [], []

        def confirm(self, question):
            self.asked.append(question)
            return True

        def warn(self, text):
            self.said.append(text)

    (isolated.work / ".mcp.json").write_text(json.dumps({"mcpServers": {"a": {"command": "a-server"}}}))
    settings, person = Settings(workdir=str(isolated.work), home=str(isolated.home)), Person()
    assert [s.name for s in configured_servers(settings, person)] == ["a"] and len(person.asked) == 1
    assert "outside the sandbox" in person.asked[0]
    assert [s.name for s in configured_servers(settings, person)] == ["a"] and len(person.asked) == 1  # remembered
    (isolated.work / ".mcp.json").write_text(json.dumps({"mcpServers": {"b": {"command": "b-server"}}}))
    person.interactive = False
    assert configured_servers(settings, person) == [] and "was not used" in person.said[0]  # changed: asked again



def test_a_changed_mcp_json_once_confirmed_is_not_asked_about_again(isolated):
    """The yes is kept in the same record as .env's (~/.miniagi's): a run's start-up check of .env, which rewrites
    that record, keeps it (a yes once kept only in the run's home's copy was lost, and asked about at every run)."""
    from miniagi.config import Settings
    from miniagi.mcp_tools import configured_servers
    from miniagi.trust import DotenvGuard

    class Person:
        interactive, asked = True, []

        def confirm(self, question):
            self.asked.append(question)
            return True

        def warn(self, text):
            pass

    settings, person = Settings(workdir=str(isolated.work), home=str(isolated.home)), Person()

    def start_a_run() -> list[str]:  # what a run does first: the .env check, then the servers
        DotenvGuard(settings, {}).check(person)
        return [spec.name for spec in configured_servers(settings, person)]

    (isolated.work / ".mcp.json").write_text(json.dumps({"mcpServers": {"a": {"command": "a-server"}}}))
    assert start_a_run() == ["a"] and len(person.asked) == 1
    assert start_a_run() == ["a"] and len(person.asked) == 1
    (isolated.work / ".mcp.json").write_text(json.dumps({"mcpServers": {"b": {"command": "b-server"}}}))
    assert start_a_run() == ["b"] and len(person.asked) == 2  # changed: asked, and yes
    assert start_a_run() == ["b"] and len(person.asked) == 2  # remembered
    assert start_a_run() == ["b"] and len(person.asked) == 2

# --- lifecycle ----------------------------------------------------------------------------------------------------
@real_servers
def test_replay_starts_no_server_and_answers_with_the_recorded_results(cli, llm, isolated, tmp_path, repo):
    llm.add(act("time__get_current_time", '{"timezone": "Europe/Paris"}'),
            act("execute_python", f"print(git__git_status(repo_path={str(repo)!r}).splitlines()[0])"),
            act("done", "recorded"))
    config = git_and_time(tmp_path, repo)
    assert cli("-y", "--mcp-config", config, "What time is it in Paris?").returncode == 0
    (original,) = run_dirs(isolated.home)
    Path(config).unlink()  # the servers cannot be started again: only the recording can answer
    subprocess.run(["git", "-C", str(repo), "add", "notes.txt"], check=True)  # the live status would differ now

    proc = cli("replay", original.name, "-y", "--json", env={"OPENAI_BASE_URL": None, "OPENAI_API_KEY": None,
                                                             "MINIAGI_MCP_CONFIG": config})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["reproduced"] and report["model_calls"] == 0, report
    (replayed,) = [trace_of(isolated.home, i) for i in range(len(run_dirs(isolated.home)))
                   if trace_of(isolated.home, i)[0].get("replay_of") == original.name]
    assert [e["command"] for e in replayed if e["type"] == "mcp_call"] == ["time__get_current_time",
                                                                           "git__git_status"]


def test_resume_starts_the_servers_again(cli, llm, isolated, tmp_path):
    config = probe_config(tmp_path)
    llm.add(act("probe__add", '{"a": 20, "b": 1}'), act("probe__add", '{"a": 20, "b": 2}'), act("done", "both"))
    first = cli("-y", "--max-steps", "1", "--mcp-config", config, "Add twice")
    assert first.returncode == 3, first.stderr
    (run_dir,) = run_dirs(isolated.home)
    proc = cli("resume", run_dir.name, "-y", "--max-steps", "5", env={"MINIAGI_MCP_CONFIG": config})
    assert proc.returncode == 0, proc.stderr
    seen = observations(trace_of(isolated.home))
    assert "\n21\n" in seen[1] and "\n22\n" in seen[2]


def test_a_chat_keeps_its_servers_for_every_objective(cli, llm, isolated, tmp_path):
    llm.add(act("probe__add", '{"a": 1, "b": 1}'), act("done", "two"),
            act("probe__add", '{"a": 2, "b": 2}'), act("done", "four"))
    proc = cli("chat", "-y", "--mcp-config", probe_config(tmp_path), input="add one and one\nadd two and two\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["two", "four"]
    assert "\n4\n" in observations(trace_for(isolated.home, "add two and two"))[1]


def test_a_streamable_http_server_is_reached_by_its_url(cli, llm, isolated, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, PROBE, "--http", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:  # until it listens
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "the HTTP server did not start"
                time.sleep(0.05)
        config = write_config(tmp_path / "http.json", {"web probe": {"url": f"http://127.0.0.1:{port}/mcp"}})
        llm.add(act("web_probe__add", '{"a": 5, "b": 6}'), act("done", "eleven"))
        proc = cli("-y", "--mcp-config", config, "Add over HTTP")
        assert proc.returncode == 0, proc.stderr
        assert "\n11\n" in observations(trace_of(isolated.home))[1]
    finally:
        server.terminate()
        server.wait(10)


def test_at_a_terminal_the_person_trusts_mcp_json_and_approves_each_call(llm, isolated):
    from .test_interactive import run_in_terminal

    (isolated.work / ".mcp.json").write_text(json.dumps({"mcpServers": {"probe": {"command": sys.executable,
                                                                                  "args": [PROBE]}}}))
    llm.add(act("probe__add", '{"a": 3, "b": 4}'), act("probe__add", '{"a": 30, "b": 40}'), act("done", "ok"))
    env = dict(__import__("os").environ, OPENAI_BASE_URL=llm.url, OPENAI_API_KEY="sk-test-key-123456",
               MINIAGI_MEMORY_SCOPE="off")
    proc = run_in_terminal(llm, isolated, "y\nn\ny\n", "add", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "asks to start MCP servers" in proc.stderr and '{"a": 3, "b": 4}' in proc.stderr
    seen = observations(trace_of(isolated.home))
    assert "refused" in seen[1].lower() and "\n70\n" in seen[2]
    trusted = json.loads((Path.home() / ".miniagi" / "trusted-env.json").read_text())  # the one record
    assert "mcpServers" in trusted[str((isolated.work / ".mcp.json").resolve())]


def test_the_python_api_starts_the_servers_again_for_a_second_run(isolated, tmp_path):
    from miniagi import Agent, ScriptedModel, Settings
    from miniagi.commands import COMMANDS

    model = ScriptedModel([act("probe__add", '{"a": 1, "b": 2}'), act("done", "3"),
                           act("probe__add", '{"a": 3, "b": 4}'), act("done", "7")])
    agent = Agent(Settings(yes=True, unattended=True, workdir=str(isolated.work), home=str(isolated.home),
                           memory_scope="off",
                           mcp_config=(probe_config(tmp_path),)), model=model, quiet=True)
    try:
        assert agent.run("first").answer == "3" and not agent.makings.mcp.running  # stopped with the run
        assert agent.run("second").answer == "7"
        other = Agent(Settings(yes=True, unattended=True, workdir=str(isolated.work), home=str(isolated.home),
                               memory_scope="off"), model=ScriptedModel([]), quiet=True)
        # the tools are this agent's own: no other agent offers them, and the built-in table never holds them
        assert "probe__add" in agent.services.protocol.commands and "probe__add" not in other.services.protocol.commands
        assert "probe__add" in agent.services.protocol.describe()
        assert "probe__add" not in other.services.protocol.describe()
        from miniagi.protocols import formats

        tools = formats()["tools"]
        assert "probe__add" in json.dumps(tools.offering(agent.services.protocol.commands).request())
        assert "probe__add" not in json.dumps(tools.offering(other.services.protocol.commands).request())
        assert "probe__add" not in json.dumps(tools.request())
    finally:
        agent.close()
    assert "\n7\n" in observations(trace_for(isolated.home, "second"))[1]
    assert not [name for name in COMMANDS if "__" in name]


def test_a_tool_whose_keys_python_cannot_name_takes_them_as_extra_keywords():
    import inspect

    from miniagi.execution.worker import make_tool
    from miniagi.mcp_tools import make_commands

    (command,) = make_commands([{"server": "odd", "prefix": "odd", "tool": "Look-Up", "description": "  Looks\n up. ",
                                 "input_schema": {"type": "object", "required": ["n", "repo-path"], "properties": {
                                     "class": {"type": "string"}, "n": {"type": "integer"},
                                     "repo-path": {"type": "string"}, "deep": {"type": "boolean", "default": False}}}}],
                               call=lambda command, args: None)
    assert command.name == "odd__look_up" and command.doc == "[MCP server odd] Looks up."
    assert command.help_argument() == '{"n": 0, "repo-path": "…"} (optional: class, deep)'
    tool = make_tool(command.python_spec(), None, None)
    assert str(inspect.signature(tool)) == "(n: int, deep: bool = False, **_other) -> str"
    assert command.parse('{"n": 3, "repo-path": "."}') == {"n": 3, "repo-path": "."}
    assert command.missing(command.parse("three")) == ["its arguments as one JSON object"]
    assert command.missing(command.parse('{"n": 3}')) == ["repo-path"]
    assert command.arguments({"arguments": {"n": 1, "repo-path": "x"}}) == {"n": 1, "repo-path": "x"}
