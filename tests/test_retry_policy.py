"""The model client's retry policy as data: `OpenAIModel.classify(error)` says, for each kind of failed try, give up
(with the error raised, or as unavailable) or retry (after the server's Retry-After). The errors are the real ones:
the openai SDK's, raised by the SDK against the scripted server (or a port nothing listens on), and miniagi's own
from sdk_client.py."""

from __future__ import annotations

import socket

import httpx2
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from miniagi.config import Endpoint
from miniagi.endpoint import GiveUp, OpenAIModel, Retry
from miniagi.model import ModelError, ModelRejected, ModelUnavailable
from miniagi.retry import Backoff
from miniagi.sdk_client import BadResponse, Dropped, FailedMidReply, PastDeadline, Silent

from .fake_llm import Fail

MESSAGES = [{"role": "user", "content": "Hello"}]


def model_for(url: str) -> OpenAIModel:
    return OpenAIModel(Endpoint("sk-test-key-123456", url), backoff=Backoff(attempts=3, base_s=0, cap_s=0),
                       request_timeout_s=7)


def classify(model: OpenAIModel, error: Exception, *, past_deadline: bool = False, last_failure=None,
             options: dict | None = None):
    return model.classify(error, model="gpt-4o-mini", options=options or {"stream": True}, deadline_s=30.0,
                          past_deadline=past_deadline, last_failure=last_failure)


def raised_by_the_sdk(url: str) -> Exception:
    """The error the openai SDK raises for one chat request to `url` (following no redirect, as miniagi's client)."""
    client = openai.OpenAI(api_key="sk-test-key-123456", base_url=url, max_retries=0, timeout=5,
                           http_client=httpx2.Client(follow_redirects=False))
    with pytest.raises(openai.APIError) as raised:
        client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    return raised.value


def status_error(status: int, headers: dict | None = None, message: str = "scripted failure"):
    """An error answer as the SDK makes it from a response (for statuses a test server is not started for)."""
    request = httpx2.Request("POST", "http://127.0.0.1:9/v1/chat/completions")
    response = httpx2.Response(status, headers=headers or {}, request=request)
    return openai.APIStatusError(message, response=response, body={"error": {"message": message}})


def test_a_rate_limit_is_retried_after_the_time_the_server_asks(llm):
    llm.add(Fail(429, {"Retry-After": "3"}, message="Rate limit reached"))
    verdict = classify(model_for(llm.url), raised_by_the_sdk(llm.url))
    assert verdict == Retry(f"the model endpoint {llm.url} kept failing (HTTP 429: Rate limit reached)", 3.0,
                            failure=(429, "Rate limit reached"))


def test_a_server_error_is_retried_until_it_repeats_naming_the_request(llm):
    llm.add(Fail(500, message="overloaded"), Fail(500, message="Conversation roles must alternate"))
    model = model_for(llm.url)
    overloaded = classify(model, raised_by_the_sdk(llm.url))
    assert isinstance(overloaded, Retry) and overloaded.after_s is None and overloaded.failure == (500, "overloaded")
    assert isinstance(classify(model, raised_by_the_sdk(llm.url), last_failure=(500, "overloaded")), Retry)
    roles = status_error(500, message="Conversation roles must alternate")
    assert isinstance(classify(model, roles, last_failure=(500, "overloaded")), Retry)  # not the same error
    twice = classify(model, roles, last_failure=(500, "Conversation roles must alternate"))
    assert isinstance(twice, GiveUp) and type(twice.error) is ModelError
    assert "twice with the same error" in str(twice.error)
    # a rate limit is never the request's fault, however often it comes back the same
    limited = status_error(429, message="Conversation roles must alternate")
    assert isinstance(classify(model, limited, last_failure=(429, "Conversation roles must alternate")), Retry)


@pytest.mark.parametrize("status, says", [(401, "rejected the API key"), (403, "refused access"),
                                          (307, "redirects to http://elsewhere.example/v1")])
def test_the_request_refused_for_good_ends_at_once(llm, status, says):
    headers = {"Location": "http://elsewhere.example/v1"} if status == 307 else {}
    llm.add(Fail(status, headers))
    verdict = classify(model_for(llm.url), raised_by_the_sdk(llm.url))
    assert isinstance(verdict, GiveUp) and isinstance(verdict.error, ModelRejected) and says in str(verdict.error)


def test_a_model_the_endpoint_does_not_serve_is_named_with_those_it_does(llm):
    llm.add(Fail(404, message="model not found"))
    verdict = model_for(llm.url).classify(raised_by_the_sdk(llm.url), model="gpt-9", options={}, deadline_s=30.0,
                                          past_deadline=False)
    assert isinstance(verdict, GiveUp) and isinstance(verdict.error, ModelRejected)
    assert "does not serve model 'gpt-9'; it serves: gpt-4o-mini" in str(verdict.error)


