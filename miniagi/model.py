"""The model behind one small interface: `complete(messages, model=...) -> Completion`.

`OpenAIModel` speaks to any OpenAI-compatible endpoint over HTTP (httpx: `EndpointClient` builds each request, the
reader below takes the answer as it streams), retrying rate limits, 5xx and dropped connections with bounded backoff.
It does not go through the `openai` package: importing that costs ~0.6 s of every start, and all it did for us was
build one POST and name the HTTP statuses. `ScriptedModel` answers from a list, for tests, replay and demos.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol, Union

from .config import ConfigError, Endpoint
from .retry import Backoff, retry_after

Message = dict  # {"role": "system" | "user" | "assistant" | "tool", "content": str, …}


@dataclass(frozen=True)
class ToolCall:
    """One native tool call of a reply: its id, the function's name and its arguments as the model wrote them."""

    id: str
    name: str
    arguments: str

    def to_json(self) -> dict:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    @classmethod
    def from_json(cls, data: dict) -> "ToolCall":
        return cls(str(data.get("id", "")), str(data.get("name", "")), str(data.get("arguments", "")))


@dataclass(frozen=True)
class Completion:
    text: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    latency_s: float
    finish_reason: str = "stop"  # "length": the reply was cut off at the token limit
    cached_tokens: int = 0  # prompt tokens the endpoint served from its prefix cache
    tool_calls: tuple[ToolCall, ...] = ()
    first_token_s: float | None = None  # streamed: from sending the request to the reply's first piece
    generation_s: float | None = None  # streamed: from the first piece to the end of the reply

    @property
    def tokens_per_s(self) -> float | None:
        return self.completion_tokens / self.generation_s if self.generation_s else None


class Model(Protocol):
    def complete(self, messages: list[Message], *, model: str, role: str = "agent", max_tokens: int | None = None,
                 stop: list[str] | None = None, **request: Any) -> Completion:
        """One chat completion; `role` (agent | summarizer | critic) says who is asking; `max_tokens` caps the
        reply and `stop` ends it early. `request` holds what the protocol adds: `tools`, `response_format` (a
        list of formats, most wanted first: the first the endpoint takes is used) and `temperature`; and
        `on_piece`, told each piece of the reply as it streams in (a model that does not stream never calls it)."""


class ModelUnavailable(Exception):
    """The endpoint could not be reached or kept failing after the retries; the run can be resumed later."""


class ModelRejected(ConfigError):
    """The endpoint refused the request outright (bad key, unknown model): a configuration problem."""


class ModelError(Exception):
    """The endpoint answered with an error that retrying will not fix."""


class BadResponse(Exception):
    """A 200 answer that is not a chat completion (an HTML error page from a proxy, a truncated body)."""


# USD per 1M tokens: (input, output, cached input — the prompt tokens the endpoint served from its prefix cache).
# Overridable with --prices FILE; unknown models cost 0.
PRICES: dict[str, tuple[float, float, float]] = {
    "gpt-5": (1.25, 10.0, 0.125),
    "gpt-5-mini": (0.25, 2.0, 0.025),
    "gpt-5-nano": (0.05, 0.40, 0.005),
    "gpt-4.1": (2.0, 8.0, 0.50),
    "gpt-4.1-mini": (0.40, 1.60, 0.10),
    "gpt-4.1-nano": (0.10, 0.40, 0.025),
    "gpt-4o": (2.50, 10.0, 1.25),
    "gpt-4o-mini": (0.15, 0.60, 0.075),
    "gpt-4-turbo": (10.0, 30.0, 10.0),
    "gpt-4": (30.0, 60.0, 30.0),
    "gpt-3.5-turbo": (0.50, 1.50, 0.50),
    "o1": (15.0, 60.0, 7.50),
    "o1-mini": (1.10, 4.40, 0.55),
    "o3": (2.0, 8.0, 0.50),
    "o3-mini": (1.10, 4.40, 0.55),
    "o4-mini": (1.10, 4.40, 0.275),
    "claude-sonnet-4": (3.0, 15.0, 0.30),
    "claude-3-5-haiku": (0.80, 4.0, 0.08),
    "deepseek-chat": (0.27, 1.10, 0.07),
}


