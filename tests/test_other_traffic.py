"""Other clients' traffic during an active experiment (issue 26, item 3): counted at every scrape
from the server's own running and waiting gauges against this client's requests in flight, taken
once rather than waited out, and the prefix experiment's hits read from its own responses.

The pages are the real vLLM CPU page (tests/fixtures/metrics) with its gauges set: another
client's requests on a real engine, at the moment of a given scrape, cannot be arranged on demand.
The end-to-end check against a real vLLM with another client's streams is in
tests/test_shared_server_live.py.
"""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace

from llm_diagnose.diagnose.tree import diagnose
from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.experiments import common
from llm_diagnose.probes.experiments.common import ExperimentContext, ServerDelta
from llm_diagnose.probes.experiments.prefix import hits_from
from llm_diagnose.probes.load.records import RequestRecord
from llm_diagnose.probes.metrics.window import record_from_text
from llm_diagnose.probes.warning_codes import WarningCode, coded
from tests.evidence_builders import build, live
from tests.test_shared_server import IDLE_PAGE, vllm_page


def _context(pages: list[str], in_flight: int) -> tuple[ExperimentContext, list[int]]:
    """A context whose metrics reader answers `pages` in turn (then the last again), and the count of reads."""
    reads = [0]

    async def read():
        page = pages[min(reads[0], len(pages) - 1)]
        reads[0] += 1
        return record_from_text(1.7e9 + reads[0], 100.0 + reads[0], page, None, 0.01, "metrics")

    driver = SimpleNamespace(client=SimpleNamespace(in_flight=in_flight))
    ctx = ExperimentContext(driver, None, "http://127.0.0.1:1", "completions", None, metrics=read)  # type: ignore[arg-type]
    ctx.rng = random.Random(0)
    return ctx, reads


def test_requests_beyond_ours_are_other_traffic_and_the_page_is_taken_without_waiting(monkeypatch):
    monkeypatch.setattr(common, "SHARED_PAUSE_S", 0.0)
    # 5 running and 2 waiting, 3 of them ours: 4 of other clients, at both reads.
    ctx, reads = _context([vllm_page(5, 2)], in_flight=3)
    record = asyncio.run(ctx.scrape())
    assert record is not None and record.ok
    assert ctx.others_max == 4
    assert reads[0] == 2  # read, then once more: not the settle loop's up to 20 reads
    warning = ctx.other_traffic_warning()
    assert warning is not None and warning.startswith(Q.OTHER_TRAFFIC_WARNING) and "up to 4 request(s)" in warning


def test_our_own_requests_are_not_other_traffic():
    ctx, _ = _context([vllm_page(3, 0)], in_flight=3)
    assert asyncio.run(ctx.scrape()) is not None
    assert ctx.others_max == 0 and ctx.other_traffic_warning() is None


def test_a_straggler_gone_at_the_second_read_is_not_other_traffic(monkeypatch):
    monkeypatch.setattr(common, "SHARED_PAUSE_S", 0.0)
    monkeypatch.setattr(common, "SETTLE_PAUSE_S", 0.0)
    # One request still running at the first read (ours, just cancelled), none after: the settle loop goes on.
    ctx, reads = _context([vllm_page(1, 0), IDLE_PAGE], in_flight=0)
    assert asyncio.run(ctx.scrape()) is not None
    assert ctx.others_max == 0
    assert reads[0] >= 3  # the busy read, the idle one, and the settle loop's check that it stays put


def _record(i: int, prompt: int, cached: int | None) -> RequestRecord:
    return RequestRecord(
        f"r{i}", "prefix", "repeated", "", "completions", 0.0, 0.0, (0.01,), (), 0.02, 200, prompt, prompt, 4,
        cached, "length",
    )  # fmt: skip


def test_prefix_hits_come_from_the_responses_before_server_wide_counters():
    before = record_from_text(1.7e9, 100.0, IDLE_PAGE, None, 0.01, "m")
    after_page = IDLE_PAGE.replace(
        'vllm:prefix_cache_queries_total{engine="0",model_name="tiny-llama"} 13843.0',
        'vllm:prefix_cache_queries_total{engine="0",model_name="tiny-llama"} 23843.0',
    )
    assert after_page != IDLE_PAGE
    after = record_from_text(1.7e9 + 5, 105.0, after_page, None, 0.01, "m")
    delta = ServerDelta(before, after)
    ours = [_record(i, 300, 256) for i in range(4)]
    hits = hits_from(ours, delta, shared=True)
    assert (hits.queried, hits.hits) == (1200, 1024) and "responses" in hits.source
    # Without cached_tokens in the responses, the counters stand, and say whose they are.
    counted = hits_from([_record(i, 300, None) for i in range(4)], delta, shared=True)
    assert counted.queried == 10000 and counted.rate == 0.0
    assert "server-wide, other clients' prompts included" in counted.source
    assert "server-wide" not in hits_from([_record(0, 300, None)], delta, shared=False).source


