"""A scripted OpenAI-compatible server on 127.0.0.1 (stdlib only). test_client.py checks that the official `openai`
client reads it as it reads OpenAI, and that miniagi's own client sends what the official one sends.

/v1/embeddings answers with word-hashing vectors. A request to /v1/chat/completions takes the script's next item:
  str                       → a normal completion with that text
  Fail(status, headers)     → an HTTP error (429, 500, 400, …)
  Hang(seconds)             → waits before answering with the next item (a slow model)
  callable(request) -> str  → computed from the request body (model, messages)
  Cut(text)                 → a completion with that text and finish_reason "length" (cut off at the cap)
  Raw(body)                 → a 200 answer with exactly these bytes (not JSON, not UTF-8: a broken proxy)
  Calls([(name, args)], text) → a reply with native tool calls (args: the arguments string, as sent)
  Stream([pieces], …)       → a streamed reply told piece by piece, with pauses, usage or not, [DONE] or not;
                              a Wait(event) among the pieces holds the rest back until the test sets the event
  Trickle(every, data)      → a 200 that sends `data` every `every` seconds and never ends
A request asking for `stream` gets each reply as server-sent events, the way OpenAI sends them: its text in
word-sized pieces, tool-call arguments a few characters at a time, usage in a last chunk when
`stream_options.include_usage` asks, then `data: [DONE]`. `disconnects` counts the replies the client walked away
from (the server noticed a closed connection while it was still sending).
A `responder(request)`, when given, is asked first; when it returns None the script answers. When the script runs
out the server answers 400 "script exhausted", so a test that asks too much fails loudly.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Fail:
    status: int
    headers: dict = field(default_factory=dict)
    message: str = "scripted failure"


@dataclass
class Hang:
    seconds: float


@dataclass
class Cut:
    text: str


@dataclass
class Raw:
    body: bytes


@dataclass
class Calls:
    calls: list  # (function name, arguments string)
    text: str = ""


@dataclass
class Stream:
    """Text pieces sent one chunk each ("" sends a chunk with empty content; a Hang among them is a silence),
    `every` seconds apart. `usage`, `done` and `finish`: whether the usage chunk (when asked for), the [DONE] line
    and a finish_reason end it (`usage` a dict: the usage reported, whatever was sent). `calls`: tool calls, each
    (name, [argument pieces])."""

    pieces: list
    every: float = 0.0
    usage: bool | dict = True
    done: bool = True
    finish: str | None = "stop"
    calls: list = field(default_factory=list)


@dataclass
class Wait:
    """Among a Stream's pieces: nothing more is sent until `event` is set (what the test waits to see first); a test
    that never sets it fails at `limit_s`, as the reply then ends there."""

    event: threading.Event
    limit_s: float = 60.0


@dataclass
class Trickle:
    every: float
    data: bytes = b" "
    limit_s: float = 120.0  # a test that forgets to give up still ends


def word_vector(text: str, dimensions: int = 64) -> list[float]:
    """A tiny deterministic embedding: hashed lower-case words (shared words, nearby vectors)."""
    vector = [0.0] * dimensions
    for word in text.lower().split():
        vector[int(hashlib.md5(word.strip(".,:;!?").encode()).hexdigest(), 16) % dimensions] += 1.0
    return vector


def rendered_prompt(request: dict) -> str:
    """The request's messages as one text, the way a chat template lays them out for the model."""
    return "".join(f"<|{m.get('role')}|>{m.get('content') or ''}<|end|>" for m in request.get("messages", []))


SUMMARIZER_MARKERS = ("running summary", "outgrew their room", "longer than its limit")  # fold, digest, condense


def summarizing(request: dict) -> bool:
    """Whether a request is the summarizer's (a fold, a digest of notes, a condensing): a prompt of its own (its
    first message), or, for a fold when the summarizer is the agent's model, the agent's prompt with the instruction
    at the end of its last message."""
    messages = request.get("messages") or [{}]
    return any(marker in str(message.get("content") or "") for message in (messages[0], messages[-1])
               for marker in SUMMARIZER_MARKERS)


