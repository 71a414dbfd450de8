"""A plan whose trial is one batch says so (llm_diagnose.diagnose.capacity.trial_size): with the
issue's server in the model, 24.5 ms a step plus 1.5 ms a sequence, a trial of 32 requests of 64
tokens is in flight almost whole at its goodput; one of 512 is a stream."""

from __future__ import annotations

from dataclasses import replace

from llm_diagnose.diagnose.capacity import SimRequest, plan_capacity
from llm_diagnose.diagnose.capacity.goodput import predict_ramp
from llm_diagnose.diagnose.capacity.measured import MeasuredGoodput
from llm_diagnose.diagnose.capacity.model import FittedRange
from llm_diagnose.diagnose.capacity.trial_size import ONE_BATCH_FRACTION, STREAM_FACTOR, one_batch_note
from llm_diagnose.probes.experiments.ramp import RampPlan
from tests.test_capacity_bounds import LIMITS, SLO_ISSUE, TRUE

WIDE = replace(TRUE, fitted_range=FittedRange(256, 100_000, 1000.0))  # no extrapolation note in the way


def test_the_note_starts_at_half_the_trial_in_one_step():
    assert one_batch_note(15, 32) is None
    note = one_batch_note(16, 32)
    assert note is not None and f"at least {STREAM_FACTOR * 16} requests" in note and "16 of them" in note
    assert "--trial-requests" not in note  # a plan from evidence: the trace sets the trial
    assert ONE_BATCH_FRACTION == 0.5
    assert one_batch_note(3, 0) is None  # no trial, nothing to say


def test_a_short_trace_is_one_batch_and_a_long_one_a_stream():
    short = plan_capacity([SimRequest(0.0, 200, 64) for _ in range(32)], WIDE, LIMITS, SLO_ISSUE, 40.0).today
    long = plan_capacity([SimRequest(0.0, 200, 64) for _ in range(512)], WIDE, LIMITS, SLO_ISSUE, 40.0).today
    assert short.one_batch and "one batch" in short.assumption and short.to_dict()["one_batch"]
    assert not long.one_batch and "one batch" not in long.assumption
    # What the note warns of: the short trial's goodput is above the stream's.
    assert short.goodput_rps > long.goodput_rps


def test_a_measured_goodput_of_one_batch_trials_says_so_too():
    # plan --active's trials are the trace's first requests as well: the model's replay of the
    # trial at the measured goodput tells whether it was one batch.
    plan = RampPlan(1.0, steps=3, requests=32, max_rps=1000.0, max_trials=12)
    for n, one_batch in ((32, True), (512, False)):
        items = [SimRequest(0.0, 200, 64) for _ in range(n)]
        live = predict_ramp(items[:32] if one_batch else items, TRUE, LIMITS, SLO_ISSUE, replace(plan, requests=n))
        measured = MeasuredGoodput(live, live, None, None, None, n, "test")
        today = plan_capacity(items, WIDE, LIMITS, SLO_ISSUE, 40.0, measured=measured).today
        assert today.source == "measured" and today.one_batch is one_batch, today.assumption
        assert ("in the model's replay of the trial" in today.assumption) is one_batch
        assert ("--trial-requests" in today.assumption) is one_batch  # the remedy for live trials
