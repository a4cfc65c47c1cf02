"""scripts/bench.py's "agent overhead per step" is measured honestly: only the loop's own wait for the model is
taken out of a step's time."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from benchlib import TimedModel  # noqa: E402

LOOP, SUMMARY = 1, 2


def test_a_summary_made_beside_the_loop_is_not_taken_out_of_the_loops_time():
    timed = TimedModel(model=None)
    timed.calls = [(0.000, 0.010, "agent", LOOP), (0.012, 0.050, "summarizer", SUMMARY),
                   (0.030, 0.010, "agent", LOOP), (0.060, 0.010, "agent", LOOP)]
    first, second = timed.step_overheads()
    assert abs(first - 0.020) < 1e-9  # 30 ms between the agent calls, 10 of them in the loop's own call
    assert abs(second - 0.020) < 1e-9


def test_the_loops_wait_for_a_summary_counts_as_the_models_time_while_the_summarizer_is_asked():
    timed = TimedModel(model=None)
    timed.calls = [(0.000, 0.010, "agent", LOOP), (0.012, 0.020, "summarizer", SUMMARY),
                   (0.040, 0.010, "agent", LOOP)]
    timed.waits = [(0.015, 0.020, LOOP)]  # waited 15-35 ms; the summarizer's call ran until 32 ms
    (overhead,) = timed.step_overheads()
    assert abs(overhead - (0.040 - 0.010 - 0.017)) < 1e-9
