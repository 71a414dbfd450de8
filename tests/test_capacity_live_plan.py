"""Planning `plan --active`'s live goodput search (llm_diagnose.diagnose.capacity.live), which sends nothing.

The search itself runs against a real vLLM in tests/test_capacity_live.py.
"""

from __future__ import annotations

import pytest

from llm_diagnose.diagnose.capacity import predict_goodput
from llm_diagnose.diagnose.capacity.live import UNMODELLED_RANGE, plan_live_search
from llm_diagnose.diagnose.capacity.plan import PREDICTION_RANGE
from llm_diagnose.diagnose.errors import UsageError
from llm_diagnose.diagnose.tree.slo import SLO, Objective
from llm_diagnose.probes.load.budget import ActiveBudget
from llm_diagnose.probes.traces.records import TraceRequest
from tests.test_capacity import LIMITS, MODEL, _items

SLO_E2E = SLO((Objective("e2e", 50, 0.2),), True)
TRACE = tuple(TraceRequest(line=i + 1, input_tokens=256, output_tokens=32) for i in range(30))
ITEMS = _items(30)


def plan(model=MODEL, budget=ActiveBudget(150, 90), **kw):
    args = {"trial_requests": 40, "steps": 3, "span": 3.0, **kw}
    return plan_live_search(TRACE, ITEMS, LIMITS, SLO_E2E, model, budget, **args)


def test_the_bracket_is_centred_on_the_goodput_of_what_a_trial_sends():
    search = plan()
    n = search.goodput.requests
    assert n == len(TRACE)  # --trial-requests above the trace's length: the whole trace
    g = predict_goodput(
        ITEMS[:n], MODEL, LIMITS, SLO_E2E, low_rps=PREDICTION_RANGE[0], high_rps=PREDICTION_RANGE[1], steps=16
    ).goodput_rps
    assert search.goodput.low_rps == pytest.approx(g / 3) and search.goodput.high_rps == pytest.approx(g * 3)
    assert search.goodput.workload == f"the trace's first {n} requests" and not search.notes


def test_without_a_model_the_search_spans_a_fixed_range_and_says_so():
    search = plan(model=None)
    assert (search.goodput.low_rps, search.goodput.high_rps) == UNMODELLED_RANGE
    assert search.notes == ("no model before the search: it spans 0.5-64 requests/s",)


def test_the_search_leaves_post_tokenize_its_slot_of_the_budget():
    # 80 requests would hold both ends, the low end's second try and one bisection step of 20;
    # less the slot of POST /tokenize, the step goes.
    search = plan(budget=ActiveBudget(80, 600), trial_requests=20)
    assert (search.goodput.steps, search.goodput.max_requests) == (0, 60)


def test_what_will_be_sent_is_said_first():
    text = plan().describe("http://127.0.0.1:8000")
    assert text.startswith(
        "Active goodput search will send streaming POST /v1/completions requests to http://127.0.0.1"
    )
    assert "at most 150 requests within 90 s - a hard bound" in text and "one POST /tokenize first" in text


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"span": 1.0}, "--search-span must be above 1"),
        ({"budget": ActiveBudget(5, 90)}, "a goodput search needs at least"),
    ],
)
def test_a_search_that_cannot_be_planned_is_a_usage_error(kw, message):
    with pytest.raises(UsageError, match=message):
        plan(**kw)
