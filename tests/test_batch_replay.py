"""Unattended at scale: batch objectives in parallel workers, and replay of recorded runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from .conftest import act, ip_address, one_line, run_dirs
from .fake_llm import Fail, Hang


def objective_of(request) -> str:
    briefing = next(m["content"] for m in request["messages"] if m["content"].startswith("OBJECTIVE:"))
    return briefing.split("\n")[1]


def step_of(request) -> int:
    return 1 + sum(m["role"] == "assistant" for m in request["messages"])


class Scripted:
    """Answers by objective and step, so objectives running in parallel each get their own script."""

    def __init__(self, scripts):
        self.scripts = scripts
        self.seen: list[str] = []

    def __call__(self, request):
        objective = objective_of(request)
        self.seen.append(objective)
        script = self.scripts[objective]
        return script(step_of(request)) if callable(script) else script[min(step_of(request), len(script)) - 1]


def write_batch(path, lines):
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")


def results(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_batch_survives_a_failing_endpoint_and_a_limit_and_a_rerun_retries_only_what_is_not_done(cli, llm,
                                                                                                     isolated):
    responder = Scripted({
        "Add 2 and 3": [act("execute_python", "print(2 + 3)"), act("done", "5")],
        "Use the broken model": lambda step: Fail(500, {"Retry-After": "0"}, "model crashed"),
        "Count forever": lambda step: act("memorize_thoughts", f"counting {step}"),
        "Say hello": [act("done", "hello")],
    })
    llm.responder = responder
    batch_file = isolated.work / "jobs.jsonl"
    write_batch(batch_file, [{"id": "sum", "objective": "Add 2 and 3"},
                             {"id": "broken", "objective": "Use the broken model", "model": "broken-model"},
                             {"id": "long", "objective": "Count forever", "max_steps": 2},
                             {"id": "hello", "objective": "Say hello"}])
    out = isolated.work / "out"
    proc = cli("batch", str(batch_file), "--workers", "2", "--out", str(out), "-y")
    assert proc.returncode == 3, proc.stderr
    first = {r["id"]: r for r in results(out / "results.jsonl")}
    assert set(first) == {"sum", "broken", "long", "hello"}
    assert (first["sum"]["status"], first["sum"]["answer"]) == ("done", "5")
    assert (first["hello"]["status"], first["hello"]["answer"]) == ("done", "hello")
    assert first["broken"]["status"] == "error" and first["long"]["status"] == "limit"
    assert first["long"]["steps"] == 2
    for record in first.values():
        assert set(record) >= {"id", "objective", "status", "answer", "run_id", "steps", "cost_usd"}
    for id_ in ("sum", "long", "hello"):  # (a run refused at its first request is not kept: broken has none)
        assert (isolated.home / "runs" / first[id_]["run_id"]).is_dir()
    assert "500" in first["broken"]["message"]
    assert "batch summary" in proc.stderr and (out / "logs" / "broken.log").read_text()

    responder.scripts["Use the broken model"] = [act("done", "fixed")]
    responder.scripts["Count forever"] = lambda step: act("done", "counted")
    responder.seen.clear()
    write_batch(batch_file, [{"id": "sum", "objective": "Add 2 and 3"},  # the limit raised for the rerun
                             {"id": "broken", "objective": "Use the broken model", "model": "broken-model"},
                             {"id": "long", "objective": "Count forever", "max_steps": 4},
                             {"id": "hello", "objective": "Say hello"}])
    rerun = cli("batch", str(batch_file), "--workers", "2", "--out", str(out), "-y")
    assert rerun.returncode == 0, rerun.stderr
    assert set(responder.seen) == {"Use the broken model", "Count forever"}  # done ones were skipped
    lines = results(out / "results.jsonl")
    assert len(lines) == 6 and {r["id"] for r in lines[4:]} == {"broken", "long"}
    assert all(r["status"] == "done" for r in lines[4:])
    long_again = next(r for r in lines[4:] if r["id"] == "long")
    assert long_again["run_id"] == first["long"]["run_id"] and long_again["steps"] == 3  # resumed, not restarted


def test_txt_batches_run_unattended_and_the_cost_cap_stops_new_objectives(cli, llm, isolated):
    llm.responder = Scripted({"first job": [act("done", "one")], "second job": [act("done", "two")],
                              "third job": [act("done", "three")]})
    (isolated.work / "jobs.txt").write_text("# my jobs\nfirst job\n\nsecond job\nthird job\n")
    proc = cli("batch", "jobs.txt", "--workers", "1", "--model", "gpt-4o", "--max-batch-cost", "0.000001")
    assert proc.returncode == 3, proc.stderr
    lines = results(isolated.work / "jobs-txt-results" / "results.jsonl")
    assert [r["id"] for r in lines] == ["2"] and lines[0]["answer"] == "one"  # ids are line numbers
    assert "cost cap" in proc.stderr and "not started" in proc.stderr


def test_every_bad_line_is_named_at_once_and_fails_alone_and_duplicate_ids_are_refused(cli, llm, isolated):
    llm.responder = Scripted({"Say hello": [act("done", "hello")]})
    (isolated.work / "bad.jsonl").write_text("\n".join([
        '{"id": "ok", "objective": "Say hello"}',
        'not json',
        '{"id": "typo", "objective": "x", "max_stepz": 3}',
        '{"id": "check-typo", "objective": "x", "chek": "true"}',
        '{"id": "colour", "objective": "x", "colour": "red"}',
        '{"id": "bad-value", "objective": "x", "max_steps": "many"}',
        '["a list"]',
        '{"id": "no-objective", "check": "true"}',
        '{"id": "bad-regex", "objective": "x", "expect": "(unclosed"}']) + "\n")
    proc = cli("batch", "bad.jsonl")
    assert proc.returncode == 3, proc.stderr
    said = proc.stderr.split("· to run on")[-1]
    for expected in ("bad.jsonl:2: not JSON", "bad.jsonl:3: unknown option 'max_stepz' (did you mean max_steps?)",
                     "bad.jsonl:4: unknown option 'chek' (did you mean check?)", "bad.jsonl:5: unknown option 'colour'",
                     "bad.jsonl:6:", "bad.jsonl:7: a line is one JSON object", 'bad.jsonl:8: each line needs an',
                     'bad.jsonl:9: "expect" is not a regular expression'):
        assert expected in said, expected
    assert said.index("bad.jsonl:9") < said.index("batch summary")  # all named before anything runs
    records = {r["id"]: r for r in results(isolated.work / "bad-jsonl-results" / "results.jsonl")}
    assert len(records) == 9 and records["ok"]["status"] == "done"  # the good line ran
    bad = [r for id_, r in records.items() if id_ != "ok"]
    assert all(r["status"] == "error" and r["message"].startswith("bad.jsonl:") for r in bad)

    (isolated.work / "twice.jsonl").write_text('{"id": "a", "objective": "x"}\n{"id": "b", "objective": "y"}\n'
                                               '{"id": "a", "objective": "z"}\n{"id": "b", "objective": "w"}\n')
    twice = cli("batch", "twice.jsonl")
    assert twice.returncode == 2 and one_line(twice.stderr)
    assert "the id 'a' is on lines 1 and 3" in twice.stderr and "the id 'b' is on lines 2 and 4" in twice.stderr
    (isolated.work / "jobs.csv").write_text("x")
    assert cli("batch", "jobs.csv").returncode == 2


def test_ctrl_c_stops_a_batch_cleanly_and_the_rerun_picks_up(cli, llm, isolated):
    llm.responder = Scripted({"slow one": lambda step: Hang(60) if step == 1 else act("done", "late"),
                              "quick one": [act("done", "quick")]})
    (isolated.work / "jobs.txt").write_text("slow one\n")
    env = dict(os.environ, OPENAI_BASE_URL=llm.url, OPENAI_API_KEY="sk-test", MINIAGI_MEMORY_SCOPE="off")
    process = subprocess.Popen([sys.executable, "-m", "miniagi", "batch", "jobs.txt", "--workers", "1"],
                               cwd=isolated.work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    from .test_end_to_end import _wait_for

    assert _wait_for(lambda: len(llm.requests) >= 1)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    (record,) = results(isolated.work / "jobs-txt-results" / "results.jsonl")
    assert record["status"] == "interrupted"
    llm.responder = Scripted({"slow one": [act("done", "finally")]})
    assert cli("batch", "jobs.txt").returncode == 0


def test_replay_reproduces_a_run_without_model_calls_and_flags_a_changed_observation(cli, llm, isolated):
    (isolated.work / "input.txt").write_text("alpha\n")
    llm.add(act("execute_shell", "cat input.txt"), act("execute_python", "print(6 * 7)"),
            act("done", "read alpha, computed 42"))
    assert cli("-y", "read and compute").returncode == 0
    (run_dir,) = run_dirs(isolated.home)
    calls_before = len(llm.requests)

    no_endpoint = {"OPENAI_BASE_URL": None, "OPENAI_API_KEY": None}
    same = cli("replay", run_dir.name, "-y", "--json", env=no_endpoint)
    assert same.returncode == 0, same.stderr
    report = json.loads(same.stdout.strip().splitlines()[-1])
    assert report["reproduced"] and report["model_calls"] == 0 and report["replayed_responses"] == 3
    assert len(llm.requests) == calls_before  # nothing reached the endpoint

    (isolated.work / "input.txt").write_text("beta\n")
    changed = cli("replay", str(run_dir / "trace.jsonl"), "-y", env=no_endpoint)
    assert changed.returncode == 1
    assert "first difference at step 1 (execute_shell)" in changed.stdout
    assert "alpha" in changed.stdout and "beta" in changed.stdout
    replays = [json.loads((d / "trace.jsonl").read_text().splitlines()[0]) for d in run_dirs(isolated.home)]
    assert sum(1 for start in replays if start.get("replay_of") == run_dir.name) == 2


def test_the_example_in_the_readme_replays_on_a_machine_with_no_api_key(cli, isolated):
    from pathlib import Path

    example = Path(__file__).resolve().parent.parent / "examples" / "fibonacci.trace.jsonl"
    proc = cli("replay", str(example), "-y", "--workdir", str(isolated.work),
               env={"OPENAI_BASE_URL": None, "OPENAI_API_KEY": None})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "reproduced" in proc.stdout and "0 model calls" in proc.stdout
    assert (isolated.work / "fibonacci.txt").read_text().splitlines()[-1] == "30 832040"


def listening_sockets() -> dict[str, set[str]]:
    """Every listening TCP socket and bound UDP socket in this network namespace, by the name of its process."""
    import psutil

    found: dict[str, set[str]] = {}
    for connection in psutil.net_connections(kind="inet"):
        if connection.status in (psutil.CONN_LISTEN, psutil.CONN_NONE) and connection.laddr:
            try:
                name = psutil.Process(connection.pid).name() if connection.pid else "?"
            except psutil.NoSuchProcess:
                continue
            found.setdefault(name, set()).add(f"{connection.laddr.ip}:{connection.laddr.port}")
    return found


@pytest.mark.own_network  # a local Ray instance listens on the machine's address: here there is only loopback
def test_a_batch_spreads_over_a_ray_cluster(cli, llm, isolated):
    scripted = Scripted({"first on ray": [act("done", "one")], "second on ray": [act("done", "two")],
                         "third on ray": [act("done", "three")]})
    listening: dict[str, set[str]] = {}

    def answer(request):  # a run asks the model from inside its Ray task: Ray's processes are all up now
        for name, addresses in listening_sockets().items():
            listening.setdefault(name, set()).update(addresses)
        return scripted(request)

    llm.responder = answer
    (isolated.work / "jobs.txt").write_text("first on ray\nsecond on ray\nthird on ray\n")
    proc = cli("batch", "jobs.txt", "--workers", "2", "--ray", timeout=240, process=True)  # a local Ray instance
    assert proc.returncode == 0, proc.stderr
    records = {r["id"]: r for r in results(isolated.work / "jobs-txt-results" / "results.jsonl")}
    assert {r["answer"] for r in records.values()} == {"one", "two", "three"}
    assert all(r["status"] == "done" and r["node"] for r in records.values())
    assert "Token authentication" not in proc.stderr  # our own instance: token auth, as Ray's default, said by no one
    for record in records.values():  # the runs were recorded where MINIAGI_HOME points, as any run is
        assert (isolated.home / "runs" / record["run_id"] / "result.json").is_file()
    print("listening while the runs asked the model:")
    for name, addresses in sorted(listening.items()):
        print(f"  {name}: {' '.join(sorted(addresses))}")
    assert {"gcs_server", "raylet"} <= set(listening), listening  # Ray's own processes were seen listening
    assert all(ip_address(address.rsplit(":", 1)[0]).is_loopback  # ::ffff:127.0.0.1 is 127.0.0.1 on an IPv6 socket
               for addresses in listening.values() for address in addresses), listening
