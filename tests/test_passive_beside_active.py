"""What the server served and what a controlled experiment measured, each under its own name
(issue 26, item 1): a failed experiment never erases the engine's figure, a measured one does
not replace it, and each question reads the one that answers it."""

from __future__ import annotations

from llm_diagnose.diagnose.collect import kept_apart
from llm_diagnose.diagnose.tree import diagnose
from llm_diagnose.diagnose.tree.controlled import CONTROLLED, preferred
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.experiments import EXPERIMENT_KEYS
from llm_diagnose.probes.metrics.passive import PASSIVE_KEYS
from llm_diagnose.probes.results import Measurement, NotMeasured, Provenance
from tests.evidence_builders import build

ENGINE = Provenance("prometheus-histogram", "http://127.0.0.1:1/metrics")
DECODE = Provenance("active-probe/decode", "http://127.0.0.1:1")
TIMED_OUT = NotMeasured("decode did not finish within its 9 s deadline", "run it again")


def test_the_experiments_publish_under_names_the_passive_window_does_not_use():
    active = {k for keys in EXPERIMENT_KEYS.values() for k in keys}
    assert not active & set(PASSIVE_KEYS)
    # Every controlled figure the tree may prefer is one an experiment publishes, for a served one the window does.
    assert set(CONTROLLED.values()) <= active and set(CONTROLLED) <= set(PASSIVE_KEYS)


def test_a_hole_from_an_experiment_never_erases_what_the_engine_measured():
    served = Measurement(0.009, "s", ENGINE, note="vLLM's ITL histogram over the window")
    items = {Q.ITL_P50: served, Q.KV_CAPACITY_TOKENS: Measurement(4096.0, "tokens", ENGINE)}
    batch1 = Measurement(0.006, "s", DECODE)
    kept = kept_apart(items, {Q.ITL_P50: TIMED_OUT, Q.DECODE_BATCH1_ITL_P50: batch1, Q.TTFT_P50: TIMED_OUT})
    assert Q.ITL_P50 not in kept  # the engine's figure stands
    assert kept[Q.DECODE_BATCH1_ITL_P50] is batch1 and kept[Q.TTFT_P50] is TIMED_OUT  # nothing to erase there
    # A measured active figure under a shared name still lands (a fact the experiment read again).
    again = Measurement(4096.0, "tokens", DECODE)
    assert kept_apart(items, {Q.KV_CAPACITY_TOKENS: again})[Q.KV_CAPACITY_TOKENS] is again


def _q5(items: dict):
    ev = build({Q.INTERACTIVE: True, **items})
    return ev, {a.question: a for a in diagnose(ev).answers}["Q5"]


def test_q5_reads_the_experiments_figure_where_it_measured_one_and_the_engines_where_it_did_not():
    served = Measurement(0.200, "s", ENGINE)  # slow: over q5.max_itl_p50_s
    fast = Measurement(0.004, "s", DECODE, samples=tuple(0.004 + i * 1e-5 for i in range(40)))
    ev, both = _q5({Q.ITL_P50: served, Q.DECODE_BATCH1_ITL_P50: fast})
    assert preferred(ev, Q.ITL_P50) == Q.DECODE_BATCH1_ITL_P50
    assert Q.DECODE_BATCH1_ITL_P50 in both.evidence and Q.ITL_P50 not in both.evidence
    assert both.answer == "no"  # one stream alone is fast
    ev, lost = _q5({Q.ITL_P50: served, Q.DECODE_BATCH1_ITL_P50: TIMED_OUT})
    assert preferred(ev, Q.ITL_P50) == Q.ITL_P50
    assert lost.answer == "yes" and Q.ITL_P50 in lost.evidence  # the engine's figure answers
    ev, none = _q5({Q.DECODE_BATCH1_ITL_P50: TIMED_OUT})
    assert none.answer == "unknown"
    assert any(m.evidence == Q.DECODE_BATCH1_ITL_P50 and "deadline" in m.reason for m in none.missing)


def test_drafts_are_judged_under_the_key_of_the_figure_read():
    from llm_diagnose.diagnose.tree.sanity import check

    spec = Provenance("active-probe/spec", "http://127.0.0.1:1")
    items = {
        Q.SPEC_DECODE: True,
        Q.SPEC_ACCEPTANCE_RATE: Measurement(0.9, "fraction", ENGINE),
        Q.SPEC_ACTIVE_ACCEPTANCE_RATE: Measurement(0.2, "fraction", spec),
    }
    d = diagnose(build(items))
    low = next(p for p in d.pitfalls if p.pitfall == "spec-decode-low-acceptance")
    compared = {c.evidence: c.value for c in low.comparisons}
    assert compared.get(Q.SPEC_ACTIVE_ACCEPTANCE_RATE) == 0.2 and Q.SPEC_ACCEPTANCE_RATE not in compared, compared
    # Counters while speculative decoding is reported off: a length alone is flagged, as a rate is.
    off = check(build({Q.SPEC_DECODE: False, Q.SPEC_ACCEPTANCE_LENGTH: 2.5}), Thresholds())
    assert any(f.key == Q.SPEC_ACCEPTANCE_LENGTH and "reported off" in f.problem for f in off), off
