"""The SDK's client: `openai.OpenAI` (or `openai.AzureOpenAI` when Azure is configured), with the bounds a hostile
or broken endpoint needs, and a reply read from it into one shape, streamed or not.

The SDK builds and sends each request, names the HTTP status errors, parses the server-sent events and puts a
streamed reply's pieces (its text, its tool calls) together. What is added here: its HTTP client (the SDK's own
httpx2) follows no redirect, so no key is sent on to another host; every answer's body passes through `Guard`, which
bounds its size, the request's total time, and the silence between two complete events (a trickle of bytes is not a
reply); an error answer is read only as far as its message. The SDK's own retries are off (`max_retries=0`): one
retry policy, miniagi's (retry.py, in endpoint.py), wraps each attempt.

Importing the SDK takes ~0.4 s: `preload()` starts that import in a thread at the CLI's start, while the settings,
the .env and the run's directory are being prepared; `load_sdk()` imports it without the async transports it would
load too when they are installed, and without the packages that import every type of every API (DEFERRED_PACKAGES).
"""

from __future__ import annotations

import json
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from .config import Endpoint

ERROR_BODY_BYTES = 65_536  # what is read of an error answer: its message, not a proxy's whole error page
OTHER_BODY_BYTES = 64_000_000  # an answer read with no call limits set (embeddings)
SLOW_FLOOR_TOKENS_PER_S = 2.0  # the default deadline lets a reply arrive this slowly (a large model on a CPU)
UNCAPPED_REPLY_TOKENS = 16_384  # a request without max_tokens is bounded as if it had this cap
PAST_CAP_SLACK = 16  # chunks past max_tokens before a reply is taken to ignore its cap
CHARS_PER_TOKEN_BOUND = 32  # a reply's text longer than its cap × this is past any tokenizer's cap
BYTES_PER_TOKEN_BOUND = 1024  # a streamed chunk wraps each token in ~200 bytes of JSON

# imported by the SDK's modules when installed, for async clients the sync one never uses: aiohttp (the SDK's
# optional aiohttp transport; chromadb's kubernetes client installs it) and trio (httpcore2's locks under trio;
# selenium installs it). Left out, the SDK's import takes ~0.1 s less CPU and ~11 MB less memory at every start.
ASYNC_ONLY = ("aiohttp", "trio")
# packages of the SDK whose __init__ imports every type of an API (~400 pydantic models: Responses, evals, graders,
# batches…) though the modules the client needs import only a few of their submodules: each is made when imported
# without running its __init__, which runs when a name only it defines is first asked for. Left out, the SDK's import
# takes ~0.2 s less CPU and ~10 MB less memory; whatever asks for more gets the whole package, as without this.
DEFERRED_PACKAGES = ("openai.types", "openai.types.responses")

_preloading: threading.Thread | None = None
_loading = threading.Lock()


def preload() -> None:
    """Start importing the SDK in a thread (once); the first request waits for it only if it has not finished."""
    global _preloading
    if _preloading is None:
        _preloading = threading.Thread(target=_preload, name="miniagi-import-openai", daemon=True)
        _preloading.start()


def _preload() -> None:
    try:
        load_sdk()
    except Exception:  # said by the import on the critical path, if it fails there too
        pass


def load_sdk():
    """The `openai` module, imported once with what the first request uses (its HTTP transport included), and none
    of ASYNC_ONLY: while it imports, they read as not installed (a later import of them elsewhere works)."""
    with _loading:
        if "openai.lib.streaming" not in sys.modules:
            blocked = [name for name in ASYNC_ONLY if name not in sys.modules]
            sys.modules.update(dict.fromkeys(blocked))
            sys.meta_path.insert(0, _DeferredInit)
            try:
                import httpcore2  # noqa: F401 (httpx2's transport, imported by the first client made)
                import openai  # noqa: F401
                import openai.lib.streaming  # noqa: F401
            finally:
                sys.meta_path.remove(_DeferredInit)
                for name in blocked:
                    if name in sys.modules and sys.modules[name] is None:
                        del sys.modules[name]
    import openai

    return openai


