"""miniagi's HTTP client against the reference: the official `openai` package reads the scripted server the way it
reads OpenAI (so the fake the other tests use is faithful), and miniagi's own client sends the request the official
one sends and names each error the way a user can act on."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler

import openai
import pytest

from miniagi.config import Endpoint
from miniagi.endpoint import OpenAIModel
from miniagi.model import ModelError, ModelRejected, ModelUnavailable
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


# --- through the SDK: what miniagi adds to it --------------------------------------------------------------------
def _events(*chunks) -> bytes:
    return b"".join(b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks) + b"data: [DONE]\n\n"


def test_tool_call_pieces_of_servers_unlike_openai_are_put_together_once(llm):
    """Some servers repeat a call's id and name in every piece, leave out its index, or send the arguments as an
    object: the SDK puts the pieces together, each said once."""
    from .fake_llm import Raw

    repeated = [{"choices": [{"index": 0, "finish_reason": None, "delta": {"tool_calls": [
        {"index": 0, "id": "c1", "type": "function", "function": {"name": "execute_shell", "arguments": piece}}]}}]}
        for piece in ['{"com', 'mand": ', '"ls"}']]
    bare = {"choices": [{"delta": {"tool_calls": [{"id": "c2", "function": {"name": "done",
                                                                            "arguments": {"answer": "ü|x"}}}]}}]}
    llm.add(Raw(_events(*repeated, {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})),
            Raw(_events(bare)))
    model = ours(llm)
    first, second = (model.complete(MESSAGES, model="gpt-4o", max_tokens=100) for _ in range(2))
    assert [(c.id, c.name, c.arguments) for c in first.tool_calls] == [("c1", "execute_shell", '{"command": "ls"}')]
    assert first.finish_reason == "tool_calls"
    assert [(c.id, c.name, json.loads(c.arguments)) for c in second.tool_calls] == [("c2", "done", {"answer": "ü|x"})]


class Quiet(BaseHTTPRequestHandler):
    """A test server's handler that logs nothing."""

    def log_message(self, *args):
        pass


def _serving(handler_class):
    import threading
    from contextlib import contextmanager
    from http.server import ThreadingHTTPServer

    @contextmanager
    def serving():
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler_class)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield server
        finally:
            server.shutdown()
            server.server_close()

    return serving()


def test_a_redirect_is_not_followed_so_the_key_reaches_no_other_host(llm):

    seen: list[dict] = []

    class Elsewhere(Quiet):
        def do_POST(self):
            seen.append(dict(self.headers))
            self.send_response(200)
            self.end_headers()

    with _serving(Elsewhere) as elsewhere:
        target = f"http://localhost:{elsewhere.server_address[1]}/v1/chat/completions"

        class Redirecting(Quiet):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(307)
                self.send_header("Location", target)
                self.send_header("Content-Length", "0")
                self.end_headers()

        with _serving(Redirecting) as redirecting:
            url = f"http://127.0.0.1:{redirecting.server_address[1]}/v1"
            with pytest.raises(ModelRejected, match=f"redirects to {target} .*not followed"):
                OpenAIModel(Endpoint("sk-secret-key-987654", url)).complete(MESSAGES, model="gpt-4o", max_tokens=9)
    assert seen == []


def test_an_error_page_is_read_only_as_far_as_its_message(llm):
    """A proxy answering 502 with an endless page: the message is its beginning, and the rest is never read."""

    written: list[int] = []

    class Endless(Quiet):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(502)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            sent = 0
            try:
                self.wfile.write(b"<html><h1>502 Bad Gateway</h1>")
                while sent < 500_000_000:
                    self.wfile.write(b"<p>" + b"x" * 65_536 + b"</p>")
                    sent += 65_543
            except OSError:
                pass
            written.append(sent)

    with _serving(Endless) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        model = OpenAIModel(Endpoint("k", url), backoff=Backoff(attempts=2, base_s=0, cap_s=0))
        with pytest.raises(ModelUnavailable, match=r"HTTP 502: <html><h1>502 Bad Gateway</h1><p>xxx.*2 attempts"):
            model.complete(MESSAGES, model="gpt-4o", max_tokens=9)
        from .test_end_to_end import _wait_for

        assert _wait_for(lambda: len(written) == 2)
    assert max(written) < 50_000_000  # the connection was closed after the message, not read to the end


def _forward_proxy(upstream: str, through: list[str]):
    """An HTTP proxy that takes absolute-URL requests, as clients send them to a proxy, and sends them on to
    `upstream` whatever host they name (the named host does not exist)."""
    import urllib.request
    from urllib.parse import urlsplit

    class Proxy(Quiet):
        def do_POST(self):
            through.append(self.path)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "proxy-connection")}
            request = urllib.request.Request(upstream + urlsplit(self.path).path.removeprefix("/v1"), data=body,
                                             headers=headers, method="POST")
            with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request) as answer:
                data = answer.read()
                self.send_response(answer.status)
                self.send_header("Content-Type", answer.headers.get("Content-Type", "application/json"))
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

    return _serving(Proxy)