def test_another_client_error_gives_up_as_a_model_error_the_caller_learns_from(llm):
    llm.add(Fail(400, message="Unsupported parameter: 'stop'"))
    verdict = classify(model_for(llm.url), raised_by_the_sdk(llm.url))
    assert isinstance(verdict, GiveUp) and type(verdict.error) is ModelError
    assert str(verdict.error) == "the endpoint answered 400: Unsupported parameter: 'stop'"


def test_nothing_listening_is_retried_and_plain_http_behind_https_is_not(llm):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    refused = classify(model_for(url), raised_by_the_sdk(url))
    assert refused == Retry(f"cannot reach the model endpoint {url}: check OPENAI_BASE_URL and that the server is "
                            f"running")
    https = llm.url.replace("http://", "https://")
    verdict = classify(model_for(https), raised_by_the_sdk(https))
    assert isinstance(verdict, GiveUp) and isinstance(verdict.error, ModelRejected)
    assert f"set OPENAI_BASE_URL={llm.url}" in str(verdict.error)


def test_silence_is_retried_as_a_timeout_and_a_reply_past_its_deadline_is_not(llm):
    model = model_for(llm.url)
    for silence in (Silent(), openai.APITimeoutError(httpx2.Request("POST", llm.url))):
        verdict = classify(model, silence)
        assert verdict == Retry(f"the model endpoint {llm.url} sent nothing for 7 s (--request-timeout)", silent=True)
        late = classify(model, silence, past_deadline=True)
        assert isinstance(late, GiveUp) and late.error is None and "within 30 s" in late.problem
    trickle = classify(model, PastDeadline())
    assert isinstance(trickle, GiveUp) and trickle.error is None and "--request-deadline" in trickle.problem


def test_a_reply_broken_off_or_unreadable_is_retried(llm):
    model = model_for(llm.url)
    assert classify(model, Dropped("peer closed")) == Retry(
        f"the connection to the model endpoint {llm.url} dropped mid-reply (peer closed)")
    assert classify(model, FailedMidReply("overloaded")) == Retry(
        f"the model endpoint {llm.url} failed mid-reply: overloaded")
    assert classify(model, BadResponse("an HTML page")) == Retry("an HTML page")


@settings(max_examples=200, deadline=None)
@given(status=st.integers(300, 599), retry_after=st.one_of(st.none(), st.integers(0, 120)))
def test_every_status_is_given_up_or_retried_as_the_policy_says(status, retry_after):
    model = model_for("http://127.0.0.1:9/v1")
    headers = {} if retry_after is None else {"Retry-After": str(retry_after)}
    verdict = classify(model, status_error(status, headers)) if status != 404 else None
    if status == 404:  # asks the endpoint what it serves: tested above against a server
        return
    if status < 400 or (status < 500 and status not in (408, 409, 429)):
        # a redirect or a refusal: the configuration; another 4xx: the request (the caller learns from it)
        expected = ModelRejected if status < 400 or status in (401, 403) else ModelError
        assert isinstance(verdict, GiveUp) and type(verdict.error) is expected
    else:
        assert isinstance(verdict, Retry) and verdict.after_s == retry_after and not verdict.silent


def test_the_loop_follows_the_verdicts(llm):
    """Two server errors then a reply: retried as classified, each wait told; a rejected key ends at once."""
    told = []
    model = OpenAIModel(Endpoint("sk-test-key-123456", llm.url), backoff=Backoff(attempts=3, base_s=0, cap_s=0),
                        on_retry=told.append)
    llm.add(Fail(502, message="bad gateway"), Fail(503, message="busy"), "Fine.")
    assert model.complete(MESSAGES, model="gpt-4o-mini").text == "Fine."
    assert [line.split(";")[0] for line in told] == [f"the model endpoint {llm.url} kept failing (HTTP 502: bad "
                                                     f"gateway)", f"the model endpoint {llm.url} kept failing "
                                                                  f"(HTTP 503: busy)"]
    llm.add(Fail(500), Fail(500), Fail(500))
    with pytest.raises(ModelUnavailable, match=r"HTTP 500.*\(gave up after 3 attempts\)$"):
        model.complete(MESSAGES, model="gpt-4o-mini")
    llm.add(Fail(401))
    with pytest.raises(ModelRejected, match="rejected the API key"):
        model.complete(MESSAGES, model="gpt-4o-mini")
    assert len(told) == 4  # the 500s were told twice; the 401 not at all