class _DeferredInit:
    """A finder (on sys.meta_path while the SDK imports) for DEFERRED_PACKAGES: each package is found where it is,
    and its module made with its path (so its submodules import as usual) and, for its __init__, a module-level
    __getattr__ that runs it the first time a name the module lacks is asked for (`from openai.types import X`,
    `openai.types.X`, `import *`). Until then the package holds the submodules imported so far."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name not in DEFERRED_PACKAGES:
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None or not spec.submodule_search_locations:
            return spec
        spec.loader = _DeferredLoader(spec.loader)
        return spec


class _DeferredLoader:
    def __init__(self, loader) -> None:
        self.loader = loader  # the package's own (a SourceFileLoader), which runs its __init__

    def create_module(self, spec):
        return None  # the usual module

    def exec_module(self, module) -> None:
        lock, state = threading.RLock(), {"ran": False}

        def __getattr__(name: str):
            with lock:  # another thread waits for the whole __init__
                if not state["ran"]:  # the __init__'s own `from . import x` asks too: x is then a submodule
                    state["ran"] = True
                    module.__spec__.loader = module.__loader__ = self.loader
                    try:
                        self.loader.exec_module(module)
                    finally:
                        if module.__dict__.get("__getattr__") is __getattr__:
                            del module.__getattr__
            try:
                return module.__dict__[name]
            except KeyError:
                raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}") from None

        module.__getattr__ = __getattr__


def request_deadline(request_timeout_s: float, cap: int) -> float:
    """The default total time of one request: the first-chunk allowance (--request-timeout), then the reply's cap
    at a slow floor rate (2000 tokens: 120 + 1000 s)."""
    return request_timeout_s + cap / SLOW_FLOOR_TOKENS_PER_S


class Silent(Exception):
    """Nothing arrived, or nothing complete, for --request-timeout."""


class PastDeadline(Exception):
    """The request took longer than its deadline."""


class Dropped(Exception):
    """The connection broke mid-reply."""


class FailedMidReply(Exception):
    """The stream carried an error instead of the rest of the reply."""


class BrokenStream(Exception):
    """The stream ended without saying the reply was complete: the endpoint is asked without streaming."""


class BadResponse(Exception):
    """A 200 answer that is not a chat completion (an HTML error page from a proxy, a truncated body)."""


@dataclass
class Limits:
    """One request's bounds, read by the Guard of its answer."""

    started: float
    silence_s: float
    deadline_s: float
    bound: int  # bytes
    done: bool = False  # the stream's [DONE] went by


def _sync(stream):
    """`stream` as the httpx2 byte stream a response's body must be."""
    import httpx2

    class Bounded(httpx2.SyncByteStream):
        def __iter__(self):
            return iter(stream)

        def close(self) -> None:
            stream.close()

    return Bounded()


class Guard:
    """An answer's body as httpx2 reads it, bounded: its size, the request's deadline and, for a stream, the time
    between two complete events (a blank line: an event or a proxy's keep-alive comment)."""

    def __init__(self, inner, limits: Limits, streamed: bool):
        self.inner, self.limits, self.streamed = inner, limits, streamed
        self.size, self.last_event, self.tail = 0, limits.started, b"\n"  # the body begins a line

    def __iter__(self):
        limits = self.limits
        for data in self.inner:
            now = time.monotonic()
            self.size += len(data)
            if self.size > limits.bound:
                raise BadResponse(f"the model endpoint's answer is larger than {limits.bound // 1_000_000} MB: "
                                  f"not read")
            if now - limits.started > limits.deadline_s and not limits.done:
                raise PastDeadline()
            seen = self.tail + data
            if b"\n\n" in seen or b"\r\n\r\n" in seen:
                self.last_event = now
            if b"\ndata: [DONE]" in seen or b"\ndata:[DONE]" in seen:  # a line of its own: not text of a reply
                limits.done = True
            self.tail = seen[-16:]
            if self.streamed and now - self.last_event > limits.silence_s and not limits.done:
                raise Silent()  # bytes, but no event: a trickle
            yield data

    def close(self) -> None:
        self.inner.close()


