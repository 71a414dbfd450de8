"""Lengths and arrivals on traces whose distributions are known by construction."""

from __future__ import annotations

import numpy as np
import pytest

from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.results import Measurement, NotMeasured, Summary
from llm_diagnose.probes.traces import analyze_trace, trace_evidence
from llm_diagnose.probes.traces.arrivals import arrival_stats, timestamp_resolution
from llm_diagnose.probes.traces.lengths import LengthHistogram, length_stats
from tests import trace_synthetic as synthetic


def _hist(values):
    h = LengthHistogram()
    h.add(values)
    return h


def test_length_stats_exact_on_a_known_sample():
    values = np.array([1] * 98 + [100, 1000])  # 98 short, two long
    s = length_stats(_hist(values), "trace")
    assert (s.p50, s.max, s.count) == (1.0, 1000, 100)
    assert s.mean == pytest.approx(11.98)
    assert s.cv == pytest.approx(np.std(values, ddof=1) / values.mean())
    assert s.top1pct_token_share == pytest.approx(1000 / 1198)
    assert s.top10pct_token_share == pytest.approx((1000 + 100 + 8) / 1198)
    assert s.tail_ratio == pytest.approx(np.percentile(values, 99))
    assert s.summary.n == 100 and s.summary.median == 1.0


def test_histogram_statistics_equal_those_of_the_sample():
    rng = np.random.default_rng(4)
    values = np.round(rng.lognormal(4, 1.2, 5001)).astype(int)
    values[:3] = [5_000_000, 7_000_000, 0]  # beyond the histogram, and zero
    s = length_stats(_hist(values), "trace")
    ref = Summary.from_samples(values.tolist())
    for name in ("n", "mean", "median", "stdev", "min", "max", "p05", "p95", "p99", "ci_low", "ci_high"):
        assert getattr(s.summary, name) == pytest.approx(getattr(ref, name)), name
    top = np.sort(values)[::-1]
    assert s.top10pct_token_share == pytest.approx(top[:501].sum() / values.sum())
    assert s.p90 == pytest.approx(np.percentile(values, 90))


@pytest.mark.parametrize("fmt", ["azure", "burstgpt"])
def test_heavy_tailed_outputs_and_quantised_arrivals(tmp_path, fmt):
    path = tmp_path / f"t.{fmt}.csv"
    _, inputs, outputs = synthetic.lengths_csv(path, n=3000, fmt=fmt, tick_s=3.0, output_cv=1.5)
    a = analyze_trace(path)
    assert a.output_tokens.cv == pytest.approx(np.std(outputs, ddof=1) / outputs.mean())
    assert a.output_tokens.p99 == pytest.approx(np.percentile(outputs, 99))
    assert a.input_tokens.p50 == pytest.approx(np.median(inputs))
    assert 1.0 < a.output_tokens.cv < 2.5  # heavy tail as generated
    arr = a.arrivals
    assert arr.resolution_s == pytest.approx(3.0)
    assert arr.interarrival_cv is None and "artefact" in arr.interarrival_note  # 3 s ticks, 1 s mean gap
    assert arr.dispersion_bin_s >= 3.0 and arr.dispersion_bin_s % 3.0 == pytest.approx(0.0)
    assert 0.7 < arr.dispersion < 1.4  # Poisson arrivals, seen at or above the tick
    assert arr.rate_mean_per_s == pytest.approx(1.0, rel=0.1)


def test_fine_timestamps_give_interarrival_cv():
    rng = np.random.default_rng(0)
    ts = np.round(np.cumsum(rng.exponential(1.0, 5000)), 3)  # millisecond clock, Poisson
    arr = arrival_stats(ts)
    assert arr.resolution_s == pytest.approx(0.001)
    assert arr.interarrival_cv == pytest.approx(1.0, abs=0.1)
    bursty = np.round(np.concatenate([np.sort(rng.uniform(k * 100, k * 100 + 5, 100)) for k in range(50)]), 3)
    assert arrival_stats(bursty).dispersion > 10


def test_resolution_survives_a_few_off_grid_values():
    ts = np.arange(0, 30_000, 3.0)
    ts[::500] += 0.25
    assert timestamp_resolution(np.sort(ts)) == pytest.approx(3.0)


def test_concurrency_from_completion_times():
    starts = np.array([0.0, 1.0, 2.0, 3.0])
    ends = starts + 2.0  # each lasts 2 s; at most 2 overlap
    arr = arrival_stats(starts, ends)
    assert arr.concurrency_mean == pytest.approx(8.0 / 5.0) and arr.concurrency_peak == 2
    assert arr.concurrency_source == "completion times"
    est = arrival_stats(starts, mean_output_tokens=100, assumed_tpot_s=0.02)
    assert est.concurrency_mean == pytest.approx(1.0 * 100 * 0.02) and est.concurrency_source.startswith("estimate")


def test_evidence_items_use_catalogue_keys_and_holes(tmp_path):
    path = tmp_path / "az.csv"
    synthetic.lengths_csv(path, n=500)
    items = trace_evidence(analyze_trace(path))
    assert isinstance(items[Q.OUTPUT_LEN_CV], Measurement) and items[Q.OUTPUT_LEN_CV].unit == "ratio"
    assert items[Q.OUTPUT_LEN_P50].summary is not None
    assert items[Q.OUTPUT_LEN_P50].provenance.method == "trace-analysis"
    assert items[Q.OUTPUT_LEN_P50].provenance.source == str(path)
    assert isinstance(items[Q.PREFIX_POTENTIAL], NotMeasured)
    assert isinstance(items[Q.CONCURRENCY_MEAN], NotMeasured) and "completion" in items[Q.CONCURRENCY_MEAN].reason
    for key in items:
        assert key in Q.CATALOGUE


def test_approximate_tokens_are_marked_in_evidence(tmp_path):
    path = tmp_path / "iso.jsonl"
    synthetic.dynamic_text_prompts(path, n=30)
    items = trace_evidence(analyze_trace(path))
    for key in (Q.PREFIX_POTENTIAL, Q.DYNAMIC_PREFIX_FRACTION, Q.INPUT_LEN_P50):
        assert any("approximation" in w for w in items[key].warnings), key
    assert isinstance(items[Q.PREFIX_AT_CAPACITY], NotMeasured)
    assert "kv-capacity-tokens" in items[Q.PREFIX_AT_CAPACITY].hint


def test_resolution_of_a_long_trace_from_its_sample():
    ts = np.round(np.cumsum(np.random.default_rng(2).exponential(2.0, 5_000_000)) / 3.0) * 3.0
    assert timestamp_resolution(ts) == pytest.approx(3.0)
