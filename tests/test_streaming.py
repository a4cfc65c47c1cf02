"""Every model request streams: silence between chunks is caught, a steady slow reply is never cut, a trickle ends at
the request's deadline, pieces are put together as a non-streamed reply would give them, and a server that will not
stream still answers. The model client is driven in-process against the scripted server (miniagi's real HTTP client);
the run itself as a process where signals or the whole command line matter."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from miniagi.config import Endpoint
from miniagi.endpoint import OpenAIModel
from miniagi.model import Completion, ModelError, ModelUnavailable
from miniagi.retry import Backoff
from miniagi.terminal import Flow

from .conftest import act
from .fake_llm import Calls, Fail, Hang, Raw, Stream, Trickle
from .test_end_to_end import _wait_for, load_run

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say something."}]


def client(llm, told: list | None = None, **options) -> OpenAIModel:
    return OpenAIModel(Endpoint("sk-test-key-123456", llm.url), backoff=Backoff(base_s=0, cap_s=0),
                       on_retry=(told if told is not None else []).append, **options)


def ask(model: OpenAIModel, **request) -> Completion:
    return model.complete(MESSAGES, model="gpt-4o", **{"max_tokens": 2000, **request})


def test_a_slow_steady_reply_longer_than_three_timeouts_is_taken_whole(llm):
    words = [f" word{i}" for i in range(20)]
    llm.add(Stream(words, every=0.2))
    pieces: list[str] = []
    completion = ask(client(llm, request_timeout_s=1.0), on_piece=pieces.append)
    assert completion.text == "".join(words) and completion.finish_reason == "stop"
    assert completion.latency_s > 3 * 1.0  # three silences' worth, never cut: each gap was short
    assert "".join(pieces) == completion.text and len(pieces) == 20  # told as it came
    assert completion.first_token_s is not None and completion.generation_s > 0 and completion.tokens_per_s > 0
    (request,) = llm.requests
    assert request["stream"] is True and request["stream_options"] == {"include_usage": True}


def test_a_server_silent_mid_reply_is_given_up_on_after_one_retry(llm):
    llm.add(Stream(["Hello", " there", Hang(30)]), Stream(["Hello", Hang(30)]))
    with pytest.raises(ModelUnavailable, match=r"sent nothing for 0.5 s \(--request-timeout\).*after 2 attempts"):
        ask(client(llm, request_timeout_s=0.5))
    assert len(llm.requests) == 2


def test_a_trickle_of_empty_chunks_ends_at_the_deadline_and_the_connection_is_closed(llm):
    empty = b'data: {"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": null}]}\n\n'
    llm.add(Trickle(0.05, empty))
    with pytest.raises(ModelUnavailable, match=r"did not finish its reply within 2 s \(the request deadline"):
        ask(client(llm, request_timeout_s=1.0, request_deadline_s=2.0))
    assert len(llm.requests) == 1  # a trickle would trickle again: not retried
    assert _wait_for(lambda: llm.disconnects == 1)  # the server learns the reply is not wanted any more


def test_the_default_deadline_scales_with_the_reply_cap(llm):
    model = client(llm, request_timeout_s=120.0)
    assert model.deadline(2000) == 120 + 1000 and model.deadline(200) == 120 + 100
    assert client(llm, request_deadline_s=30.0).deadline(2000) == 30


CALLS = [("execute_python", json.dumps({"code": "print('a, b')\nfor i in range(3):\n    print(i)"})),
         ("done", json.dumps({"answer": "{\"nested\": [1, 2, {\"x\": \"y\"}]}"}))]
JSON_ACTION = json.dumps({"thought": "list it", "command": "execute_shell", "args": {"command": "ls -la \"a b\""}})


def test_tool_calls_and_a_json_reply_from_many_chunks_equal_the_non_streamed_ones(llm):
    """The same replies, streamed (arguments three characters a chunk, text a word a chunk) and not (a server that
    refuses `stream`: asked again without it, once said)."""
    llm.add(Calls(CALLS, "Let me look."), JSON_ACTION)
    streaming = client(llm)
    streamed = [ask(streaming, tools=[]), ask(streaming)]
    assert all(request.get("stream") for request in llm.requests)

    told: list[str] = []
    llm.add(Fail(400, message="Unrecognized request argument supplied: stream"), Calls(CALLS, "Let me look."),
            JSON_ACTION)
    whole = client(llm, told)
    plain = [ask(whole, tools=[]), ask(whole)]
    assert [r.get("stream") for r in llm.requests[2:]] == [True, None, None]
    assert told == ["the endpoint does not take stream for gpt-4o: asking without it"]

    for one, other in zip(streamed, plain):
        assert (one.text, one.tool_calls, one.finish_reason) == (other.text, other.tool_calls, other.finish_reason)
    assert [(call.name, call.arguments) for call in streamed[0].tool_calls] == CALLS
    assert streamed[1].text == JSON_ACTION and plain[1].first_token_s is None


def test_a_stream_that_stops_without_its_end_is_asked_again_without_streaming(llm):
    told: list[str] = []
    llm.add(Stream(["half a rep"], done=False, finish=None), "the whole reply")
    completion = ask(client(llm, told))
    assert completion.text == "the whole reply"
    assert "stream" not in llm.requests[1] and "asking without streaming" in told[0]


def test_usage_missing_or_absurd_is_counted_here(llm):
    told: list[str] = []
    model = client(llm, told)
    llm.add(Stream(["some", " words"], usage={"prompt_tokens": -5_000_000, "completion_tokens": 10 ** 12}),
            Stream(["some", " words"], usage=False), Stream(["some", " words"], usage=False))
    absurd, missing, again = ask(model), ask(model), ask(model)
    for completion in (absurd, missing, again):
        assert 10 < completion.prompt_tokens < 40 and 1 <= completion.completion_tokens <= 5
        assert 0 < completion.cost_usd < 0.001
    assert len(told) == 2 and "implausible" in told[0] and "no token usage" in told[1]  # each said once
    # counted with another model's tokenizer, a reply the server cut at its cap is still no longer than the cap
    llm.add(Stream(["word, " * 40], usage=False, finish="length"))
    assert ask(model, max_tokens=10).completion_tokens == 10


def test_a_reply_far_past_its_cap_is_not_read_to_the_end(llm):
    told: list[str] = []
    llm.add(Stream(["x" * 100] * 5000))
    completion = ask(client(llm, told), max_tokens=100)
    assert completion.finish_reason == "length" and len(completion.text) <= 100 * 32
    assert "more than the 100-token cap" in told[0]
    assert _wait_for(lambda: llm.disconnects == 1)


@pytest.mark.parametrize("body", [b'{"choices": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                                  b'{"choices": [{"message": {"content": "hi"}}], "pad": "' + b"x" * 5_000_000
                                  + b'"}'])
def test_a_nested_or_huge_body_is_a_bad_answer_not_a_crash(llm, body):
    llm.add(*[Raw(body)] * 5)
    with pytest.raises(ModelUnavailable, match="not valid JSON|larger than"):
        ask(client(llm), max_tokens=100)
    assert len(llm.requests) == 5


def test_a_generic_server_error_is_retried_five_times(llm):
    """Overloaded servers send the same bare 500 every time: retried as documented. Only an error that names the
    request ("roles must alternate", an unknown parameter) is given up on when it comes back the same."""
    llm.add(*[Fail(500, message="Internal Server Error")] * 4, "at last")
    assert ask(client(llm)).text == "at last" and len(llm.requests) == 5
    llm.add(*[Fail(500, message="Internal Server Error")] * 5)
    with pytest.raises(ModelUnavailable, match=r"HTTP 500.*gave up after 5 attempts"):
        ask(client(llm))
    llm.add(*[Fail(500, message="Conversation roles must alternate user/assistant")] * 5)
    with pytest.raises(ModelError, match="twice with the same error"):
        ask(client(llm))
    assert len(llm.requests) == 12


def test_the_spinner_counts_the_pieces_and_their_rate():
    now = time.monotonic()
    assert str(Flow(threading.get_ident(), now - 3)) == "3 s"  # nothing yet: the time waited
    assert str(Flow(threading.get_ident(), now - 12, pieces=212, first=now - 10)) == "212 tokens, 21/s"


# --- whole runs ----------------------------------------------------------------------------------------------------
def test_a_run_records_each_calls_speed_shows_it_and_replays_with_no_model(cli, llm, isolated):
    pieces = [JSON_ACTION[i:i + 2] for i in range(0, len(JSON_ACTION), 2)]  # a JSON action two characters a chunk
    done = json.dumps({"thought": "t", "command": "done", "args": {"answer": "listed"}})
    llm.add(Stream(pieces), Stream([done[i:i + 3] for i in range(0, len(done), 3)]))
    proc = cli("-y", "--protocol", "json", "list files")
    assert proc.returncode == 0 and proc.stdout.strip() == "listed", proc.stderr
    directory, result, trace = load_run(isolated.home)
    calls = [e for e in trace if e["type"] == "llm_call"]
    assert len(calls) == 2 and all(c["tokens_per_s"] > 0 and c["first_token_s"] >= 0 for c in calls)
    assert [e["command"] for e in trace if e["type"] == "action"] == ["execute_shell", "done"]
    shown = cli("show", directory.name)
    assert shown.returncode == 0 and shown.stdout.count("tokens/s") == 2, shown.stdout
    replayed = cli("replay", directory.name, "-y")
    assert replayed.returncode == 0 and "every observation matches the recording" in replayed.stdout, replayed.stderr
    assert len(llm.requests) == 2


def test_the_call_limit_stops_a_command_that_calls_the_model_many_times(cli, llm, isolated):
    (isolated.work / "long.txt").write_text("\n\n".join(f"Paragraph {i}. " + "Words about nothing much. " * 60
                                                        for i in range(200)))
    llm.responder = lambda request: "NOTHING RELEVANT" if request["messages"][0]["role"] != "system" else None
    llm.add(act("process_data", "What is the secret number?|long.txt"))
    proc = cli("-y", "--max-calls", "4", "find it")
    assert proc.returncode == 3 and "model call limit reached (4 calls)" in proc.stderr, proc.stderr
    assert len(llm.requests) == 4
    _, result, _ = load_run(isolated.home)
    assert result["status"] == "limit" and result["llm_calls"] == 4


def test_debug_into_a_file_writes_whole_lines_and_the_system_prompt_once(cli, llm, isolated):
    thought = "a long thought " + "that goes on and on " * 12  # far wider than 80 columns
    llm.add(act("execute_shell", "echo one", thought), act("done", "finished", thought))
    proc = cli("-y", "--debug", "two steps")
    assert proc.returncode == 0, proc.stderr
    system = llm.requests[0]["messages"][0]["content"]
    first_line = max(system.splitlines(), key=len)
    assert proc.stderr.count(first_line) == 1 and "(the system prompt printed above)" in proc.stderr
    assert thought.strip() in proc.stderr  # not folded at 80 columns, nor boxed
    directory, _, _ = load_run(isolated.home)
    shown = cli("show", directory.name, "--raw")  # the prompts kept in the trace, the system prompt once
    assert shown.returncode == 0 and shown.stdout.count(first_line) == 1, shown.stderr
    assert "(the system prompt shown above)" in shown.stdout and "[agent prompt · user]" in shown.stdout


def test_ctrl_c_during_a_streamed_reply_exits_130_saved_and_closes_the_connection(llm, isolated):
    llm.add(Stream([f"line {i}\n" for i in range(1000)], every=0.1))
    env = dict(os.environ, OPENAI_BASE_URL=llm.url, OPENAI_API_KEY="sk-test-key-123456", MINIAGI_MEMORY_SCOPE="off")
    process = subprocess.Popen([sys.executable, "-m", "miniagi", "--debug", "wait"], cwd=isolated.work, env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in process.stderr:  # --debug prints the raw reply a line at a time as it arrives
        if line.startswith("line 2"):
            break
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=180)
    assert process.returncode == 130
    _, result, _ = load_run(isolated.home)
    assert result["status"] == "interrupted"
    assert _wait_for(lambda: llm.disconnects == 1)


DEEP = "[" * 5000 + "]" * 5000  # past what a JSON parser follows


@pytest.mark.parametrize("protocol, nested, good", [
    ("json", '{"thought": "t", "command": "done", "args": {"answer": ' + DEEP + "}}",
     json.dumps({"thought": "t", "command": "done", "args": {"answer": "flat"}})),
    ("tools", Calls([("done", '{"answer": ' + DEEP + "}")]), Calls([("done", '{"answer": "flat"}')])),
])
def test_a_reply_nested_too_deeply_is_a_format_error_not_a_crash(cli, llm, isolated, protocol, nested, good):
    llm.add(nested, good)
    proc = cli("-y", "--protocol", protocol, "--max-reply-tokens", "8000", "answer")
    assert proc.returncode == 0 and proc.stdout.strip() == "flat", proc.stderr
    _, _, trace = load_run(isolated.home)
    (error,) = [e for e in trace if e["type"] == "format_error"]
    assert "nested too deeply" in error["error"] or "not valid JSON" in error["error"]