def test_requests_and_the_reachability_check_go_through_the_proxy_the_environment_names(llm, monkeypatch):
    from miniagi.config import ConfigError

    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    through: list[str] = []
    llm.add(Stream(["Through", " the proxy."]))
    with _forward_proxy(llm.url, through) as proxy:
        address = f"http://127.0.0.1:{proxy.server_address[1]}"
        monkeypatch.setenv("HTTP_PROXY", address)
        monkeypatch.setenv("http_proxy", address)
        model = OpenAIModel(Endpoint("k", "http://model.invalid/v1"))
        model.check_reachable()  # model.invalid has no address: the proxy is what must be reachable
        assert model.complete(MESSAGES, model="gpt-4o", max_tokens=50).text == "Through the proxy."
    assert through == ["http://model.invalid/v1/chat/completions"]
    closed = f"http://127.0.0.1:{proxy.server_address[1]}"  # nothing listens there any more
    monkeypatch.setenv("HTTPS_PROXY", closed)
    monkeypatch.setenv("https_proxy", closed)
    with pytest.raises(ConfigError, match=f"cannot reach the proxy {closed} for the model endpoint "
                                          f"https://api.example.com/v1"):
        OpenAIModel(Endpoint("k", "https://api.example.com/v1")).check_reachable(timeout_s=2)


def test_azure_is_asked_through_the_sdks_azure_client(llm):
    from miniagi.config import ConfigError

    environ = {"AZURE_OPENAI_ENDPOINT": llm.url.removesuffix("/v1"), "AZURE_OPENAI_API_KEY": "azure-key-123",
               "OPENAI_API_VERSION": "2024-10-21"}
    endpoint = Endpoint.from_environment(environ, dotenv={})
    llm.add(Stream(["From", " Azure."]))
    assert OpenAIModel(endpoint).complete(MESSAGES, model="my-deployment", max_tokens=50).text == "From Azure."
    assert llm.headers[0]["api-key"] == "azure-key-123" and "authorization" not in llm.headers[0]
    with pytest.raises(ConfigError, match="set AZURE_OPENAI_API_KEY and OPENAI_API_VERSION"):
        Endpoint.from_environment({"AZURE_OPENAI_ENDPOINT": "https://x.openai.azure.com"}, dotenv={}).check()


def test_a_reply_that_says_done_in_its_text_is_not_taken_for_the_streams_end(llm):
    """Only a `data: [DONE]` line ends a stream: a reply whose text holds "[DONE]" and then stops short is broken,
    and is asked for again without streaming."""
    from .fake_llm import Raw

    cut = b'data: {"choices": [{"index": 0, "delta": {"content": "data: [DONE] is how it ends"}}]}\n\n'
    llm.add(Raw(cut), "The whole reply.")
    told: list[str] = []
    reply = ours(llm, on_retry=told.append).complete(MESSAGES, model="gpt-4o", max_tokens=50)
    assert reply.text == "The whole reply." and "asking without streaming" in told[0]


def test_a_compressed_answer_is_bounded_as_it_is_inflated(llm):
    """gzip is read, and its size bounded as it inflates: a small compressed body that would inflate past the
    bound (a "zip bomb") is a bad answer, not memory spent."""
    import gzip

    reply = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Packed."},
                          "finish_reason": "stop"}], "usage": {"prompt_tokens": 20, "completion_tokens": 2}}
    bomb = dict(reply, pad="x" * 200_000_000)
    bodies = [gzip.compress(json.dumps(body).encode()) for body in (reply, bomb, bomb)]
    assert len(bodies[1]) < 1_000_000

    class Compressing(Quiet):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            data = bodies.pop(0)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            try:
                self.wfile.write(data)
            except OSError:
                pass

    with _serving(Compressing) as server:
        model = OpenAIModel(Endpoint("k", f"http://127.0.0.1:{server.server_address[1]}/v1"),
                            backoff=Backoff(attempts=2, base_s=0, cap_s=0))
        assert model.complete(MESSAGES, model="gpt-4o", max_tokens=50).text == "Packed."
        with pytest.raises(ModelUnavailable, match="larger than 1 MB"):
            model.complete(MESSAGES, model="gpt-4o", max_tokens=50)


def test_chunks_of_odd_shapes_read_as_openai_would_have_sent_them(llm, capfd):
    """A last choice with only its finish_reason, a null delta, text as a list of parts, a second choice, a field of
    the wrong type: read as OpenAI's shape, quietly (no warning on the terminal)."""
    from .fake_llm import Raw

    def chunk(**choice):
        return {"choices": [{"index": 0, **choice}]}

    llm.add(Raw(_events(chunk(delta=None), chunk(delta={"content": [{"type": "text", "text": "In "}]}),
                        {"choices": [{"index": 1, "delta": {"content": "NOT THIS"}},
                                     {"index": 0, "delta": {"content": "parts.", "role": 7}}]},
                        chunk(finish_reason="stop"))))
    reply = ours(llm).complete(MESSAGES, model="gpt-4o", max_tokens=50)
    assert (reply.text, reply.finish_reason) == ("In parts.", "stop") and len(llm.requests) == 1
    assert "Warning" not in capfd.readouterr().err