class Capped:
    """An error answer's body: its first ERROR_BODY_BYTES, the rest left unread."""

    def __init__(self, inner):
        self.inner = inner

    def __iter__(self):
        size = 0
        try:
            for data in self.inner:
                yield data[:ERROR_BODY_BYTES - size]
                size += len(data)
                if size >= ERROR_BODY_BYTES:
                    return
        except Exception:  # the error's text is a courtesy: a connection that breaks while sending it loses only that
            return

    def close(self) -> None:
        self.inner.close()


class Inflated:
    """A gzip or deflate body, inflated a piece at a time (never more than 64 KB out of one piece in)."""

    def __init__(self, inner):
        import zlib

        self.inner, self.inflater = inner, zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip or zlib, by its header

    def __iter__(self):
        import zlib

        try:
            for data in self.inner:
                while data:
                    out = self.inflater.decompress(data, 65_536)
                    data = self.inflater.unconsumed_tail
                    if out:
                        yield out
            rest = self.inflater.flush()
            if rest:
                yield rest
        except zlib.error as exc:
            raise BadResponse(f"the model endpoint's compressed answer cannot be read ({exc})") from None

    def close(self) -> None:
        self.inner.close()


class EndpointClient:
    """The SDK's client for one endpoint, its connections kept from one request to the next. Proxies come from the
    environment (HTTPS_PROXY, NO_PROXY, as curl reads them); redirects are not followed."""

    def __init__(self, endpoint: Endpoint):
        self.endpoint = endpoint
        self.base_url = (endpoint.base_url or "https://api.openai.com/v1").rstrip("/")
        self._calls = threading.local()  # the current request's Limits, per thread (a summary has its own)
        self._sdk = None
        self._making = threading.Lock()

    def warm(self) -> None:
        """Make the SDK's client in a thread, so that the first request finds it made."""
        threading.Thread(target=self._warm, name="miniagi-openai-client", daemon=True).start()

    def _warm(self) -> None:
        try:
            self.sdk  # noqa: B018 (made, for the first request)
        except Exception:  # said by the first request, which makes it again
            pass

    @property
    def sdk(self):
        """The `openai` client, made on first use (importing the SDK is the slow part of starting)."""
        with self._making:
            if self._sdk is None:
                self._sdk = self._make()
            return self._sdk

    def _make(self):
        openai = load_sdk()
        import httpx2

        from . import __version__

        http = httpx2.Client(follow_redirects=False, timeout=httpx2.Timeout(120.0, connect=10.0),
                             event_hooks={"response": [self._guard]})
        # only what Inflated reads: a body is bounded as it is inflated, not after
        headers = {"User-Agent": f"miniagi/{__version__}", "Accept-Encoding": "gzip, deflate"}
        common = dict(max_retries=0, http_client=http, default_headers=headers)
        if self.endpoint.azure_endpoint:
            return openai.AzureOpenAI(azure_endpoint=self.endpoint.azure_endpoint,
                                      api_version=self.endpoint.api_version, api_key=self.endpoint.api_key, **common)
        # a local server needs no key; sending a placeholder keeps servers that want some Authorization content
        return openai.OpenAI(api_key=self.endpoint.api_key or "not-needed", base_url=self.base_url, **common)

    def _guard(self, response) -> None:
        encoding = response.headers.get("content-encoding", "").strip().lower()
        if encoding in ("gzip", "x-gzip", "deflate"):  # inflated here, so that what is bounded is what is read
            response.stream = _sync(Inflated(response.stream))
            del response.headers["content-encoding"]
        elif encoding not in ("", "identity"):
            response.close()
            raise BadResponse(f"the model endpoint answered in an encoding not asked for ({encoding[:40]})")
        if response.status_code >= 300:
            response.stream = _sync(Capped(response.stream))
            return
        limits = getattr(self._calls, "limits", None)
        if limits is None:
            limits = Limits(time.monotonic(), float("inf"), float("inf"), OTHER_BODY_BYTES)
        streamed = "text/event-stream" in response.headers.get("content-type", "")
        response.stream = _sync(Guard(response.stream, limits, streamed))

    def post(self, path: str, body: dict, timeout=None) -> dict:
        """POST `body` as JSON and return the JSON answer (a dict): for requests the SDK has no call for here."""
        answer = self.sdk.post(path, body=body, cast_to=object, options={"timeout": timeout} if timeout else {})
        if not isinstance(answer, dict):
            raise BadResponse(f"the model endpoint answered with a body that is not a JSON object ({str(answer)[:80]})")
        return answer

    def chat(self, body: dict, limits: Limits, timeout, cap: int,
             on_piece: Callable[[str], None] | None = None) -> "Reply":
        """One chat completion request, its answer read as it arrives: a stream of events, or one JSON body (a
        server that does not stream). Raises the SDK's errors (a status, a connection that fails, a timeout), and
        Silent, PastDeadline, Dropped, FailedMidReply or BadResponse; stops once the reply runs past `cap`."""
        openai = load_sdk()
        sdk = self.sdk
        self._calls.limits = limits
        try:
            # posted as the SDK's chat.completions.create posts it, less its pass over every message for fields to
            # rename (a chat request has none; ~3 ms a call at 25 messages); its stream yields each chunk as sent,
            # a dict (made into its pydantic types, a chunk cost ~40 µs more)
            events = sdk.post("/chat/completions", body=body, cast_to=object, stream=True,
                              stream_cls=openai.Stream[object], options={"timeout": timeout})
            http = events.response
            try:
                streamed = bool(body.get("stream"))
                if streamed and "text/event-stream" in http.headers.get("content-type", ""):
                    return _read_stream(events, limits, cap, on_piece)
                data = http.read()
                if streamed and data.lstrip().startswith(b"data:"):  # events, though not said in the content type
                    return _read_stream(events, limits, cap, on_piece)
                return _read_body(data, cap, on_piece)
            except (openai.APIConnectionError, openai.APITimeoutError) as exc:
                if isinstance(exc, openai.APITimeoutError) and not limits.done:
                    raise Silent() from None
                if not limits.done:
                    raise Dropped(str(exc.__cause__ or exc) or type(exc).__name__) from None
                raise
            finally:
                http.close()
        finally:
            self._calls.limits = None