class PriceTable:
    def __init__(self, overrides_file: str | None = None):
        self.prices = dict(PRICES)
        if overrides_file:
            self.prices.update(load_prices(overrides_file))

    def price(self, model: str) -> tuple[float, float, float]:
        """Exact name first, then the longest known prefix ("gpt-4o-mini-2024-07-18" → "gpt-4o-mini")."""
        bare = model.rsplit("/", 1)[-1]
        if bare in self.prices:
            return self.prices[bare]
        prefixes = [name for name in self.prices if bare.startswith(name + "-")]
        return self.prices[max(prefixes, key=len)] if prefixes else (0.0, 0.0, 0.0)

    def cost(self, model: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
        per_input, per_output, per_cached = self.price(model)
        cached = min(cached_tokens, prompt_tokens)
        return ((prompt_tokens - cached) * per_input + cached * per_cached
                + completion_tokens * per_output) / 1_000_000

    def ceiling(self, model: str, messages: list[Message], max_tokens: int, tools: list[dict] | None = None,
                exact: bool = True) -> float:
        """The most a call can cost: its prompt as counted here (tool schemas included), and a reply of
        max_tokens. Nothing is counted for a model that costs nothing. `exact=False`: a higher bound, known
        without the tokenizer (a token is at least a byte), enough when even that is within the limit."""
        if not any(self.price(model)):
            return 0.0
        from memory.tokens import counter_for

        counter = counter_for(model)
        schemas = (counter.count if exact else counter.most)(json.dumps(tools)) if tools else 0
        return self.cost(model, count_prompt_tokens(messages, model, exact) + schemas, max_tokens)

    def saved(self, model: str, cached_tokens: int) -> float:
        """What the cache saved: cached tokens at the input price less the cached price."""
        per_input, _, per_cached = self.price(model)
        return cached_tokens * (per_input - per_cached) / 1_000_000


def load_prices(path: str) -> dict[str, tuple[float, float, float]]:
    try:
        data = json.loads(Path(path).expanduser().read_text())
        prices = {}
        for name, entry in data.items():
            values = [float(value) for value in entry]
            if len(values) not in (2, 3):
                raise ValueError(f"{name}: give [input, output] or [input, output, cached input]")
            prices[str(name)] = (values[0], values[1], values[2] if len(values) == 3 else values[0])
        return prices
    except (OSError, ValueError, TypeError, IndexError, AttributeError) as exc:
        raise ConfigError(f"--prices {path}: expected a JSON object {{\"model\": [input, output, cached]}} "
                          f"in USD per 1M tokens, the cached price optional ({exc})") from None


def count_prompt_tokens(messages: list[Message], model: str, exact: bool = True) -> int:
    """The prompt's tokens; `exact=False`: a bound by bytes, known without the tokenizer."""
    from memory.context import message_text
    from memory.tokens import counter_for

    counter = counter_for(model)
    count = counter.count if exact else counter.most
    return sum(count(message_text(m)) + 4 for m in messages)


class StatusError(Exception):
    """The endpoint answered with an HTTP error status; `body` is its JSON (or text), `headers` its headers."""

    def __init__(self, status_code: int, body: Any, headers: Mapping[str, str]):
        self.status_code, self.body, self.headers = status_code, body, headers
        super().__init__(f"HTTP {status_code}" + (f": {body[:300]}" if isinstance(body, str) and body else ""))


ERROR_BODY_BYTES = 65_536  # what is read of an error answer: its message, not a proxy's whole error page


class EndpointClient:
    """The HTTP side of an OpenAI-compatible endpoint: its base URL and headers, and one httpx client whose
    connections are kept from one request to the next. Proxies are taken from the environment, as curl does."""

    def __init__(self, endpoint: Endpoint):
        import httpx

        from . import __version__

        self.base_url = (endpoint.base_url or "https://api.openai.com/v1").rstrip("/")
        # a local server needs no key; sending a placeholder keeps servers that want some Authorization content
        headers = {"Authorization": f"Bearer {endpoint.api_key or 'not-needed'}", "Accept": "application/json",
                   "User-Agent": f"miniagi/{__version__}"}
        for header, name in (("OpenAI-Organization", "OPENAI_ORG_ID"), ("OpenAI-Project", "OPENAI_PROJECT_ID")):
            if os.environ.get(name):
                headers[header] = os.environ[name]
        self.http = httpx.Client(headers=headers, follow_redirects=True, timeout=httpx.Timeout(120.0, connect=10.0))

    @contextmanager
    def stream(self, path: str, body: dict, timeout=None) -> Iterator:
        """POST `body` as JSON and yield the answer unread (an httpx response); an error status raises
        StatusError, a connection that fails raises httpx's error."""
        request = self.http.build_request("POST", self.base_url + path, content=json.dumps(body).encode(),
                                          headers={"Content-Type": "application/json"}, timeout=timeout)
        response = self.http.send(request, stream=True)
        try:
            if response.status_code >= 400:
                raise _status_error(response)
            yield response
        finally:
            response.close()

    def post(self, path: str, body: dict, timeout=None) -> dict:
        """POST `body` as JSON and return the JSON answer (a dict)."""
        with self.stream(path, body, timeout) as response:
            return _json_body(response.read())


def _status_error(response) -> StatusError:
    data = bytearray()
    try:
        for piece in response.iter_bytes():
            data += piece
            if len(data) >= ERROR_BODY_BYTES:
                break
    except Exception:  # the error's text is a courtesy: a connection that breaks while sending it loses only that
        pass
    text = bytes(data[:ERROR_BODY_BYTES]).decode("utf-8", "replace").strip()
    try:
        body: Any = json.loads(text)
    except ValueError:
        body = text
    return StatusError(response.status_code, body, response.headers)


class OpenAIModel:
    """Any OpenAI-compatible chat endpoint (OpenAI, Ollama, vLLM, llama.cpp server, LM Studio, gateways).

    Every request is streamed, so that `request_timeout_s` can mean the longest silence between two chunks (before
    the first one it also covers reading the prompt): a slow model that keeps sending is never cut, a silent one is
    caught. A deadline bounds the whole request (an endpoint trickling a byte at a time still ends), and reading
    stops once a reply runs past its cap. Leaving a stream early closes the connection, which makes llama.cpp's
    server and vLLM stop generating."""

    def __init__(self, endpoint: Endpoint, prices: PriceTable | None = None, *, backoff: Backoff = Backoff(),
                 request_timeout_s: float = 120.0, request_deadline_s: float | None = None, timeout_retries: int = 1,
                 on_retry: Callable[[str], None] | None = None):
        endpoint.check()
        self.endpoint = endpoint
        self.prices = prices or PriceTable()
        self.backoff = backoff
        self.retries = backoff.attempts - 1
        self.timeout_retries = timeout_retries  # a silent endpoint costs request_timeout_s per try: few tries
        self.request_timeout_s = request_timeout_s
        self.request_deadline_s = request_deadline_s  # None: scaled with each request's cap (request_deadline)
        self.on_retry = on_retry  # told about each wait, so a 10 s Retry-After does not look like a hang
        self._refused: dict[str, set[str]] = {}  # model → request parameters the endpoint rejected for it
        self._told: set[str] = set()  # what was said once already (a server that streams without usage)
        # one attempt per call: we retry ourselves (retry.py says why), so every attempt is bounded and visible
        self.client = EndpointClient(endpoint)

    def check_reachable(self, timeout_s: float = 5.0) -> None:
        """Fail fast, with one clear line, when nothing listens at the endpoint (no request is sent)."""
        import socket
        from urllib.parse import urlsplit

        problem = base_url_problem(self.endpoint.base_url)
        if problem:
            raise ConfigError(problem)
        url = urlsplit(self.endpoint.base_url or "https://api.openai.com/v1")
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            socket.create_connection((url.hostname or "", port), timeout=timeout_s).close()
        except OSError as exc:
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise ConfigError(f"cannot reach the model endpoint {url.geturl()} ({reason}): set OPENAI_BASE_URL to a "
                              f"running OpenAI-compatible server, or check the network") from None

    def served_models(self) -> list[str]:
        """The model names the endpoint says it serves (GET /models), or none when it does not say."""
        try:
            answer = self.client.http.get(self.client.base_url + "/models", timeout=5.0)
            data = answer.json().get("data") if answer.status_code == 200 else None
            return sorted(str(item["id"]) for item in data if isinstance(item, dict) and item.get("id"))
        except Exception:  # an endpoint without the list: the plain message stays
            return []

    def complete(self, messages: list[Message], *, model: str, role: str = "agent", max_tokens: int | None = None,
                 stop: list[str] | None = None, tools: list[dict] | None = None,
                 response_format: list[dict] | None = None, temperature: float | None = None,
                 on_piece: Callable[[str], None] | None = None) -> Completion:
        while True:
            options = self._options(model, max_tokens, stop, temperature)
            refused = self._refused.get(model, set())
            formats = [f for f in response_format or () if format_name(f) not in refused]
            if formats:
                options["response_format"] = formats[0]
            if tools:
                options["tools"] = tools
            try:
                return self._complete(messages, model, options, max_tokens or UNCAPPED_REPLY_TOKENS, on_piece)
            except BrokenStream as broken:
                self._refused.setdefault(model, set()).update(("stream", "stream_options"))
                self._tell(f"{broken} for {model}: asking without streaming")
            except ModelError as error:
                self._refusal(model, options, formats, str(error))

    def _refusal(self, model: str, options: dict, formats: list[dict], error: str) -> None:
        """Learn from a request the endpoint refused what to leave out next time; re-raise when nothing can be.
        A response_format it refuses is replaced by the next one wanted (in the end by plain text); a parameter it
        names (o-series models want max_completion_tokens and take no stop or temperature; some local servers
        reject either, or `stream`) is left out."""
        refused = self._refused.setdefault(model, set())
        named = [name for name in options if name not in ("tools", "response_format")
                 and re.search(rf"\b{name}\b", error)]
        if named:
            refused.update(named + (["stream_options"] if "stream" in named else []))
            self._tell(f"the endpoint does not take {', '.join(named)} for {model}: asking without it")
            return
        if "response_format" in options:
            refused.add(format_name(formats[0]))
            following = format_name(formats[1]) if len(formats) > 1 else "plain text"
            self._tell(f"the endpoint does not take response_format {format_name(formats[0])} for {model} "
                       f"({error[:120]}): asking with {following}")
            return
        if "tools" in options and re.search(r"\btools?\b|tool_choice|function", error, re.I):
            raise ModelRejected(f"the endpoint does not take tool calls for {model} ({error[:200]}): use "
                                "--protocol json or --protocol tags") from None
        raise ModelError(error) from None

    def _tell(self, text: str) -> None:
        if self.on_retry is not None:
            self.on_retry(text)

    def _tell_once(self, text: str) -> None:
        if text not in self._told:
            self._told.add(text)
            self._tell(text)

    def _options(self, model: str, max_tokens: int | None, stop: list[str] | None,
                 temperature: float | None = None) -> dict:
        refused = self._refused.get(model, set())
        options: dict = {}
        if "stream" not in refused:
            options["stream"] = True
            if "stream_options" not in refused:  # usage in the last chunk (OpenAI, vLLM, llama.cpp, Ollama)
                options["stream_options"] = {"include_usage": True}
        if max_tokens:
            if "max_tokens" not in refused:
                options["max_tokens"] = max_tokens
            elif "max_completion_tokens" not in refused:
                options["max_completion_tokens"] = max_tokens
        if stop and "stop" not in refused:
            options["stop"] = stop[:4]  # OpenAI takes at most four
        if temperature is not None and "temperature" not in refused:
            options["temperature"] = temperature
        return options

    def deadline(self, cap: int) -> float:
        """The most one request may take: --request-deadline, or the first-chunk allowance plus the cap at a slow
        floor rate."""
        return self.request_deadline_s or request_deadline(self.request_timeout_s, cap)

    def _complete(self, messages: list[Message], model: str, options: dict, cap: int,
                  on_piece: Callable[[str], None] | None) -> Completion:
        import httpx

        where = self.endpoint.base_url or "the OpenAI API"
        deadline_s = self.deadline(cap)
        silence = f"the model endpoint {where} sent nothing for {self.request_timeout_s:g} s (--request-timeout)"
        problem, timeouts, attempts, last_failure = "", 0, 0, None
        for attempt in range(self.retries + 1):
            attempts += 1
            started = time.monotonic()
            try:
                # between bytes, not in all: the wait for the answer's headers (llama.cpp sends them with the
                # first token) is bounded by the silence allowed; while reading, read_reply keeps the deadline
                timeout = httpx.Timeout(min(self.request_timeout_s, deadline_s),
                                        connect=min(10.0, self.request_timeout_s))
                with self.client.stream("/chat/completions", {"model": model, "messages": messages, **options},
                                        timeout) as response:
                    reply = read_reply(response, started, silence_s=self.request_timeout_s,
                                       deadline_s=deadline_s, cap=cap, on_piece=on_piece)
                return self._completion(reply, messages, model, options, cap, started)
            except StatusError as exc:
                if exc.status_code == 401:
                    raise ModelRejected(f"the endpoint {where} rejected the API key: set a valid OPENAI_API_KEY"
                                        ) from None
                if exc.status_code == 404:
                    served = self.served_models()
                    if served and model not in served:
                        raise ModelRejected(f"the endpoint {where} does not serve model {model!r}; it serves: "
                                            f"{', '.join(served[:20])}{' …' if len(served) > 20 else ''} — give one "
                                            f"with -m / MINIAGI_MODEL") from None
                    raise ModelRejected(f"the endpoint {where} does not know model {model!r} (or the URL is wrong): "
                                        f"check --model / MINIAGI_MODEL and OPENAI_BASE_URL ({_error_text(exc)})"
                                        f"{_missing_v1(self.endpoint.base_url)}") from None
                if exc.status_code == 403:
                    raise ModelRejected(f"the endpoint {where} refused access to {model!r}: {_error_text(exc)}"
                                        ) from None
                failure = (exc.status_code, _error_text(exc))
                if exc.status_code not in (408, 409, 429) and exc.status_code < 500:
                    raise ModelError(f"the endpoint answered {exc.status_code}: {failure[1]}") from None
                if exc.status_code != 429 and failure == last_failure and names_the_request(failure[1], options):
                    # the chat template's "Conversation roles must alternate", a field it does not know: the
                    # request is at fault, and sending it a third time will not change the answer
                    raise ModelError(f"the endpoint answered {exc.status_code} twice with the same error: "
                                     f"{failure[1]}") from None
                last_failure = failure
                problem, error = _describe(exc, where), exc
            except (httpx.TimeoutException, Silent) as exc:  # a silent server costs request_timeout_s a try
                if time.monotonic() - started >= deadline_s:
                    problem = _past_deadline(where, deadline_s)
                    break
                problem, error = silence, exc
                timeouts += 1
                if timeouts > self.timeout_retries:
                    break
            except PastDeadline:  # a trickle would trickle again: not retried
                problem = _past_deadline(where, deadline_s)
                break
            except httpx.TransportError as exc:  # nothing listens, the connection broke before an answer
                if _tls_mismatch(exc):  # https:// to a server that speaks plain http: retrying cannot help
                    raise ModelRejected(f"the endpoint {where} does not speak TLS (https): a local server usually "
                                        f"wants http:// — set OPENAI_BASE_URL={_as_http(where)}") from None
                problem, error = _describe(exc, where), exc
            except Dropped as exc:
                problem, error = f"the connection to the model endpoint {where} dropped mid-reply ({exc})", exc
            except FailedMidReply as exc:
                problem, error = f"the model endpoint {where} failed mid-reply: {exc}", exc
            except BadResponse as exc:  # a 200 whose body is not a completion (not JSON, not UTF-8, too large)
                problem, error = str(exc), exc
            if attempt < self.retries:
                delay = self._delay(attempt, error)
                if self.on_retry is not None:
                    self.on_retry(f"{problem}; retrying in {delay:.0f} s (attempt {attempt + 2} of "
                                  f"{self.retries + 1})")
                time.sleep(delay)
        raise ModelUnavailable(f"{problem} (gave up after {attempts} attempt{'s' if attempts > 1 else ''})")

    def _completion(self, reply: "Reply", messages: list[Message], model: str, options: dict, cap: int,
                    started: float) -> Completion:
        ended = time.monotonic()
        where = self.endpoint.base_url or "the OpenAI API"
        if reply.streamed and not reply.done and reply.finish_reason is None and not reply.past_cap:
            raise BrokenStream("the endpoint's stream ended before the reply did (no finish_reason, no [DONE])")
        if reply.past_cap:
            self._tell(f"the model endpoint {where} sent more than the {cap}-token cap (max_tokens): stopped "
                       f"reading, and took the reply as cut off")
        calls = tuple(ToolCall(call["id"] or f"call_{i}", call["name"],
                               "".join(call["arguments"])[:cap * CHARS_PER_TOKEN_BOUND])
                      for i, call in enumerate(reply.calls[index] for index in sorted(reply.calls)))
        text = "".join(reply.text)[:cap * CHARS_PER_TOKEN_BOUND]
        prompt_tokens, completion_tokens = self._usage(reply, messages, model, options, cap,
                                                       text + "".join(call.arguments for call in calls))
        cached = min(cached_prompt_tokens(reply.usage, reply.timings), prompt_tokens)
        streamed = reply.streamed and reply.first_at is not None
        return Completion(text=text, model=reply.model or model, prompt_tokens=prompt_tokens,
                          completion_tokens=completion_tokens,
                          cost_usd=self.prices.cost(model, prompt_tokens, completion_tokens, cached),
                          latency_s=ended - started,
                          finish_reason="length" if reply.past_cap else reply.finish_reason or "stop",
                          cached_tokens=cached, tool_calls=calls,
                          first_token_s=reply.first_at - started if streamed else None,
                          generation_s=ended - reply.first_at if streamed else None)

    def _usage(self, reply: "Reply", messages: list[Message], model: str, options: dict, cap: int,
               text: str) -> tuple[int, int]:
        """The reply's (prompt, completion) tokens as the endpoint reports them, when they are plausible: some
        servers report none when streaming, some report nonsense (negative, or more than was sent or allowed).
        Otherwise counted here."""
        usage = reply.usage or {}
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        # a token stands for a byte of the request or more (its JSON, tool schemas included), plus the template's
        request_bytes = len(json.dumps([messages, options.get("tools")], ensure_ascii=False).encode())
        plausible = (_whole(prompt) and 0 < prompt <= request_bytes + 1000
                     and _whole(completion) and 0 <= completion <= cap + PAST_CAP_SLACK)
        if plausible and not reply.past_cap:
            return prompt, completion
        if not reply.past_cap:
            self._tell_once(f"the model endpoint reports no token usage for {model}: counting tokens here" if not usage
                            else f"the model endpoint reported implausible token usage for {model} (prompt {prompt!r},"
                                 f" completion {completion!r}): counting tokens here")
        from memory.tokens import counter_for

        # a reply that ended by itself kept to its cap, whatever a tokenizer of another model counts
        completion = counter_for(model).count(text)
        return count_prompt_tokens(messages, model), completion if reply.past_cap else min(completion, cap)

    def _delay(self, attempt: int, exc: Exception) -> float:
        return self.backoff.delay(attempt, retry_after(getattr(exc, "headers", None)))


# --- reading a reply ------------------------------------------------------------------------------------------------
SLOW_FLOOR_TOKENS_PER_S = 2.0  # the default deadline lets a reply arrive this slowly (a large model on a CPU)
UNCAPPED_REPLY_TOKENS = 16_384  # a request without max_tokens is bounded as if it had this cap
PAST_CAP_SLACK = 16  # chunks past max_tokens before a reply is taken to ignore its cap
CHARS_PER_TOKEN_BOUND = 32  # a reply's text longer than its cap × this is past any tokenizer's cap
BYTES_PER_TOKEN_BOUND = 1024  # a streamed chunk wraps each token in ~200 bytes of JSON


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


class CallPiece(str):
    """A piece of a streaming tool call's arguments, told with the name of the tool called (the first call's)."""

    tool: str

    def __new__(cls, text: str, tool: str) -> "CallPiece":
        piece = super().__new__(cls, text)
        piece.tool = tool
        return piece


@dataclass
class Reply:
    """What arrived of one reply, streamed or not, gathered into what a non-streamed reply would say."""

    streamed: bool
    text: list[str] = field(default_factory=list)
    length: int = 0  # characters of text and tool-call arguments so far
    calls: dict[int, dict] = field(default_factory=dict)  # index → {"id", "name", "arguments": [pieces]}
    finish_reason: str | None = None
    usage: dict | None = None
    timings: dict | None = None  # llama.cpp's
    model: str | None = None
    pieces: int = 0  # chunks that carried some of the reply
    first_at: float | None = None
    done: bool = False  # [DONE] came
    past_cap: bool = False  # reading stopped: the reply ran past its cap

    def take(self, chunk: dict, now: float, on_piece: Callable[[str], None] | None) -> None:
        """One chunk of a stream (`delta`s), or a whole non-streamed body (`message`)."""
        self.model = self.model or _text_or_none(chunk.get("model"))
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        if isinstance(chunk.get("timings"), dict):
            self.timings = chunk["timings"]
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict) or choice.get("index", 0) not in (0, None):
                continue
            delta = choice.get("delta") if self.streamed else choice.get("message")
            delta = delta if isinstance(delta, dict) else {}
            pieces = [_content(delta.get("content"))]
            self.text.append(pieces[0])
            thinking = _text_or_none(delta.get("reasoning_content") or delta.get("reasoning")) or ""
            calls = delta.get("tool_calls")
            for position, call in enumerate(calls if isinstance(calls, list) else ()):
                if isinstance(call, dict):
                    pieces.append(self._call(call, position))
            if any(pieces) or thinking:
                self.pieces += 1
                self.first_at = self.first_at or now
                self.length += sum(map(len, pieces))
                if on_piece is not None:
                    on_piece(CallPiece("".join(pieces), self.calls[min(self.calls)]["name"]) if len(pieces) > 1
                             else pieces[0])
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])

    def _call(self, call: dict, position: int) -> str:
        """A tool call's piece, put together as the OpenAI SDK does: by index, the arguments concatenated; the id
        and the name kept once (some servers repeat them in every piece)."""
        index = call.get("index", position)
        gathered = self.calls.setdefault(index if isinstance(index, int) else position,
                                         {"id": "", "name": "", "arguments": []})
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        gathered["id"] = gathered["id"] or _text_or_none(call.get("id")) or ""
        name = _text_or_none(function.get("name")) or ""
        if name and name != gathered["name"]:
            gathered["name"] += name
        arguments = function.get("arguments")
        if arguments is not None and not isinstance(arguments, str):  # some servers send the object itself
            arguments = json.dumps(arguments, ensure_ascii=False)
        if arguments:
            gathered["arguments"].append(arguments)
        return arguments or ""

    def over(self, cap: int) -> bool:
        return self.pieces > cap + PAST_CAP_SLACK or self.length > cap * CHARS_PER_TOKEN_BOUND


