"""The endpoint adapter: `OpenAIModel`, any OpenAI-compatible chat endpoint behind the model interface.

The request goes out through the `openai` SDK (sdk_client.py: the SDK's client with miniagi's bounds); here are
what is asked (the options an endpoint takes, learnt from what it refuses), the one retry policy (`classify`: each
failed try a verdict, GiveUp or Retry — rate limits, 5xx, dropped connections are retried — and retry.py's bounded
backoff, each wait told), one readable line for every error, and the reply made a Completion (its tokens as reported
when plausible, else counted here).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Callable

from .config import ConfigError, Endpoint
from .model import Completion, Message, ModelError, ModelRejected, ModelUnavailable, ToolCall
from .prices import PriceTable, cached_prompt_tokens, count_prompt_tokens, whole_number
from .retry import Backoff, retry_after
from .sdk_client import (
    BYTES_PER_TOKEN_BOUND,
    CHARS_PER_TOKEN_BOUND,
    PAST_CAP_SLACK,
    UNCAPPED_REPLY_TOKENS,
    BadResponse,
    BrokenStream,
    Dropped,
    EndpointClient,
    FailedMidReply,
    Limits,
    PastDeadline,
    Reply,
    Silent,
    load_sdk,
    preload,
    request_deadline,
)

__all__ = ["OpenAIModel", "EndpointClient", "preload", "format_name", "request_deadline"]


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
        # one attempt per call: the SDK's retries are off, we retry ourselves (retry.py says why), so every attempt
        # is bounded and visible
        self.client = EndpointClient(endpoint)
        self.client.warm()

    def check_reachable(self, timeout_s: float = 5.0) -> None:
        """Fail fast, with one clear line, when nothing listens at the endpoint (no request is sent). Behind a
        proxy (HTTPS_PROXY, HTTP_PROXY, ALL_PROXY; NO_PROXY honoured) the proxy is what must be reachable."""
        import socket
        from urllib.parse import urlsplit
        from urllib.request import getproxies, proxy_bypass

        problem = base_url_problem(self.endpoint.base_url)
        if problem:
            raise ConfigError(problem)
        url = urlsplit(self.client.base_url)
        proxies = getproxies()
        proxy = proxies.get(url.scheme) or proxies.get("all")
        if proxy and not proxy_bypass(url.hostname or ""):
            through = urlsplit(proxy if "://" in proxy else "http://" + proxy)
            host, port = through.hostname or "", through.port or (443 if through.scheme == "https" else 80)
            what = f"the proxy {through.scheme}://{host}:{port} for the model endpoint {url.geturl()}"
        else:
            host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
            what = f"the model endpoint {url.geturl()}"
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
        except OSError as exc:
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise ConfigError(f"cannot reach {what} ({reason}): set OPENAI_BASE_URL to a running "
                              f"OpenAI-compatible server, or check the network") from None

    def served_models(self) -> list[str]:
        """The model names the endpoint says it serves (GET /models), or none when it does not say."""
        try:
            listed = self.client.sdk.models.list(timeout=5.0)
            return sorted(str(item.id) for item in listed if getattr(item, "id", None))
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
        """One request, tried again as `classify` says (and at most `timeout_retries` more times after a silence)."""
        openai = load_sdk()
        import httpx2

        deadline_s = self.deadline(cap)
        # between bytes, not in all: the wait for the answer's headers (llama.cpp sends them with the first token) is
        # bounded by the silence allowed; while reading, the Guard keeps the deadline
        timeout = httpx2.Timeout(min(self.request_timeout_s, deadline_s), connect=min(10.0, self.request_timeout_s))
        verdict: Retry | GiveUp | None = None
        last_failure: tuple[int, str] | None = None
        timeouts = attempt = 0
        for attempt in range(self.retries + 1):
            started = time.monotonic()
            limits = Limits(started, self.request_timeout_s, deadline_s, cap * BYTES_PER_TOKEN_BOUND + 1_000_000)
            try:
                reply = self.client.chat({"model": model, "messages": messages, **options}, limits, timeout, cap,
                                         on_piece)
                return self._completion(reply, messages, model, options, cap, started)
            except (openai.APIStatusError, openai.APIConnectionError, Silent, PastDeadline, Dropped, FailedMidReply,
                    BadResponse) as error:  # APIConnectionError: APITimeoutError too
                verdict = self.classify(error, model=model, options=options, deadline_s=deadline_s,
                                        past_deadline=time.monotonic() - started >= deadline_s,
                                        last_failure=last_failure)
            if isinstance(verdict, GiveUp):
                if verdict.error is not None:
                    raise verdict.error from None
                break
            last_failure = verdict.failure or last_failure
            timeouts += verdict.silent
            if timeouts > self.timeout_retries:  # a silent endpoint costs request_timeout_s a try: few tries
                break
            if attempt < self.retries:
                delay = self.backoff.delay(attempt, verdict.after_s)
                self._tell(f"{verdict.problem}; retrying in {delay:.0f} s (attempt {attempt + 2} of "
                           f"{self.retries + 1})")
                time.sleep(delay)
        raise ModelUnavailable(f"{verdict.problem} (gave up after {attempt + 1} attempt{'s' if attempt else ''})")

    def classify(self, error: Exception, *, model: str, options: dict, deadline_s: float, past_deadline: bool,
                 last_failure: tuple[int, str] | None = None) -> "Retry | GiveUp":
        """What one failed try means: give up (the request is at fault, or the endpoint cannot finish in time) or
        try again (after the server's Retry-After, if it says one). `last_failure`: the (status, message) of the
        last error answer before this one."""
        import openai

        where = self.endpoint.base_url or "the OpenAI API"
        if isinstance(error, openai.APIStatusError):
            return self._classify_status(error, model, options, last_failure)
        if isinstance(error, (openai.APITimeoutError, Silent, PastDeadline)):
            if past_deadline or isinstance(error, PastDeadline):  # a trickle would trickle again: not retried
                return GiveUp(_past_deadline(where, deadline_s))
            return Retry(f"the model endpoint {where} sent nothing for {self.request_timeout_s:g} s "
                         f"(--request-timeout)", silent=True)
        if isinstance(error, openai.APIConnectionError):  # nothing listens, the connection broke before an answer
            if _tls_mismatch(error):  # https:// to a server that speaks plain http: retrying cannot help
                return GiveUp("", ModelRejected(f"the endpoint {where} does not speak TLS (https): a local server "
                                                f"usually wants http:// — set OPENAI_BASE_URL={_as_http(where)}"))
            return Retry(_describe(error, where))
        if isinstance(error, Dropped):
            return Retry(f"the connection to the model endpoint {where} dropped mid-reply ({error})")
        if isinstance(error, FailedMidReply):
            return Retry(f"the model endpoint {where} failed mid-reply: {error}")
        return Retry(str(error))  # BadResponse: a 200 whose body is not a completion (not JSON, not UTF-8, too large)

    def _classify_status(self, error, model: str, options: dict, last_failure: tuple[int, str] | None
                         ) -> "Retry | GiveUp":
        where = self.endpoint.base_url or "the OpenAI API"
        status = error.status_code
        if status == 401:
            return GiveUp("", ModelRejected(f"the endpoint {where} rejected the API key: set a valid OPENAI_API_KEY"))
        if status == 404:
            served = self.served_models()
            if served and model not in served:
                return GiveUp("", ModelRejected(
                    f"the endpoint {where} does not serve model {model!r}; it serves: {', '.join(served[:20])}"
                    f"{' …' if len(served) > 20 else ''} — give one with -m / MINIAGI_MODEL"))
            return GiveUp("", ModelRejected(
                f"the endpoint {where} does not know model {model!r} (or the URL is wrong): check --model / "
                f"MINIAGI_MODEL and OPENAI_BASE_URL ({_error_text(error)}){_missing_v1(self.endpoint.base_url)}"))
        if status == 403:
            return GiveUp("", ModelRejected(f"the endpoint {where} refused access to {model!r}: {_error_text(error)}"))
        if 300 <= status < 400:  # not followed: the key would go wherever the answer points
            return GiveUp("", ModelRejected(
                f"the endpoint {where} redirects to {error.response.headers.get('location', '?')} (HTTP {status}), "
                f"which is not followed: set OPENAI_BASE_URL to the address meant"))
        failure = (status, _error_text(error))
        if status not in (408, 409, 429) and status < 500:
            return GiveUp("", ModelError(f"the endpoint answered {status}: {failure[1]}"))
        if status != 429 and failure == last_failure and names_the_request(failure[1], options):
            # the chat template's "Conversation roles must alternate", a field it does not know: the request is at
            # fault, and sending it a third time will not change the answer
            return GiveUp("", ModelError(f"the endpoint answered {status} twice with the same error: {failure[1]}"))
        return Retry(_describe(error, where), retry_after(error.response.headers), failure=failure)

    def _completion(self, reply: Reply, messages: list[Message], model: str, options: dict, cap: int,
                    started: float) -> Completion:
        ended = time.monotonic()
        where = self.endpoint.base_url or "the OpenAI API"
        if reply.streamed and not reply.done and reply.finish_reason is None and not reply.past_cap:
            raise BrokenStream("the endpoint's stream ended before the reply did (no finish_reason, no [DONE])")
        if reply.past_cap:
            self._tell(f"the model endpoint {where} sent more than the {cap}-token cap (max_tokens): stopped "
                       f"reading, and took the reply as cut off")
        calls = tuple(ToolCall(call_id, name, arguments[:cap * CHARS_PER_TOKEN_BOUND])
                      for call_id, name, arguments in reply.calls)
        text = reply.text[:cap * CHARS_PER_TOKEN_BOUND]
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
        plausible = (whole_number(prompt) and 0 < prompt <= request_bytes + 1000
                     and whole_number(completion) and 0 <= completion <= cap + PAST_CAP_SLACK)
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



@dataclass(frozen=True)
class Retry:
    """A failed try worth another: `problem` is told with the wait (and said if the tries run out)."""

    problem: str
    after_s: float | None = None  # the server's Retry-After
    silent: bool = False  # nothing arrived for --request-timeout: each such try costs that long, so fewer are made
    failure: tuple[int, str] | None = None  # (status, message): the same twice, naming the request, ends it


@dataclass(frozen=True)
class GiveUp:
    """No further try: `error` is raised as it is (the request is at fault: another try cannot help), or with none
    the endpoint is unavailable, and `problem` is said with the tries made."""

    problem: str
    error: ModelRejected | ModelError | None = None


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
    if getattr(exc, "status_code", None) is not None:
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
    import openai

    if isinstance(exc, openai.APITimeoutError):
        return f"the model endpoint {where} timed out"
    if isinstance(exc, openai.APIConnectionError):
        return f"cannot reach the model endpoint {where}: check OPENAI_BASE_URL and that the server is running"
    status = getattr(exc, "status_code", "?")
    return f"the model endpoint {where} kept failing (HTTP {status}: {_error_text(exc)})"
