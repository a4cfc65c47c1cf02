"""Prices: what a model call costs, from a table of common models (USD per 1M tokens) or the user's --prices file,
and the most a call can cost before it is made."""

from __future__ import annotations

import json
import re
from pathlib import Path

from .errors import ConfigError

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


# what follows a model's name in the name of one of its snapshots: a date or version number, "latest", "preview"
SNAPSHOT = re.compile(r"(?:\d{4}(?:-\d{2}-\d{2})?|\d{8}|latest|preview)(?:-preview)?")


class PriceTable:
    def __init__(self, overrides_file: str | None = None):
        self.prices = dict(PRICES)
        if overrides_file:
            self.prices.update(load_prices(overrides_file))

    def price(self, model: str) -> tuple[float, float, float]:
        """Exact name first, then the longest known name of which this is a dated snapshot ("gpt-4o-mini-2024-07-18"
        → "gpt-4o-mini", "claude-sonnet-4-20250514", "gpt-4-1106-preview", "-latest"); another model whose name
        merely begins the same ("o1-pro" is not "o1": ten times its price) is unknown, not mispriced."""
        bare = model.rsplit("/", 1)[-1]
        if bare in self.prices:
            return self.prices[bare]
        prefixes = [name for name in self.prices
                    if bare.startswith(name + "-") and SNAPSHOT.fullmatch(bare[len(name) + 1:])]
        return self.prices[max(prefixes, key=len)] if prefixes else (0.0, 0.0, 0.0)

    def cost(self, model: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
        per_input, per_output, per_cached = self.price(model)
        cached = min(cached_tokens, prompt_tokens)
        return ((prompt_tokens - cached) * per_input + cached * per_cached
                + completion_tokens * per_output) / 1_000_000

    def ceiling(self, model: str, messages: list[dict], max_tokens: int, tools: list[dict] | None = None,
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


def count_prompt_tokens(messages: list[dict], model: str, exact: bool = True) -> int:
    """The prompt's tokens; `exact=False`: a bound by bytes, known without the tokenizer."""
    from memory.context import message_text
    from memory.tokens import counter_for

    counter = counter_for(model)
    count = counter.count if exact else counter.most
    return sum(count(message_text(m)) + 4 for m in messages)


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
        if whole_number(value) and value > 0:
            return value
    return 0


def whole_number(value) -> bool:
    """An int that is not a bool (JSON's true is no count)."""
    return isinstance(value, int) and not isinstance(value, bool)
