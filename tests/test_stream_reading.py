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


class Chunks:
    """The SDK's stream as _read_stream reads it: the chunks as the server sent them (dicts)."""

    def __init__(self, chunks: list[dict]):
        self.chunks = chunks

    def __iter__(self):
        return iter(self.chunks)

    def close(self) -> None:
        pass


fragment = st.tuples(st.sampled_from([0, 1]), st.text(max_size=5))  # (the call's index, a piece of its arguments)
chunk_parts = st.tuples(st.text(max_size=5), st.lists(fragment, max_size=3))


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(chunk_parts, min_size=1, max_size=12))
def test_chunks_carrying_several_fragments_of_a_call_add_up_to_each_call(parts):
    """A chunk may carry several fragments of one tool call (the SDK's accumulate_delta merges them): each call's
    arguments are its fragments in order, the text is the text pieces in order, and what is told as it comes adds up
    to both."""
    from miniagi.sdk_client import Limits, _read_stream

    names, chunks, introduced, sent = {0: ("call_a", "first"), 1: ("call_b", "second")}, [], [], ["", ""]
    for text, fragments in parts:
        pieces = []
        for index, piece in fragments:
            index = index if index < len(introduced) + 1 else len(introduced)  # calls begin in order, as servers send
            call = {"index": index, "function": {"arguments": piece}}
            if index not in introduced:  # a call's first fragment says its id and name
                introduced.append(index)
                call.update(id=names[index][0], type="function")
                call["function"]["name"] = names[index][1]
            pieces.append(call)
            sent[index] += piece
        chunks.append({"model": "m", "choices": [{"index": 0, "delta": {"content": text, "tool_calls": pieces}}]})
    chunks.append({"model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    told: list[str] = []
    reply = _read_stream(Chunks(chunks), Limits(0.0, 1e9, 1e9, 10**9), 10**6, told.append)
    assert reply.text == "".join(text for text, _ in parts)
    assert reply.calls == [(*names[index], sent[index]) for index in introduced]
    assert reply.finish_reason == "tool_calls"
    assert "".join(piece for piece in told if not isinstance(piece, CallPiece)) == reply.text
    assert "".join(piece for piece in told if isinstance(piece, CallPiece)) == \
        "".join(piece for _, fragments in parts for _, piece in fragments)
