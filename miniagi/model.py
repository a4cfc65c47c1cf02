"""The model behind one small interface: `complete(messages, model=...) -> Completion`.

Here are the interface (`Model`, `Completion`, `ToolCall`), the errors a model raises, and `ScriptedModel`, which
answers from a list (tests, replay, demos). The endpoint adapter around the `openai` SDK is `OpenAIModel` in
endpoint.py (its client and bounds in sdk_client.py), which builds on this module (`from miniagi.endpoint import
OpenAIModel`; `from miniagi import OpenAIModel` as always); prices are in prices.py, their names found here too.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol, Union

from .errors import ConfigError
from .prices import PRICES, PriceTable, cached_prompt_tokens, count_prompt_tokens, load_prices

__all__ = ["Message", "ToolCall", "Completion", "Model", "ModelUnavailable", "ModelRejected", "ModelError",
           "ScriptedModel", "ScriptExhausted", "local_completion", "PRICES", "PriceTable", "count_prompt_tokens",
           "cached_prompt_tokens", "load_prices"]

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