def common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    low, high = 0, n
    while low < high:  # binary search on equal prefixes
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


class FakeLLM:
    """Like a server with a prompt cache of one slot per model (llama.cpp's): usage reports as cached the tokens
    a prompt shares at its beginning with the previous prompt for the same model, and `prefill_s_per_token`
    makes it spend that long on each token that is not cached (a local model's prompt reading)."""

    def __init__(self, script=(), responder=None, prefill_s_per_token: float = 0.0):
        self.script = list(script)
        self.responder = responder
        self.prefill_s_per_token = prefill_s_per_token
        self.last_prompt: dict[str, str] = {}  # model → its previous prompt (the cache slot)
        self.requests: list[dict] = []  # every chat request body received, failures included
        self.headers: list[dict] = []  # the headers of each of those requests (names lower-cased)
        self.disconnects = 0  # streamed replies the client closed before their end
        self.embedding_requests: list[dict] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.fake = self
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def add(self, *items) -> None:
        with self.lock:
            self.script.extend(items)

    def agent_requests(self) -> list[dict]:
        return [r for r in self.requests if r.get("messages")]

    def __enter__(self) -> "FakeLLM":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _next(self):
        with self.lock:
            return self.script.pop(0) if self.script else None


class Handler(BaseHTTPRequestHandler):
    """A request to the FakeLLM that serves it (its server's `fake`)."""

    @property
    def fake(self) -> FakeLLM:
        return self.server.fake

    def log_message(self, *args):
        pass

    def _send(self, status: int, body: dict, headers: dict | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, str(value))
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_GET(self):
        self._send(200, {"object": "list", "data": [{"id": "gpt-4o-mini", "object": "model"}]})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        request = json.loads(self.rfile.read(length) or b"{}")
        if self.path.endswith("/embeddings"):
            with self.fake.lock:
                self.fake.embedding_requests.append(request)
            inputs = request["input"] if isinstance(request["input"], list) else [request["input"]]
            self._send(200, {"object": "list", "model": request.get("model"),
                             "data": [{"object": "embedding", "index": i, "embedding": word_vector(text)}
                                      for i, text in enumerate(inputs)],
                             "usage": {"prompt_tokens": 1, "total_tokens": 1}})
            return
        with self.fake.lock:
            self.fake.requests.append(request)
            self.fake.headers.append({name.lower(): value for name, value in self.headers.items()})
        item = self.fake.responder(request) if self.fake.responder else None
        item = self.fake._next() if item is None else item
        while isinstance(item, Hang):
            time.sleep(item.seconds)
            item = self.fake._next()
        if item is None:
            self._send(400, {"error": {"message": "script exhausted", "type": "invalid_request_error"}})
            return
        if isinstance(item, Fail):
            self._send(item.status, {"error": {"message": item.message, "type": "server_error"}},
                       item.headers)
            return
        if isinstance(item, Raw):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(item.body)))
            self.end_headers()
            try:
                self.wfile.write(item.body)
            except (BrokenPipeError, ConnectionResetError):  # a client that stopped reading a huge body
                pass
            return
        if isinstance(item, Trickle):
            self._trickle(item)
            return
        item = item(request) if callable(item) and not isinstance(item, (Cut, Calls)) else item
        if isinstance(item, Stream):
            self._stream(request, item)
            return
        finish = "length" if isinstance(item, Cut) else "tool_calls" if isinstance(item, Calls) else "stop"
        text = item.text if isinstance(item, (Cut, Calls)) else item
        calls = item.calls if isinstance(item, Calls) else []
        if request.get("stream"):
            self._stream(request, Stream(re.findall(r"\s*\S+|\s+", text), finish=finish,
                                         calls=[(name, _pieces(arguments)) for name, arguments in calls]))
            return
        message: dict = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = [{"id": f"call_fake_{i}", "type": "function",
                                      "function": {"name": name, "arguments": arguments}}
                                     for i, (name, arguments) in enumerate(calls)]
        self._send(200, {
            "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
            "model": request.get("model", "fake"),
            "choices": [{"index": 0, "finish_reason": finish, "message": message}],
            "usage": self._usage(request, text),
        })

    def _usage(self, request: dict, text: str) -> dict:
        """Tokens as a character count guesses them; the prompt's start shared with the model's previous
        prompt reported as cached (after its prefill time, when one is set)."""
        prompt = rendered_prompt(request)
        with self.fake.lock:
            cached_chars = common_prefix(prompt, self.fake.last_prompt.get(request.get("model", ""), ""))
            self.fake.last_prompt[request.get("model", "")] = prompt
        prompt_chars = sum(len(m.get("content") or "") for m in request.get("messages", []))
        cached = min(cached_chars // 4, prompt_chars // 4)
        if self.fake.prefill_s_per_token:
            time.sleep((prompt_chars // 4 + 1 - cached) * self.fake.prefill_s_per_token)
        return {"prompt_tokens": prompt_chars // 4 + 1, "completion_tokens": len(text) // 4 + 1,
                "total_tokens": prompt_chars // 4 + len(text) // 4 + 2,
                "prompt_tokens_details": {"cached_tokens": cached}}

    def _start_events(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()

    def _event(self, data) -> bool:
        """One server-sent event; False once the client has gone."""
        try:
            self.wfile.write(b"data: " + (data if isinstance(data, bytes) else json.dumps(data).encode())
                             + b"\n\n")
            self.wfile.flush()
            return True
        except (BrokenPipeError, ConnectionResetError):
            with self.fake.lock:
                self.fake.disconnects += 1
            return False

    def _stream(self, request: dict, item: Stream) -> None:
        model = request.get("model", "fake")
        usage = self._usage(request, "".join(p for p in item.pieces if isinstance(p, str))
                            + "".join(p for _, pieces in item.calls for p in pieces if isinstance(p, str)))

        def chunk(delta: dict, finish: str | None = None) -> dict:
            return {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": int(time.time()),
                    "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        self._start_events()
        deltas: list = [{"role": "assistant", "content": ""}]
        for piece in item.pieces:
            deltas.append(piece if isinstance(piece, (Hang, Wait)) else {"content": piece})
        for i, (name, pieces) in enumerate(item.calls):
            deltas.append({"tool_calls": [{"index": i, "id": f"call_fake_{i}", "type": "function",
                                           "function": {"name": name, "arguments": ""}}]})
            deltas += [piece if isinstance(piece, (Hang, Wait)) else
                       {"tool_calls": [{"index": i, "function": {"arguments": piece}}]} for piece in pieces]
        for delta in deltas:
            if isinstance(delta, Hang):
                time.sleep(delta.seconds)
                continue
            if isinstance(delta, Wait):
                delta.event.wait(delta.limit_s)
                continue
            if not self._event(chunk(delta)):
                return
            if item.every:
                time.sleep(item.every)
        if item.finish and not self._event(chunk({}, item.finish)):
            return
        if item.usage and (request.get("stream_options") or {}).get("include_usage"):
            if not self._event({"id": "chatcmpl-fake", "object": "chat.completion.chunk",
                                "created": int(time.time()), "model": model, "choices": [],
                                "usage": item.usage if isinstance(item.usage, dict) else usage}):
                return
        if item.done:
            self._event(b"[DONE]")

    def _trickle(self, item: Trickle) -> None:
        self._start_events()
        started = time.monotonic()
        while time.monotonic() - started < item.limit_s:
            try:
                self.wfile.write(item.data)
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                with self.fake.lock:
                    self.fake.disconnects += 1
                return
            time.sleep(item.every)


def _pieces(text: str, size: int = 3) -> list[str]:
    """Tool-call arguments as a stream sends them: a few characters at a time."""
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]