@dataclass
class Reply:
    """What arrived of one reply, streamed or not, in the shape of a non-streamed one."""

    streamed: bool
    text: str = ""
    calls: list[tuple[str, str, str]] = field(default_factory=list)  # (id, name, arguments)
    finish_reason: str | None = None
    usage: dict | None = None
    timings: dict | None = None  # llama.cpp's
    model: str | None = None
    first_at: float | None = None
    done: bool = False  # the stream said its end ([DONE])
    past_cap: bool = False  # reading stopped: the reply ran past its cap

    def over(self, pieces: int, length: int, cap: int) -> bool:
        return pieces > cap + PAST_CAP_SLACK or length > cap * CHARS_PER_TOKEN_BOUND


def _read_stream(stream, limits: Limits, cap: int, on_piece) -> Reply:
    """The SDK's stream of chunks, each as the server sent it (a dict), the first choice's deltas put together by
    the SDK's own accumulate_delta (what its ChatCompletionStreamState does, less a pydantic snapshot dumped and
    rebuilt at every chunk) into the shape of a non-streamed completion, then read as one."""
    import openai

    reply = Reply(streamed=True)
    completion: dict = {}
    message: dict = {}
    pieces = length = 0
    seen: dict[int, list] = {}  # a tool call's index → [its id, its name] as first sent
    try:
        for chunk in stream:
            now = time.monotonic()
            try:
                text, called, thinking = _accumulate(chunk, seen, completion, message)
            except (TypeError, AttributeError, KeyError, IndexError, ValueError, AssertionError, RuntimeError) as exc:
                raise BadResponse(f"the model endpoint sent a chunk that is not a chat completion chunk "
                                  f"({type(exc).__name__}: {str(exc)[:80]})") from None
            if isinstance(chunk.get("timings"), dict):
                reply.timings = chunk["timings"]
            if text or called or thinking:
                pieces += 1
                reply.first_at = reply.first_at or now
                length += len(text) + len(called)
                if on_piece is not None:
                    if text or not called:
                        on_piece(text)
                    if called:  # told with the name of the tool called (the first call's), for the live terminal
                        on_piece(CallPiece(called, next((name for _, name in seen.values() if name), "")))
            if reply.over(pieces, length, cap):
                reply.past_cap = True
                break
    except openai.APIError as exc:  # an {"error": …} event in place of the rest of the reply
        if isinstance(exc, (openai.APIConnectionError, openai.APITimeoutError)):
            raise
        raise FailedMidReply(" ".join(str(exc.message).split())[:300]) from None
    except (ValueError, RecursionError) as exc:  # an event whose data is not JSON
        raise BadResponse(f"the model endpoint sent an event that is not valid JSON "
                          f"({type(exc).__name__}: {str(exc)[:80]})") from None
    finally:
        stream.close()
    reply.done = limits.done
    if not completion:
        return reply
    _take(reply, _as_completion(completion, message))
    return reply