def read_reply(http, started: float, *, silence_s: float, deadline_s: float, cap: int,
               on_piece: Callable[[str], None] | None = None) -> Reply:
    """Read an answer as it arrives: server-sent events (a stream), or one JSON body (a server that does not
    stream). Raises Silent when no complete chunk came for `silence_s`, PastDeadline past `deadline_s` from
    `started`, Dropped when the connection breaks; stops at the end, or once the reply runs past `cap`."""
    import httpx

    streamed = "text/event-stream" in http.headers.get("content-type", "")
    reply, bound = Reply(streamed), cap * BYTES_PER_TOKEN_BOUND + 1_000_000
    buffer, event, size, last_event = bytearray(), [], 0, started
    try:
        for data in http.iter_bytes():
            now = time.monotonic()
            if not size and data.lstrip().startswith(b"data:"):  # events, though not said in the content type
                reply.streamed = streamed = True
            size += len(data)
            buffer += data
            if not streamed:
                if size > bound:
                    raise BadResponse(f"the model endpoint's answer is larger than {bound // 1_000_000} MB for a "
                                      f"{cap}-token reply: not read")
                if now - started > deadline_s:
                    raise PastDeadline()
                continue
            lines = buffer.split(b"\n")
            buffer = bytearray(lines.pop())
            for line in lines:
                line = line.rstrip(b"\r")
                if line.startswith(b"data:"):
                    event.append(line[5:].removeprefix(b" "))
                elif not line and event:  # an event is complete
                    last_event = now
                    _dispatch(reply, b"\n".join(event), now, on_piece)
                    event = []
                elif line.startswith(b":"):  # a comment: a proxy's keep-alive
                    last_event = now
            if reply.done:  # the body's end follows (read, so that the connection is kept for the next request)
                continue
            if reply.over(cap) or size > bound:
                reply.past_cap = True
                return reply
            if now - started > deadline_s:
                raise PastDeadline()
            if now - last_event > silence_s:  # bytes, but no chunk: a trickle
                raise Silent()
    except httpx.TimeoutException:
        if not reply.done:  # after [DONE], a server that holds the connection open has still answered
            raise Silent() from None
    except httpx.TransportError as exc:
        if not reply.done:
            raise Dropped(str(exc) or type(exc).__name__) from None
    if not streamed:
        body = _json_body(bytes(buffer))
        if not isinstance(body.get("choices"), list):
            raise BadResponse(f"the model endpoint answered 200 with a body that is not a chat completion "
                              f"({bytes(buffer[:80])!r})")
        reply.take(body, time.monotonic(), on_piece)
        reply.past_cap = reply.over(cap)
    elif event:  # the last event, when the stream ends without its blank line
        _dispatch(reply, b"\n".join(event), time.monotonic(), on_piece)
    return reply


