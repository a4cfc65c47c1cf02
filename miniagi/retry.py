"""One small retry policy, shared by the model client and web search: how many tries, and how long to wait before
the next — the server's Retry-After when it gives one (capped), else exponential backoff with jitter.

The openai SDK is the model client, with its own retries off (`max_retries=0`, sdk_client.py): they cannot show
each wait to the person (a 10 s Retry-After looks like a hang), cannot retry a 200 whose body is not a completion (a
proxy's HTML page), and count a silent endpoint (--request-timeout per try) like any other failure, where we allow it
fewer tries.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    attempts: int = 5  # tries in all, the first included
    base_s: float = 0.5  # the first wait; each next one doubles
    cap_s: float = 60.0  # no wait is longer, whatever the server asks

    def delay(self, attempt: int, retry_after_s: float | None = None) -> float:
        """The wait after failed try number `attempt` (0 for the first)."""
        if retry_after_s is not None:
            return min(self.cap_s, max(0.0, retry_after_s))
        return min(self.cap_s, self.base_s * (2 ** attempt) * (0.75 + random.random() / 2))


def retry_after(headers) -> float | None:
    """The seconds a server asks us to wait (Retry-After-Ms or Retry-After in seconds), if it says."""
    for header, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = (headers or {}).get(header)
        if value is not None:
            try:
                return float(value) * scale
            except ValueError:
                pass
    return None