def _accumulate(chunk, seen: dict[int, list], completion: dict, message: dict) -> tuple[str, str, bool]:
    """One chunk put into what the stream has put together so far (`completion`: model, usage, finish_reason; the
    first choice's `message`), with the SDK's accumulate_delta; what it added: (text, tool-call arguments, whether it
    carried reasoning)."""
    from openai.lib.streaming._deltas import accumulate_delta

    firsts = _as_openai_chunk(chunk, seen)
    # what this chunk adds, read before accumulate_delta keeps (and then extends) the chunk's own parts
    text = "".join(_content(delta.get("content")) for delta, _ in firsts)
    called = "".join(_call_arguments(delta) for delta, _ in firsts)
    thinking = any(_thinking(delta) for delta, _ in firsts)
    if not completion:
        completion["model"] = chunk.get("model")
    if chunk.get("usage") is not None:
        completion["usage"] = chunk["usage"]
    for delta, finish_reason in firsts:
        accumulate_delta(message, delta)
        if finish_reason:
            completion["finish_reason"] = finish_reason
    return text, called, thinking


def _as_completion(completion: dict, message: dict):
    """What a stream put together, as the SDK's type of a non-streamed completion."""
    from openai.types.chat import ChatCompletion

    choice = {"index": 0, "finish_reason": completion.get("finish_reason"), "message": message}
    return ChatCompletion.construct(model=completion.get("model"), usage=completion.get("usage"),
                                    choices=[choice] if message or choice["finish_reason"] else [])


def _read_body(data: bytes, cap: int, on_piece) -> Reply:
    """A whole (non-streamed) answer, read by the SDK's types."""
    from openai.types.chat import ChatCompletion

    body = _json_body(data)
    if not isinstance(body.get("choices"), list):
        raise BadResponse(f"the model endpoint answered 200 with a body that is not a chat completion "
                          f"({data[:80]!r})")
    body["choices"] = [c for c in body["choices"] if isinstance(c, dict) and c.get("index", 0) in (0, None)]
    reply = Reply(streamed=False)
    if isinstance(body.get("timings"), dict):
        reply.timings = body["timings"]
    _take(reply, ChatCompletion.construct(**body))
    if on_piece is not None and (reply.text or reply.calls):
        if reply.text:
            on_piece(reply.text)
        if reply.calls:
            on_piece(CallPiece("".join(arguments for _, _, arguments in reply.calls), reply.calls[0][1]))
    reply.past_cap = reply.over(0, len(reply.text) + sum(len(c[2]) for c in reply.calls), cap)
    return reply


def _take(reply: Reply, completion) -> None:
    """The first choice of a completion (the SDK's type) as a Reply; odd shapes a server sends read as nothing."""
    reply.model = completion.model if isinstance(completion.model, str) else None
    # a field of an odd type that a server sent is read as nothing; pydantic would say so on the terminal
    warnings.filterwarnings("ignore", message="Pydantic serializer warnings", category=UserWarning)
    usage = completion.usage
    reply.usage = usage.to_dict() if hasattr(usage, "to_dict") else usage if isinstance(usage, dict) else None
    choices = completion.choices if isinstance(completion.choices, list) else []
    if not choices:
        return
    choice = choices[0]
    reply.finish_reason = choice.finish_reason if isinstance(choice.finish_reason, str) else None
    message = choice.message
    reply.text = _content(getattr(message, "content", None))
    calls = getattr(message, "tool_calls", None)
    for position, call in enumerate(calls if isinstance(calls, list) else ()):
        function = getattr(call, "function", None)
        arguments = getattr(function, "arguments", None)
        if arguments is not None and not isinstance(arguments, str):  # some servers send the object itself
            arguments = json.dumps(arguments, ensure_ascii=False)
        name = getattr(function, "name", None)
        call_id = getattr(call, "id", None)
        reply.calls.append((call_id if isinstance(call_id, str) and call_id else f"call_{position}",
                            name if isinstance(name, str) else "", arguments or ""))