def _dispatch(reply: Reply, data: bytes, now: float, on_piece) -> None:
    if data.strip() == b"[DONE]":
        reply.done = True
        return
    chunk = _json_body(data)
    if "error" in chunk and not chunk.get("choices"):
        error = chunk["error"]
        raise FailedMidReply(str(error.get("message") if isinstance(error, dict) else error)[:300])
    reply.take(chunk, now, on_piece)


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


def _content(value) -> str:
    """A message's text: a string, or the text parts of a list of parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(part.get("text") or "" for part in value if isinstance(part, dict)
                       and isinstance(part.get("text"), str))
    return ""


def _text_or_none(value) -> str | None:
    return value if isinstance(value, str) else None


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _past_deadline(where: str, deadline_s: float) -> str:
    return (f"the model endpoint {where} did not finish its reply within {deadline_s:g} s (the request deadline, "
            f"--request-deadline)")


def names_the_request(error: str, options: dict) -> bool:
    """A server error that names something of the request (the chat template's role rule, a field or parameter it
    does not know) comes back the same however often the request is sent; a bare 500 may not."""
    names = "|".join(re.escape(name) for name in [*options, "messages", "schema", "template"])
    return bool(re.search(rf"roles? must alternate|\b(?:unknown|unsupported|unrecognized|invalid) "
                          rf"(?:field|parameter|argument|key)|\b(?:{names})\b", error, re.I))


def format_name(response_format: dict) -> str:
    """json_schema, json_object+schema (llama.cpp's own way to constrain) or json_object."""
    kind = str(response_format.get("type", "?"))
    return kind + ("+schema" if "schema" in response_format else "")


def cached_prompt_tokens(usage: dict | None, timings: dict | None = None) -> int:
    """Prompt tokens served from the endpoint's cache, as each kind of server reports them: OpenAI, vLLM and
    llama.cpp (usage.prompt_tokens_details.cached_tokens), DeepSeek (usage.prompt_cache_hit_tokens),
    Anthropic-style gateways (usage.cache_read_input_tokens), llama.cpp's own timings (timings.cache_n)."""
    usage = usage if isinstance(usage, dict) else {}
    details = usage.get("prompt_tokens_details")
    candidates = [details.get("cached_tokens") if isinstance(details, dict) else None,
                  usage.get("prompt_cache_hit_tokens"), usage.get("cache_read_input_tokens"),
                  timings.get("cache_n") if isinstance(timings, dict) else None]
    for value in candidates:
        if _whole(value) and value > 0:
            return value
    return 0


def _error_text(exc: Exception) -> str:
    """What an error answer says: OpenAI's {"error": {"message"}}, Ollama's {"error": "..."}, a {"detail"} or
    {"message"}, other JSON as it is, or the text of the answer (a proxy's error page)."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):  # on one line: llama.cpp's server puts a whole validation report in its message
        for inner in (body.get("error"), body):
            if isinstance(inner, dict):
                said = inner.get("message") or inner.get("detail")
                if isinstance(said, str) and said.strip():
                    return " ".join(said.split())[:500]
            elif isinstance(inner, str) and inner.strip():
                return " ".join(inner.split())[:500]
        return json.dumps(body)[:300]
    if isinstance(body, str) and body:
        return " ".join(body.split())[:300]
    if isinstance(exc, StatusError):
        return f"HTTP {exc.status_code}"
    return str(exc)


def _tls_mismatch(exc: BaseException) -> bool:
    """Whether a connection failed in the TLS handshake because the server answered in plain text."""
    import ssl

    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, ssl.SSLError) and any(word in str(exc) for word in ("WRONG_VERSION_NUMBER",
                                                                               "record layer failure",
                                                                               "PACKET_LENGTH_TOO_LONG")):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _as_http(url: str) -> str:
    return "http://" + url.split("://", 1)[1] if url.startswith("https://") else url


def base_url_problem(base_url: str | None) -> str:
    """What is wrong with a base URL as written, with the fix ("" when nothing is seen): no http:// (the host
    would be looked up as "localhost:11434" and not found), or the whole /chat/completions path pasted in."""
    if not base_url:
        return ""
    url = base_url.strip()
    if "://" not in url:
        return (f"OPENAI_BASE_URL {url!r} has no scheme: write it with http:// (a local server) or https://, "
                f"e.g. OPENAI_BASE_URL=http://{url}")
    for tail in ("/chat/completions", "/completions", "/chat"):
        if url.rstrip("/").endswith(tail):
            base = url.rstrip("/")[:-len(tail)]
            return (f"OPENAI_BASE_URL {url!r} is a request path, not the base: miniagi adds {tail}; set "
                    f"OPENAI_BASE_URL={base}")
    return ""


def _missing_v1(base_url: str | None) -> str:
    """A base URL with no path usually lacks the /v1 that OpenAI-compatible servers serve under."""
    from urllib.parse import urlsplit

    if not base_url:
        return ""
    parts = urlsplit(base_url)
    if parts.path.rstrip("/") not in ("",):
        return ""
    return f"; most servers answer under /v1: try OPENAI_BASE_URL={base_url.rstrip('/')}/v1"


def _describe(exc: Exception, where: str) -> str:
    import httpx

    if isinstance(exc, httpx.TimeoutException):
        return f"the model endpoint {where} timed out"
    if isinstance(exc, httpx.TransportError):
        return f"cannot reach the model endpoint {where}: check OPENAI_BASE_URL and that the server is running"
    status = getattr(exc, "status_code", "?")
    return f"the model endpoint {where} kept failing (HTTP {status}: {_error_text(exc)})"


ScriptedReply = Union[str, Exception, Callable[[list[Message]], str]]


class ScriptExhausted(ModelUnavailable):
    """A ScriptedModel was asked for more replies than it was given."""


class ScriptedModel:
    """Answers from a list, in order: a string, a Completion (with tool calls), an exception to raise, or a function
    of the messages.

    Used by tests, by `miniagi replay` and for trying the agent with no API key.
    """

    def __init__(self, replies: Iterable[ScriptedReply], prices: PriceTable | None = None):
        self.replies = list(replies)
        self.prices = prices or PriceTable()
        self.calls: list[list[Message]] = []
        self._taking = threading.Lock()

    def complete(self, messages: list[Message], *, model: str, role: str = "agent", max_tokens: int | None = None,
                 stop: list[str] | None = None, **request: Any) -> Completion:
        with self._taking:  # a summary may be asked for in a thread of its own
            if len(self.calls) >= len(self.replies):
                raise ScriptExhausted(f"the scripted model has no reply left for call {len(self.calls) + 1}")
            reply = self.replies[len(self.calls)]
            self.calls.append(messages)
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, Completion):
            return reply
        return local_completion(messages, model, reply(messages) if callable(reply) else reply, self.prices)


def local_completion(messages: list[Message], model: str, text: str, prices: PriceTable | None = None,
                     tool_calls: tuple[ToolCall, ...] = ()) -> Completion:
    """A completion made here rather than by an endpoint (scripted, replayed): tokens counted as the model would,
    priced by the table when one is given, else free."""
    from memory.tokens import counter_for

    prompt_tokens = count_prompt_tokens(messages, model)
    completion_tokens = counter_for(model).count(text)
    cost = prices.cost(model, prompt_tokens, completion_tokens) if prices else 0.0
    return Completion(text=text, model=model, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                      cost_usd=cost, latency_s=0.0, tool_calls=tool_calls)