# --- the tree: a verdict made beside other traffic says so, and is trusted less ----------------------
def _q3_evidence(warnings: tuple[str, ...]) -> Evidence:
    # Short requests wait 4x for long ones (a live, well-sampled figure): Q3 says yes.
    return build({Q.SHORT_WAIT_FOR_LONG: live(4.0, warnings=warnings), Q.CONTINUOUS_BATCHING: False})


def test_an_answer_read_from_an_experiment_beside_other_traffic_says_so_and_is_capped():
    shared = coded(
        WarningCode.OTHER_TRAFFIC, f"{Q.OTHER_TRAFFIC_WARNING} up to 4 request(s) of other clients were in flight"
    )
    alone = {a.question: a for a in diagnose(_q3_evidence(())).answers}["Q3"]
    beside = {a.question: a for a in diagnose(_q3_evidence((shared,))).answers}["Q3"]
    assert alone.answer == beside.answer == "yes"
    assert "beside other clients' traffic" not in alone.rationale
    assert "measured beside other clients' traffic on the server: " + Q.SHORT_WAIT_FOR_LONG in beside.rationale
    assert beside.confidence <= Thresholds()["confidence.other_traffic"] < alone.confidence


# --- the codes travel through the evidence file ----------------------------------------------------------
def test_a_warnings_code_survives_the_evidence_file_and_an_older_files_prose_gets_it_back():
    from llm_diagnose.probes.results import Measurement, Provenance
    from llm_diagnose.probes.warning_codes import CodedWarning, WarningCode, coded

    prov = Provenance("active-probe/decode", "http://127.0.0.1:1")
    shared = coded(WarningCode.OTHER_TRAFFIC, "the wording may change: the code is what the tree reads")
    m = Measurement(0.01, "s", prov, warnings=(shared, "a note for people"))
    again = Measurement.from_dict(m.to_dict())
    assert again.codes == {WarningCode.OTHER_TRAFFIC} and again.warnings == m.warnings
    assert m.to_dict()["warnings"][0] == {"code": "other-traffic", "text": str(shared)}
    # Written before the codes: plain text whose first words say which.
    old = {
        **m.to_dict(),
        "warnings": [f"{Q.CLIENT_STARVED_WARNING} event-loop lag p99 40 ms", "1 counter reset(s) in the window (x)"],
    }
    read = Measurement.from_dict(old)
    assert read.codes == {WarningCode.CLIENT_STARVED, WarningCode.COUNTER_RESET}
    assert all(isinstance(w, CodedWarning) for w in read.warnings)
    # The tree does not read the prose: the same words without the code change nothing.
    plain = build({Q.SHORT_WAIT_FOR_LONG: live(4.0, warnings=(f"{Q.OTHER_TRAFFIC_WARNING} same words",))})
    assert "beside other clients' traffic" not in {a.question: a for a in diagnose(plain).answers}["Q3"].rationale


def test_a_failed_second_read_keeps_the_first_page_and_its_count(monkeypatch):
    monkeypatch.setattr(common, "SHARED_PAUSE_S", 0.0)
    pages = [vllm_page(5, 2)]
    reads = [0]

    async def read():
        reads[0] += 1
        if reads[0] == 1:
            return record_from_text(1.7e9, 100.0, pages[0], None, 0.01, "metrics")
        return None  # the re-read failed

    ctx, _ = _context(pages, in_flight=3)
    ctx.metrics = read
    record = asyncio.run(ctx.scrape())
    assert record is not None and record.ok  # the good first page, not a lost scrape
    assert ctx.others_max == 4 and ctx.other_traffic_warning() is not None


def test_older_wordings_and_newer_codes_are_read_without_losing_the_figure():
    from llm_diagnose.probes.results import Measurement, Provenance
    from llm_diagnose.probes.warning_codes import WarningCode

    prov = Provenance("active-probe/decode", "http://127.0.0.1:1")
    base = Measurement(1.8, "ratio", prov).to_dict()
    old = {**base, "warnings": ["the client was starved (event-loop lag p99 40.0 ms, 0.90 cores): believe the server"]}
    assert Measurement.from_dict(old).codes == {WarningCode.CLIENT_STARVED}
    newer = {**base, "warnings": [{"code": "a-code-of-a-later-version", "text": "said by a newer tool"}]}
    read = Measurement.from_dict(newer)
    assert read.value == 1.8 and read.warnings == ("said by a newer tool",) and not read.codes
