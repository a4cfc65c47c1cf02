"""miniagi's HTTP client against the reference: the official `openai` package reads the scripted server the way it
reads OpenAI (so the fake the other tests use is faithful), and miniagi's own client sends the request the official
one sends and names each error the way a user can act on."""

from __future__ import annotations

import json

import openai
import pytest

from miniagi.config import Endpoint
from miniagi.model import ModelError, ModelRejected, ModelUnavailable, OpenAIModel
from miniagi.retry import Backoff

from .fake_llm import Calls, Fail, Stream

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say «something»."}]


def official(llm) -> openai.OpenAI:
    return openai.OpenAI(api_key="sk-test-key-123456", base_url=llm.url, max_retries=0)


def ours(llm, **options) -> OpenAIModel:
    return OpenAIModel(Endpoint("sk-test-key-123456", llm.url), backoff=Backoff(attempts=2, base_s=0, cap_s=0),
                       **options)


def test_the_official_client_reads_the_scripted_server_as_it_reads_openai(llm):
    llm.add("A plain reply.", Stream(["Str", "eamed", " reply."]),
            Calls([("execute_shell", '{"command": "ls"}')]), Fail(500, message="overloaded"))
    client = official(llm)
    plain = client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert plain.choices[0].message.content == "A plain reply."
    assert plain.usage.prompt_tokens > 0
    pieces = client.chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(pieces)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Streamed reply."
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    called = client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    call = called.choices[0].message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("execute_shell", {"command": "ls"})
    with pytest.raises(openai.InternalServerError, match="overloaded"):
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    vectors = client.embeddings.create(model="fake-embed", input=["one", "two"])
    assert [item.index for item in vectors.data] == [0, 1] and len(vectors.data[0].embedding) > 10


def test_our_request_is_the_one_the_official_client_sends(llm):
    llm.add(Stream(["Same."]), Stream(["Same."]))
    options = {"max_tokens": 300, "temperature": 0.2, "stop": ["</c>"], "stream": True,
               "stream_options": {"include_usage": True}}
    official(llm).chat.completions.create(model="gpt-4o", messages=MESSAGES, **options).close()
    reply = ours(llm).complete(MESSAGES, model="gpt-4o", max_tokens=300, temperature=0.2, stop=["</c>"])
    assert reply.text == "Same."
    theirs, mine = llm.requests
    assert mine == theirs
    for header in ("authorization", "content-type"):
        assert llm.headers[1][header] == llm.headers[0][header]
    assert llm.headers[1]["user-agent"].startswith("miniagi/")


def test_a_local_server_without_a_key_gets_a_placeholder_and_openai_headers_come_from_the_environment(
        llm, monkeypatch):
    monkeypatch.setenv("OPENAI_ORG_ID", "org-example")
    llm.add("Fine.")
    OpenAIModel(Endpoint(None, llm.url)).complete(MESSAGES, model="local", max_tokens=50)
    assert llm.headers[0]["authorization"] == "Bearer not-needed"
    assert llm.headers[0]["openai-organization"] == "org-example"


@pytest.mark.parametrize("status, says", [
    (401, "rejected the API key: set a valid OPENAI_API_KEY"),
    (403, "refused access to 'gpt-4o': scripted failure"),
    (404, "does not serve model 'gpt-4o'; it serves: gpt-4o-mini — give one with -m"),  # GET /models lists them
])
def test_a_refusal_names_what_to_fix_and_is_not_retried(llm, status, says):
    llm.add(Fail(status))
    with pytest.raises(ModelRejected, match=says):
        ours(llm).complete(MESSAGES, model="gpt-4o", max_tokens=50)
    assert len(llm.requests) == 1


def test_error_bodies_of_every_shape_become_a_readable_message(llm):
    """OpenAI's {"error": {"message"}}, Ollama's {"error": "..."}, and a proxy's HTML page: the message says what
    the server said, in one line."""
    llm.add(Fail(400, message="This model's maximum context length is 8192 tokens"))
    with pytest.raises(ModelError, match="answered 400: This model.s maximum context length is 8192 tokens"):
        ours(llm).complete(MESSAGES, model="gpt-4o", max_tokens=50)
    llm.add(Fail(400, message="1 validation error:\n  {'loc': ('body', 'logprobs')}\n\n  File \"app.py\", line 3"))
    with pytest.raises(ModelError) as one_line:  # llama.cpp's server sends a whole report: said on one line
        ours(llm).complete(MESSAGES, model="gpt-4o", max_tokens=50)
    assert str(one_line.value).endswith("answered 400: 1 validation error: {'loc': ('body', 'logprobs')} "
                                        'File "app.py", line 3')
    ollama = '{"error": "model \\"llama9\\" not found, try pulling it first"}'
    page = "<html>\n<body>\n<h1>502 Bad Gateway</h1>\n</body>\n</html>"
    with _answering([(404, ollama), (502, page), (502, page)]) as url:
        model = OpenAIModel(Endpoint(None, url), backoff=Backoff(attempts=2, base_s=0, cap_s=0))
        with pytest.raises(ModelRejected, match='model \\\\?"llama9\\\\?" not found, try pulling it first'):
            model.complete(MESSAGES, model="llama9", max_tokens=50)
        with pytest.raises(ModelUnavailable, match=r"HTTP 502: <html> <body> <h1>502 Bad Gateway</h1>.*2 attempts"):
            model.complete(MESSAGES, model="llama9", max_tokens=50)


def test_a_rate_limit_waits_as_the_server_asks_and_then_succeeds(llm):
    told: list[str] = []
    llm.add(Fail(429, {"retry-after-ms": "10"}, message="Rate limit reached for gpt-4o"), "After the wait.")
    model = OpenAIModel(Endpoint("k", llm.url), backoff=Backoff(attempts=3, base_s=5, cap_s=5),
                        on_retry=told.append)
    assert model.complete(MESSAGES, model="gpt-4o", max_tokens=50).text == "After the wait."
    assert told == ["the model endpoint " + llm.url + " kept failing (HTTP 429: Rate limit reached for gpt-4o); "
                    "retrying in 0 s (attempt 2 of 3)"]


def _answering(answers: list[tuple[int, str]]):
    """A server that answers each request with the next (status, body) as it is: not JSON when the body is not."""
    import threading
    from contextlib import contextmanager
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status, body = answers.pop(0)
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json" if body.startswith("{") else "text/html")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    @contextmanager
    def serving():
        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/v1"
        finally:
            server.shutdown()
            server.server_close()

    return serving()
