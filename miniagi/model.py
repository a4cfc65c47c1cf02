"""The model behind one small interface: `complete(messages, model=...) -> Completion`.

`OpenAIModel` speaks to any OpenAI-compatible endpoint through the `openai` package, retrying rate limits, 5xx and
dropped connections with bounded backoff. `ScriptedModel` answers from a list, for tests, replay and demos.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, Union

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


class Model(Protocol):
    def complete(self, messages: list[Message], *, model: str, role: str = "agent", max_tokens: int | None = None,
                 stop: list[str] | None = None, **request: Any) -> Completion:
        """One chat completion; `role` (agent | summarizer | critic) says who is asking; `max_tokens` caps the
        reply and `stop` ends it early. `request` holds what the protocol adds: `tools`, `response_format` (a
        list of formats, most wanted first: the first the endpoint takes is used) and `temperature`."""


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


def _count_prompt_tokens(messages: list[Message], model: str) -> int:
    from memory.context import message_text
    from memory.tokens import counter_for

    counter = counter_for(model)
    return sum(counter.count(message_text(m)) + 4 for m in messages)


class OpenAIModel:
    """Any OpenAI-compatible chat endpoint (OpenAI, Ollama, vLLM, llama.cpp server, LM Studio, gateways)."""

    def __init__(self, endpoint: Endpoint, prices: PriceTable | None = None, *, backoff: Backoff = Backoff(),
                 request_timeout_s: float = 120.0, timeout_retries: int = 1,
                 on_retry: Callable[[str], None] | None = None):
        import httpx
        import openai

        endpoint.check()
        self.endpoint = endpoint
        self.prices = prices or PriceTable()
        self.backoff = backoff
        self.retries = backoff.attempts - 1
        self.timeout_retries = timeout_retries  # a silent endpoint costs request_timeout_s per try: few tries
        self.request_timeout_s = request_timeout_s
        self.on_retry = on_retry  # told about each wait, so a 10 s Retry-After does not look like a hang
        self._refused: dict[str, set[str]] = {}  # model → request parameters the endpoint rejected for it
        # a local server needs no key, but the client insists on one
        self.client = openai.OpenAI(
            api_key=endpoint.api_key or "not-needed",
            base_url=endpoint.base_url,
            max_retries=0,  # we retry ourselves (retry.py says why), so every attempt is bounded and visible
            # no byte for request_timeout_s (between bytes, not in all): a hung server is caught, and a long
            # generation that is still sending is not cut
            timeout=httpx.Timeout(request_timeout_s, connect=min(10.0, request_timeout_s)),
        )

    def check_reachable(self, timeout_s: float = 5.0) -> None:
        """Fail fast, with one clear line, when nothing listens at the endpoint (no request is sent)."""
        import socket
        from urllib.parse import urlsplit

        url = urlsplit(self.endpoint.base_url or "https://api.openai.com/v1")
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            socket.create_connection((url.hostname or "", port), timeout=timeout_s).close()
        except OSError as exc:
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise ConfigError(f"cannot reach the model endpoint {url.geturl()} ({reason}): set OPENAI_BASE_URL to a "
                              f"running OpenAI-compatible server, or check the network") from None

    def complete(self, messages: list[Message], *, model: str, role: str = "agent", max_tokens: int | None = None,
                 stop: list[str] | None = None, tools: list[dict] | None = None,
                 response_format: list[dict] | None = None, temperature: float | None = None) -> Completion:
        while True:
            options = self._options(model, max_tokens, stop, temperature)
            refused = self._refused.get(model, set())
            formats = [f for f in response_format or () if format_name(f) not in refused]
            if formats:
                options["response_format"] = formats[0]
            if tools:
                options["tools"] = tools
            try:
                return self._complete(messages, model, options)
            except ModelError as error:
                self._refusal(model, options, formats, str(error))

    def _refusal(self, model: str, options: dict, formats: list[dict], error: str) -> None:
        """Learn from a request the endpoint refused what to leave out next time; re-raise when nothing can be.
        A response_format it refuses is replaced by the next one wanted (in the end by plain text); a parameter it
        names (o-series models want max_completion_tokens and take no stop or temperature; some local servers
        reject either) is left out."""
        refused = self._refused.setdefault(model, set())
        named = [name for name in options if name not in ("tools", "response_format")
                 and re.search(rf"\b{name}\b", error)]
        if named:
            refused.update(named)
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

    def _options(self, model: str, max_tokens: int | None, stop: list[str] | None,
                 temperature: float | None = None) -> dict:
        refused = self._refused.get(model, set())
        options: dict = {}
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

    def _complete(self, messages: list[Message], model: str, options: dict) -> Completion:
        import openai

        where = self.endpoint.base_url or "the OpenAI API"
        problem, timeouts, attempts, last_failure = "", 0, 0, None
        for attempt in range(self.retries + 1):
            attempts += 1
            started = time.monotonic()
            try:
                response = self.client.chat.completions.create(model=model, messages=messages, **options)
                if isinstance(response, str) or not hasattr(response, "choices"):
                    raise BadResponse(f"the endpoint {where} answered 200 with a body that is not a chat completion "
                                      f"({str(response)[:80]!r})")
                return self._completion(response, messages, model, time.monotonic() - started)
            except openai.AuthenticationError:
                raise ModelRejected(f"the endpoint {where} rejected the API key: set a valid OPENAI_API_KEY") from None
            except openai.NotFoundError as exc:
                raise ModelRejected(f"the endpoint {where} does not know model {model!r} (or the URL is wrong): "
                                    f"check --model / MINIAGI_MODEL and OPENAI_BASE_URL ({_error_text(exc)})") from None
            except openai.PermissionDeniedError as exc:
                raise ModelRejected(f"the endpoint {where} refused access to {model!r}: {_error_text(exc)}") from None
            except openai.APITimeoutError as exc:  # a silent server costs request_timeout_s a try: few tries
                problem, error = (f"the model endpoint {where} sent nothing for {self.request_timeout_s:g} s "
                                  f"(--request-timeout)"), exc
                timeouts += 1
                if timeouts > self.timeout_retries:
                    break
            except (openai.APIConnectionError, openai.RateLimitError) as exc:
                problem, error = _describe(exc, where), exc
            except openai.APIStatusError as exc:
                failure = (exc.status_code, _error_text(exc))
                if exc.status_code not in (408, 409) and exc.status_code < 500:
                    raise ModelError(f"the endpoint answered {exc.status_code}: {failure[1]}") from None
                if failure == last_failure and exc.status_code not in (502, 503, 504):
                    # the same server error twice ("Conversation roles must alternate"): it is the request, not
                    # the server's state, and retrying will not change it
                    raise ModelError(f"the endpoint answered {exc.status_code} twice with the same error: "
                                     f"{failure[1]}") from None
                last_failure = failure
                problem, error = _describe(exc, where), exc
            except (BadResponse, ValueError, UnicodeDecodeError) as exc:  # a 200 whose body is not JSON / UTF-8
                problem, error = (str(exc) if isinstance(exc, BadResponse) else
                                  f"the endpoint {where} answered with a body that is not valid JSON "
                                  f"({type(exc).__name__}: {str(exc)[:80]})"), exc
            if attempt < self.retries:
                delay = self._delay(attempt, error)
                if self.on_retry is not None:
                    self.on_retry(f"{problem}; retrying in {delay:.0f} s (attempt {attempt + 2} of "
                                  f"{self.retries + 1})")
                time.sleep(delay)
        raise ModelUnavailable(f"{problem} (gave up after {attempts} attempts)")

    def _completion(self, response, messages: list[Message], model: str, latency: float) -> Completion:
        choice = response.choices[0] if response.choices else None
        text = (choice.message.content if choice and choice.message else None) or ""
        usage = getattr(response, "usage", None)
        if usage and usage.prompt_tokens is not None:
            prompt_tokens, completion_tokens = usage.prompt_tokens, usage.completion_tokens or 0
        else:  # some local servers report no usage: count it ourselves
            from memory.tokens import counter_for

            prompt_tokens = _count_prompt_tokens(messages, model)
            completion_tokens = counter_for(model).count(text)
        cached = cached_prompt_tokens(response)
        calls = tuple(ToolCall(call.id or f"call_{i}", call.function.name or "", call.function.arguments or "")
                      for i, call in enumerate((choice.message.tool_calls if choice and choice.message else None) or ())
                      if getattr(call, "function", None) is not None)
        return Completion(text=text, model=response.model or model, prompt_tokens=prompt_tokens,
                          completion_tokens=completion_tokens,
                          cost_usd=self.prices.cost(model, prompt_tokens, completion_tokens, cached), latency_s=latency,
                          finish_reason=(choice.finish_reason if choice else None) or "stop", cached_tokens=cached,
                          tool_calls=calls)

    def _delay(self, attempt: int, exc: Exception) -> float:
        response = getattr(exc, "response", None)
        return self.backoff.delay(attempt, retry_after(getattr(response, "headers", None)))


def format_name(response_format: dict) -> str:
    """json_schema, json_object+schema (llama.cpp's own way to constrain) or json_object."""
    kind = str(response_format.get("type", "?"))
    return kind + ("+schema" if "schema" in response_format else "")


def cached_prompt_tokens(response) -> int:
    """Prompt tokens served from the endpoint's cache, as each kind of server reports them: OpenAI, vLLM and
    llama.cpp (usage.prompt_tokens_details.cached_tokens), DeepSeek (usage.prompt_cache_hit_tokens),
    Anthropic-style gateways (usage.cache_read_input_tokens), llama.cpp's own timings (timings.cache_n)."""
    usage = getattr(response, "usage", None)
    candidates = []
    if usage is not None:
        details = getattr(usage, "prompt_tokens_details", None)
        candidates.append(getattr(details, "cached_tokens", None) if details is not None else None)
        extra = getattr(usage, "model_extra", None) or {}
        candidates += [extra.get("prompt_cache_hit_tokens"), extra.get("cache_read_input_tokens")]
    timings = (getattr(response, "model_extra", None) or {}).get("timings")
    if isinstance(timings, dict):
        candidates.append(timings.get("cache_n"))
    for value in candidates:
        if isinstance(value, int) and value > 0:
            return value
    return 0


def _error_text(exc: Exception) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body["error"] if isinstance(body.get("error"), dict) else body
        if inner.get("message"):
            return str(inner["message"])
    return str(getattr(exc, "message", None) or exc)


def _describe(exc: Exception, where: str) -> str:
    import openai

    if isinstance(exc, openai.APITimeoutError):
        return f"the model endpoint {where} timed out"
    if isinstance(exc, openai.APIConnectionError):
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

    prompt_tokens = _count_prompt_tokens(messages, model)
    completion_tokens = counter_for(model).count(text)
    cost = prices.cost(model, prompt_tokens, completion_tokens) if prices else 0.0
    return Completion(text=text, model=model, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                      cost_usd=cost, latency_s=0.0, tool_calls=tool_calls)
