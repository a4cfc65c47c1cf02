"""Cache-friendly prompts: cached-token accounting and pricing, and the reply cap and stop sequences reaching the
request. (The layout's invariants are property-tested in test_context.py.)"""

from __future__ import annotations

import json

from miniagi.model import PriceTable, cached_prompt_tokens

from .conftest import act
from .fake_llm import Fail
from .test_end_to_end import load_run


def usage_with(**extra) -> dict:
    return {"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105, **extra}


def test_cached_tokens_are_read_as_each_kind_of_server_reports_them():
    assert cached_prompt_tokens(usage_with(prompt_tokens_details={"cached_tokens": 64})) == 64  # OpenAI
    assert cached_prompt_tokens(usage_with(prompt_cache_hit_tokens=32)) == 32  # DeepSeek
    assert cached_prompt_tokens(usage_with(cache_read_input_tokens=16)) == 16  # Anthropic-style
    assert cached_prompt_tokens(usage_with(), timings={"cache_n": 8, "prompt_n": 92}) == 8  # llama.cpp
    assert cached_prompt_tokens(usage_with()) == 0
    assert cached_prompt_tokens(usage_with(prompt_tokens_details={"cached_tokens": -5})) == 0  # nonsense


def test_cached_input_is_priced_at_the_cached_price_and_users_may_give_it(tmp_path):
    table = PriceTable()
    assert table.cost("gpt-4o", 1_000_000, 0) == 2.50
    assert table.cost("gpt-4o", 1_000_000, 0, cached_tokens=600_000) == 0.4 * 2.50 + 0.6 * 1.25
    assert table.saved("gpt-4o-2024-08-06", 600_000) == 0.6 * (2.50 - 1.25)
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"local-model": [1.0, 2.0, 0.1], "old-style": [1.0, 2.0]}))
    mine = PriceTable(str(prices))
    assert mine.cost("local-model", 1_000_000, 0, cached_tokens=1_000_000) == 0.1
    assert mine.cost("old-style", 1_000_000, 0, cached_tokens=1_000_000) == 1.0  # no cached price: input price


def test_a_run_records_cached_tokens_prices_them_and_shows_the_hit_rate(cli, llm, isolated):
    llm.add(*[act("execute_python", f"print('line {i} ' * 50)") for i in range(4)], act("done", "ok"))
    proc = cli("-y", "--model", "gpt-4o", "print things")
    assert proc.returncode == 0, proc.stderr
    directory, result, trace = load_run(isolated.home)
    calls = [e for e in trace if e["type"] == "llm_call"]
    assert result["cached_prompt_tokens"] == sum(e["cached_tokens"] for e in calls) > 0
    for call in calls:  # every call priced with its cached share at the cached price
        expected = ((call["prompt_tokens"] - call["cached_tokens"]) * 2.5 + call["cached_tokens"] * 1.25
                    + call["completion_tokens"] * 10.0) / 1e6
        assert abs(call["cost_usd"] - expected) < 1e-12
    assert result["cost_saved_usd"] > 0
    rate = f"{100 * result['cached_prompt_tokens'] / result['prompt_tokens']:.0f}%"
    assert f"\t{rate}\t" in cli("runs").stdout
    assert f"{rate} of prompt tokens from the endpoint's cache" in cli("show", directory.name).stdout


def test_the_agents_reply_is_capped_and_stopped_and_a_refused_parameter_is_dropped(cli, llm, isolated):
    llm.add(act("memorize_thoughts", "x"), act("done", "ok"))
    assert cli("--summarizer-model", "reader", "--max-reply-tokens", "300", "go").returncode == 0
    first = llm.agent_requests()[0]
    assert first["max_tokens"] == 300 and "\nObservation" in first["stop"] and len(first["stop"]) <= 4

    def strict(request):  # an o-series style endpoint
        if "max_tokens" in request:
            return Fail(400, message="Unsupported parameter: 'max_tokens' is not supported with this model. "
                                     "Use 'max_completion_tokens' instead.")
        if "stop" in request:
            return Fail(400, message="Unsupported parameter: 'stop' is not supported with this model.")
        return None

    llm.responder = strict
    llm.add(act("done", "fine"))
    proc = cli("go again")
    assert proc.returncode == 0, proc.stderr
    final = llm.requests[-1]
    assert final["max_completion_tokens"] == 2000 and "stop" not in final and "max_tokens" not in final
