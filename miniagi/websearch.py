"""Web search behind a small interface; the default backend is `ddgs` (DuckDuckGo and friends, no key needed).

Searching never holds the run up for long: each attempt has a short timeout, rate limits are retried with
backoff, and the whole search has a deadline after which the agent is told search is unavailable.
"""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass
from typing import Protocol

from .retry import Backoff

SEARCH_DEADLINE_S = 12.0
ATTEMPT_TIMEOUT_S = 5
RATE_LIMITED = Backoff(attempts=3, base_s=1.0)  # a rate-limited search is tried again, within the deadline


@dataclass(frozen=True)
class SearchResult:
    title: str
    url: str
    snippet: str


class SearchUnavailable(Exception):
    """Search cannot be done now (offline, blocked, rate limited); the message says so plainly."""


class RateLimited(Exception):
    pass


class SearchBackend(Protocol):
    def search(self, query: str, max_results: int) -> list[SearchResult]: ...


class DdgsBackend:
    def search(self, query: str, max_results: int) -> list[SearchResult]:
        from ddgs import DDGS
        from ddgs.exceptions import DDGSException, RatelimitException

        try:
            hits = DDGS(timeout=ATTEMPT_TIMEOUT_S).text(query, max_results=max_results)
        except RatelimitException as exc:
            raise RateLimited(str(exc)) from None
        except DDGSException as exc:
            if "no results" in str(exc).lower():
                return []
            raise SearchUnavailable(plain_reason(exc)) from None
        return [SearchResult(title=" ".join(str(hit.get("title", "")).split()), url=str(hit.get("href", "")),
                             snippet=" ".join(str(hit.get("body", "")).split())) for hit in hits or []]


# what a network library's message means, in words the model (and the person) can act on
REASONS = (
    (("dns", "resolv", "name or service not known", "getaddrinfo", "no address associated"),
     "the search engine's address could not be looked up: no network or no DNS here"),
    (("timed out", "timeout"), "the search engine did not answer in time"),
    (("proxy",), "the proxy refused or failed (check DDGS_PROXY / HTTPS_PROXY)"),
    (("certificate", "ssl", "tls"), "a TLS/certificate problem on the way to the search engine"),
    (("connection refused", "connection reset", "unreachable", "connect error", "error sending request"),
     "the search engine could not be reached: no network, or it is blocked"),
)


def plain_reason(exc: Exception) -> str:
    """Why a search failed, in a few plain words (a library's raw message is long and means little to the model)."""
    text = str(exc) or type(exc).__name__
    lowered = text.lower()
    for words, reason in REASONS:
        if any(word in lowered for word in words):
            return reason
    return " ".join(text.splitlines()[0].split())[:160]


def search(backend: SearchBackend, query: str, max_results: int = 5,
           deadline_s: float = SEARCH_DEADLINE_S) -> list[SearchResult]:
    """Results, retrying rate limits; SearchUnavailable when nothing came within the deadline."""
    started = time.monotonic()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="web-search")
    try:
        for attempt in range(RATE_LIMITED.attempts):
            remaining = deadline_s - (time.monotonic() - started)
            if remaining <= 0:
                break
            future = pool.submit(backend.search, query, max_results)
            try:
                return future.result(timeout=remaining)
            except concurrent.futures.TimeoutError:
                raise SearchUnavailable(f"no answer within {deadline_s:g} s") from None
            except RateLimited:
                if attempt == RATE_LIMITED.attempts - 1:
                    raise SearchUnavailable("the search engine is rate limiting us") from None
                time.sleep(min(RATE_LIMITED.delay(attempt), max(0.0, deadline_s - (time.monotonic() - started))))
            except SearchUnavailable:
                raise
            except Exception as exc:  # a backend's own failure is still just "unavailable" to the agent
                raise SearchUnavailable(plain_reason(exc)) from None
        raise SearchUnavailable("the search engine is rate limiting us")
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # a hung attempt must not hold the run
