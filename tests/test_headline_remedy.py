"""A headline that finds nothing measured says what would measure something, from what the run did."""

from __future__ import annotations

from llm_diagnose.diagnose.tree import diagnose
from llm_diagnose.diagnose.tree.remedy import DEFAULT_REMEDY
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.results import Fact, Measurement, Provenance
from tests.evidence_builders import build

RUN = Provenance("active-probe/run", "http://127.0.0.1:1")


def test_a_run_that_sent_nothing_is_told_how_to_measure():
    d = diagnose(build({Q.ENGINE_NAME: "vllm"}))
    assert d.headline_kind == "nothing-measured" and d.bottleneck.endswith(DEFAULT_REMEDY), d.bottleneck


def test_a_run_whose_experiments_ran_is_not_told_to_run_them():
    d = diagnose(build({Q.ENGINE_NAME: "vllm", Q.ACTIVE_REQUESTS_SENT: Measurement(40.0, "count", RUN)}))
    assert d.headline_kind == "nothing-measured"
    assert "run the experiments (--active)" not in d.bottleneck and "(--active) ran" in d.bottleneck, d.bottleneck


def test_a_plain_server_is_told_what_measures_the_engines_side():
    remedy = "the in-process PyTorch probe measures them: start it under `llm-diagnose instrument -- CMD ...`"
    kind = Fact("plain OpenAI-compatible server", Provenance("discovery", "http://127.0.0.1:1"), note=remedy)
    d = diagnose(build({Q.TARGET_KIND: kind, Q.ACTIVE_REQUESTS_SENT: Measurement(12.0, "count", RUN)}))
    assert d.headline_kind == "nothing-measured"
    assert "plain OpenAI-compatible server (no engine metrics)" in d.bottleneck and remedy in d.bottleneck
    assert "run the experiments (--active)" not in d.bottleneck
