"""A streamed reply is read as the chunks were sent (the SDK's stream of dicts, put together by its accumulate_delta):
on generated replies, what the client returns is exactly what the server streamed, text and tool calls, and the pieces
told as they arrived add up to it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from miniagi.config import Endpoint
from miniagi.endpoint import OpenAIModel
from miniagi.retry import Backoff
from miniagi.sdk_client import CallPiece

from .fake_llm import FakeLLM, Stream

MESSAGES = [{"role": "user", "content": "Go on."}]
pieces = st.lists(st.text(min_size=0, max_size=12), max_size=30)
calls = st.lists(st.tuples(st.from_regex(r"[a-z_]{1,12}", fullmatch=True), pieces), max_size=3)


@settings(max_examples=40, deadline=None)
@given(text=pieces, tool_calls=calls, usage=st.booleans())
def test_a_streamed_reply_is_exactly_what_was_streamed(text, tool_calls, usage):
    with FakeLLM() as llm:
        llm.add(Stream(text, usage=usage, calls=tool_calls))
        told: list[str] = []
        model = OpenAIModel(Endpoint("sk-test", llm.url), backoff=Backoff(attempts=1))
        completion = model.complete(MESSAGES, model="gpt-4o-mini", max_tokens=4000, on_piece=told.append)
    assert completion.text == "".join(text)
    assert [(call.name, call.arguments) for call in completion.tool_calls] == \
        [(name, "".join(arguments)) for name, arguments in tool_calls]
    assert "".join(piece for piece in told if not isinstance(piece, CallPiece)) == "".join(text)
    assert "".join(piece for piece in told if isinstance(piece, CallPiece)) == \
        "".join(piece for _, arguments in tool_calls for piece in arguments)
    assert completion.finish_reason == "stop"