def _as_openai_chunk(chunk, seen: dict[int, list]) -> list[tuple[dict, str | None]]:
    """A chunk's first choice as OpenAI sends it, for the SDK's accumulate_delta: (its delta, its finish_reason)
    for each piece of it the chunk holds (none, or more than one). Some servers send a last choice with only its
    finish_reason (no delta), the text as a list of parts, other choices beside the first."""
    if not isinstance(chunk, dict) or "choices" not in chunk:
        raise TypeError(f"a chunk that is {type(chunk).__name__}" + (" without choices" * isinstance(chunk, dict)))
    choices = chunk["choices"] if isinstance(chunk["choices"], list) else []
    firsts = []
    for choice in choices:
        if not isinstance(choice, dict) or choice.get("index", 0) not in (0, None):
            continue
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            delta = {}
        if delta.get("content") is not None and not isinstance(delta["content"], str):
            delta["content"] = _content(delta["content"])
        _as_openai_sends(delta, seen)
        finish_reason = choice.get("finish_reason")
        firsts.append((delta, finish_reason if isinstance(finish_reason, str) else None))
    return firsts


def _as_openai_sends(delta: dict, seen: dict[int, list]) -> None:
    """A chunk's tool-call pieces as OpenAI sends them, for the SDK to put together: each with its index (its
    position when a server leaves it out), the id and the name once (some servers repeat them in every piece), the
    arguments as text (some send the object itself)."""
    calls = delta.get("tool_calls")
    if not isinstance(calls, list):
        delta.pop("tool_calls", None)
        return
    for position, call in enumerate(calls):
        if not isinstance(call, dict):
            raise TypeError(f"a tool call that is {type(call).__name__}")
        if not isinstance(call.get("index"), int) or isinstance(call["index"], bool):
            call["index"] = position
        function = call.get("function")
        if not isinstance(function, dict):
            call.pop("function", None)
            continue
        call["type"] = "function"  # what OpenAI sends, and what tells the SDK's types which call this is
        arguments = function.get("arguments")
        if arguments is not None and not isinstance(arguments, str):
            function["arguments"] = json.dumps(arguments, ensure_ascii=False)
        if not isinstance(call.get("id"), str):
            call.pop("id", None)
        if not isinstance(function.get("name"), str):
            function.pop("name", None)
        first = seen.setdefault(call["index"], [None, None])
        if first[0] and call.get("id"):
            del call["id"]
        first[0] = first[0] or call.get("id")
        if first[1] and function.get("name") == first[1]:
            del function["name"]
        first[1] = first[1] or function.get("name")


def _call_arguments(delta: dict) -> str:
    """What a chunk adds to the reply's tool calls: their argument pieces."""
    return "".join((call.get("function") or {}).get("arguments") or "" for call in delta.get("tool_calls") or ())


class CallPiece(str):
    """A piece of a streaming tool call's arguments, told with the name of the tool called (the first call's)."""

    tool: str

    def __new__(cls, text: str, tool: str) -> "CallPiece":
        piece = super().__new__(cls, text)
        piece.tool = tool
        return piece


def _thinking(delta: dict) -> bool:
    return any(isinstance(delta.get(name), str) and delta[name] for name in ("reasoning_content", "reasoning"))


def _json_body(data: bytes) -> dict:
    try:
        value = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, nested past what a parser follows
        raise BadResponse(f"the model endpoint answered with a body that is not valid JSON "
                          f"({type(exc).__name__}: {str(exc)[:80]})") from None
    if not isinstance(value, dict):
        raise BadResponse(f"the model endpoint answered 200 with a body that is not a chat completion "
                          f"({data[:80]!r})")
    return value


def _content(value: Any) -> str:
    """A message's text: a string, or the text parts of a list of parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(part.get("text") or "" for part in value if isinstance(part, dict)
                       and isinstance(part.get("text"), str))
    return ""
