"""Experiments sized from the server they meet (issue 26): pure sizing over a range of server speeds
and step budgets, the calibration that feeds it, and phases that survive a later overrun.

The sizing is a pure function of a calibration, the engine's limits and the budget, so it is
checked here against servers from 2 ms to 60 ms per token (a 1.45 M toy on a CPU up to a large
model on shared GPUs) and step budgets from 512 to 16,384 tokens without any server: no engine
on this host can be made to run at 60 ms per token with a 16k step budget on demand. The
overrun tests use a stand-in driver, since a real engine cannot be made to overrun at a chosen
phase of an experiment either.
"""

from __future__ import annotations

import asyncio
import functools
import math
import re
from dataclasses import replace

import pytest

from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.experiments import runner as E
from llm_diagnose.probes.experiments import sizing
from llm_diagnose.probes.experiments.calibration import calibration_from
from llm_diagnose.probes.experiments.common import ExperimentContext
from llm_diagnose.probes.experiments.plan import (
    ALL_EXPERIMENTS,
    CALIBRATION_REQUESTS,
    SETUP_REQUESTS,
    SETUP_RESERVE_S,
    DecodePlan,
    ExperimentPlan,
    HeterogeneityPlan,
    InterferencePlan,
    PrefixPlan,
    SpecPlan,
    describe_plan,
)
from llm_diagnose.probes.experiments.sizing import (
    LONG_OVER_STEP,
    MAX_LADDER_STREAMS,
    MIN_OVER_STEP,
    Calibration,
    EngineLimits,
    plan_experiments,
    size_experiments,
)
from llm_diagnose.probes.load.budget import ActiveBudget, BudgetGuard
from llm_diagnose.probes.load.faults import FaultKind
from llm_diagnose.probes.load.health import TargetHost
from llm_diagnose.probes.load.prompts import PromptMaker
from llm_diagnose.probes.load.records import JsonlWriter, RequestRecord, RequestSpec
from llm_diagnose.probes.results import Fact, Measurement, NotMeasured, Provenance, Result

SPEEDS_S = (0.002, 0.010, 0.025, 0.040, 0.060)
STEP_BUDGETS = (512, 2048, 8192, 16384)
# A prompt token prefills ~150x faster than an output token decodes: a 70B model on four GPUs
# decodes at ~25 ms and prefills ~6k tokens a second (0.17 ms a token).
PREFILL_RATIO = 150
LLAMA_70B = EngineLimits(max_num_seqs=256, step_tokens=8192, kv_capacity_tokens=None, max_model_len=32768)


def _sized(t: float, step: int, budget: ActiveBudget = ActiveBudget(), **limits) -> ExperimentPlan:
    lim = EngineLimits(**{"max_num_seqs": 256, "step_tokens": step, "max_model_len": 32768, **limits})
    return size_experiments(Calibration(t, t / PREFILL_RATIO, "test"), lim, budget)


def _calibration_s(t: float) -> float:
    return 512 * t / PREFILL_RATIO + 24 * t  # what size_experiments charges for the calibration request


# --- the grid ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("step", STEP_BUDGETS)
@pytest.mark.parametrize("t", SPEEDS_S)
def test_every_experiment_fits_the_default_budget(t, step):
    plan = _sized(t, step)
    budget = ActiveBudget()
    assert not plan.skipped, plan.skipped
    assert [n for n, _ in plan.steps] == list(ALL_EXPERIMENTS)
    assert plan.requests + SETUP_REQUESTS + CALIBRATION_REQUESTS <= budget.max_requests
    assert sum(p.time_cap_s for _, p in plan.steps) <= budget.max_seconds - SETUP_RESERVE_S - _calibration_s(t)


@pytest.mark.parametrize("step", STEP_BUDGETS)
@pytest.mark.parametrize("t", SPEEDS_S)
def test_every_deadline_covers_its_work_at_the_measured_speed(t, step):
    """The fixed 6 s prefix cap and 8 s decode cap a 25 ms server overran are gone: each deadline
    holds at least the time its own requests take at the calibrated speed, counted here from the
    plan's sizes alone."""
    p = t / PREFILL_RATIO
    steps = dict(_sized(t, step).steps)
    decode = steps["decode"]
    assert isinstance(decode, DecodePlan)
    stream = decode.output_tokens * t
    work = (decode.batch1_requests + decode.batch1_after_requests + len(decode.concurrency_levels)) * stream
    assert decode.time_cap_s >= work
    # The closing batch-1 requests keep their time (at 38 ms a token they once had none left).
    assert decode.closing_s is not None and decode.closing_s >= decode.batch1_after_requests * stream
    inter = steps["interference"]
    assert isinstance(inter, InterferencePlan)
    lengths = inter.prompt_tokens  # alternated, one injection at a time
    prefills = sum(lengths[k % len(lengths)] for k in range(inter.injections)) * p
    assert inter.time_cap_s >= inter.baseline_s + prefills
    het = steps["heterogeneity"]
    assert isinstance(het, HeterogeneityPlan)
    rounds = het.alone_rounds + 2 * (het.warmup_rounds + het.rounds)
    assert het.time_cap_s >= rounds * het.short_tokens * t
    prefix = steps["prefix"]
    assert isinstance(prefix, PrefixPlan)
    assert prefix.time_cap_s >= prefix.requests * prefix.prefix_tokens * p
    spec = steps["spec"]
    assert isinstance(spec, SpecPlan)
    assert spec.time_cap_s >= spec.requests * spec.output_tokens * t


@pytest.mark.parametrize("step", STEP_BUDGETS)
@pytest.mark.parametrize("t", SPEEDS_S)
def test_the_decode_ladder_climbs_to_the_engines_limit_as_the_budget_allows(t, step):
    top = min(256, MAX_LADDER_STREAMS, step)  # max_num_seqs 256; one token a stream in a step
    for budget in (ActiveBudget(), ActiveBudget(max_requests=2000, max_seconds=3600)):
        decode = dict(_sized(t, step, budget).steps)["decode"]
        assert isinstance(decode, DecodePlan)
        levels = decode.concurrency_levels
        assert list(levels) == sorted(set(levels)) and levels[0] == 2 and levels[-1] <= top
        if levels[-1] < top:  # stopped short: the plan says the budget stopped it
            assert any("the budget has no room for more" in w for w in decode.why), decode.why
    assert levels[-1] == top  # with room, it reaches min(max_num_seqs, 256)


@pytest.mark.parametrize("step", STEP_BUDGETS)
@pytest.mark.parametrize("t", SPEEDS_S)
@pytest.mark.parametrize("max_model_len", (2048, 32768))
def test_interference_prompts_sit_below_and_well_above_the_step_budget(t, step, max_model_len):
    plan = _sized(t, step, max_model_len=max_model_len)
    inter = plan.step("interference")
    assert isinstance(inter, InterferencePlan)
    short, long_ = inter.prompt_tokens
    assert short < long_ < max_model_len  # each clipped by the context (with its output token)
    assert inter.step_tokens == step
    if inter.tests_chunking:
        assert short <= 0.9 * step and long_ >= MIN_OVER_STEP * step
        assert any("which the engine must chunk" in w for w in inter.why), inter.why
        if long_ < LONG_OVER_STEP * step:  # held below the wanted 3 budgets: the plan says by what
            assert any("allows no more" in w for w in inter.why), inter.why
    else:  # no room for a prompt well above the budget: said, both fit one step, no claim about chunking
        assert long_ < step
        why = next(w for w in inter.why if w.startswith("prompts of"))
        assert "is not tested" in why and ("max_model_len" in why or "of the time" in why), why
    if max_model_len == 32768 and step <= 8192 and t <= 0.025:
        assert inter.tests_chunking, (t, step, inter.why)  # room enough: chunking is tested


def test_the_toy_server_the_live_tests_use_keeps_their_sizes():
    """2 ms per token, max_model_len 2048, vLLM CPU's default step budget (2048, not stated by the
    server): what tests/test_small_model_live.py, test_cli_run_demo.py and test_busy_host_live.py run."""
    cal = Calibration(0.002, 0.00002, "tiny vLLM on CPU", spent_s=0.5)
    lim = EngineLimits(max_model_len=2048)
    decode_only = size_experiments(cal, lim, ActiveBudget(100, 30), ("decode",))
    decode = decode_only.step("decode")
    assert isinstance(decode, DecodePlan) and not decode_only.skipped
    assert decode.batch1_requests * (decode.output_tokens - 1) >= 50  # test_experiments asserts p50.n >= 50
    assert decode.requests + 2 <= 100 and len(decode.concurrency_levels) >= 2
    assert any("step token budget (max_num_batched_tokens) is not stated" in n for n in decode_only.notes)
    inter = size_experiments(cal, lim, ActiveBudget(100, 30), ("interference",)).step("interference")
    assert isinstance(inter, InterferencePlan)
    assert max(inter.prompt_tokens) <= 2048 - 8 and inter.min_prefills >= 3  # the live test wants 3 done
    cli = size_experiments(cal, lim, ActiveBudget(40, 25), ("decode", "prefix"))
    assert not cli.skipped and cli.requests + 2 <= 40  # test_cli_run_demo's budget


def test_a_kv_cache_and_a_small_context_bound_the_sizes():
    plan = _sized(0.010, 2048, kv_capacity_tokens=20_000, max_model_len=4096)
    decode, inter = plan.step("decode"), plan.step("interference")
    assert isinstance(decode, DecodePlan) and isinstance(inter, InterferencePlan)
    assert decode.concurrency_levels[-1] * (decode.prompt_tokens + decode.output_tokens) <= 20_000
    assert max(inter.prompt_tokens) <= 10_000  # half the KV cache: the streams keep the rest
    lengths = [getattr(p, f, 0) for _, p in plan.steps for f in ("prefix_tokens", "long_tokens", "output_tokens")]
    assert all(n < 4096 for n in lengths)


def test_a_budget_too_small_says_what_would_let_an_experiment_run():
    """The hint is the least budget that runs the experiment, found by sizing again: one second or
    one request less still leaves it out, so 'raise --budget-seconds' is never a guess."""
    plan = _sized(0.060, 8192, ActiveBudget(max_requests=200, max_seconds=20))
    assert plan.skipped
    for name, why, hint in plan.skipped:
        assert "per token" in why and hint.startswith("raise --budget-seconds to at least "), hint
        needed = int(hint.rsplit(" ", 1)[1])
        assert name in dict(_sized(0.060, 8192, ActiveBudget(200, needed)).steps)
        assert name not in dict(_sized(0.060, 8192, ActiveBudget(200, needed - 1)).steps)
    tiny = _sized(0.002, 2048, ActiveBudget(max_requests=6, max_seconds=60))
    assert tiny.requests <= 6 - 2 and tiny.skipped
    for name, _, hint in tiny.skipped:
        assert hint.startswith("raise --budget-requests to at least "), hint
        needed = int(hint.rsplit(" ", 1)[1])
        assert name in dict(_sized(0.002, 2048, ActiveBudget(needed, 60)).steps)
        assert name not in dict(_sized(0.002, 2048, ActiveBudget(needed - 1, 60)).steps)


def test_limits_come_from_the_engines_own_facts():
    prov = Provenance("http-get", "http://x/server_info")
    facts: dict[str, Result] = {
        Q.MAX_NUM_SEQS: Fact(64, prov),
        Q.MAX_NUM_BATCHED_TOKENS: Fact(4096, prov),
        Q.KV_CAPACITY_TOKENS: Measurement(500_000.0, "tokens", prov),
        Q.TENSOR_PARALLEL: Fact(4, prov),
    }
    lim = EngineLimits.from_evidence(facts, max_model_len=8192)
    assert (lim.max_num_seqs, lim.step_tokens, lim.kv_capacity_tokens, lim.max_model_len) == (64, 4096, 500_000, 8192)
    plan = size_experiments(Calibration(0.002, 2e-5, "x"), lim, ActiveBudget(2000, 600))
    decode = plan.step("decode")
    assert isinstance(decode, DecodePlan) and decode.concurrency_levels[-1] == 64  # max_num_seqs caps the ladder
    assert "step budget 4096 tokens (stated" in plan.sized_from
    # A step budget nobody states, but the iteration histogram saw steps over 4096 tokens: at least that.
    seen = EngineLimits.from_evidence({Q.STEP_TOKENS_MAX: Measurement(4097, "tokens", prov)})
    inter = size_experiments(Calibration(0.002, 2e-5, "x"), seen, ActiveBudget(2000, 600)).step("interference")
    assert isinstance(inter, InterferencePlan) and inter.step_tokens == 4097


def test_the_provisional_plan_says_it_is_sized_again_from_the_calibration():
    plan = plan_experiments(ActiveBudget(), max_model_len=4096, target="http://127.0.0.1:8000")
    text = describe_plan(plan)
    assert plan.provisional and "calibration request" in text and "assumed" in plan.sized_from
    assert "at most" in text and "(the POST /tokenize and the calibration request below included)" in text
    reasons = describe_plan(plan, reasons=True)
    assert reasons.count("why: deadline") == len(plan.steps)


# --- the calibration --------------------------------------------------------------------------------
def _record(times: list[float], prompt_tokens: int | None, planned: int = 512, **kw) -> RequestRecord:
    return RequestRecord(
        "calibration-0",
        "calibration",
        "calibration",
        "",
        "completions",
        0.0,
        0.0,
        tuple(times),
        t_end=times[-1] if times else 0.0,
        finish_reason="length",
        prompt_tokens=prompt_tokens,
        planned_prompt_tokens=planned,
        completion_tokens=len(times),
        **kw,
    )


def test_the_calibration_reads_time_per_token_and_prefill_per_token():
    ttft, gap = 0.120, 0.025  # 512 prompt tokens prefilled in ~95 ms; 25 ms a token after that
    cal = calibration_from(_record([ttft + gap * k for k in range(24)], 512), spent_s=1.0)
    assert cal.measured and cal.time_per_token_s == pytest.approx(gap)
    assert cal.prefill_s_per_token == pytest.approx((ttft - gap) / 512)
    assert cal.spent_s == 1.0 and "as the server counted them" in cal.source
    failed = calibration_from(_record([], None, fault=FaultKind.CONNECTION_LOST), spent_s=0.2)
    assert not failed.measured and "assumed" in failed.source
    refused = calibration_from(None, spent_s=0.0)
    assert not refused.measured and "budget refused" in refused.source


def test_usage_prompt_tokens_correct_text_prompts_without_tokenize():
    guessed = PromptMaker()  # no /tokenize: 1.3 tokens per word assumed
    corrected = guessed.corrected(900, 400, "the calibration request")
    assert corrected.tokens_per_word == pytest.approx(2.25)
    assert "corrected from usage.prompt_tokens" in corrected.source and "before: uncalibrated" in corrected.source
    import random

    body = corrected.body(900, random.Random(1))
    assert isinstance(body, str) and len(body.split()) == 400  # the next prompts are sized by the server's count
    nonsense = guessed.corrected(7, 400, "the calibration request")  # a gateway's wrong usage
    assert nonsense.tokens_per_word == guessed.tokens_per_word and "not used" in nonsense.source
    exact = PromptMaker(token_pool=(5, 6, 7))
    assert exact.corrected(900, 400, "x") is exact  # token ids are exact already


# --- phases that survive a later overrun -------------------------------------------------------------
class _Client:
    def counters(self) -> tuple[int, float]:
        return 0, 0.0


class _StandInDriver:
    """A driver whose requests answer at once with 20 tokens 2 ms apart, except where told to hang.

    `hang_phases`: requests of these phases never finish on their own (a stream still running);
    `stuck_stop`: stop_all for a reason containing it never returns (the phase overruns its
    deadline, so the experiment's safety timeout fires)."""

    def __init__(self, guard: BudgetGuard, hang_phases: tuple[str, ...] = (), stuck_stop: str = "") -> None:
        self.guard = guard
        self.records: list[RequestRecord] = []
        self.hang_phases = hang_phases
        self.stuck_stop = stuck_stop
        self._tasks: set[asyncio.Task] = set()

    def _record(self, spec: RequestSpec, tokens: int, fault: FaultKind | None, detail: str = "") -> RequestRecord:
        times = tuple(0.01 + 0.002 * k for k in range(tokens))
        record = RequestRecord(
            spec.request_id,
            spec.experiment,
            spec.phase,
            spec.tag,
            "completions",
            0.0,
            0.0,
            times,
            t_end=times[-1],
            finish_reason=None if fault else "length",
            fault=fault,
            fault_detail=detail,
        )
        self.records.append(record)
        return record

    async def send(self, spec: RequestSpec, **_: object) -> RequestRecord | None:
        if not await self.guard.admit():
            return None
        if spec.phase in self.hang_phases:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError as exc:
                self._record(spec, 5, FaultKind.STOPPED_BY_CLIENT, str(exc.args[0]) if exc.args else "")
                raise
        await asyncio.sleep(0)
        return self._record(spec, 20, None)

    def start(self, spec: RequestSpec, **_: object) -> asyncio.Task:
        return self.start_coroutine(self.send(spec))

    def start_coroutine(self, coro) -> asyncio.Task:  # noqa: ANN001 - any coroutine
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def stop_all(self, reason: str) -> None:
        if self.stuck_stop and self.stuck_stop in reason:
            await asyncio.sleep(3600)
        tasks = [t for t in self._tasks if not t.done()]
        for t in tasks:
            t.cancel(reason)
        await asyncio.gather(*tasks, return_exceptions=True)

    def records_of(self, experiment: str, phase: str | None = None) -> list[RequestRecord]:
        return [r for r in self.records if r.experiment == experiment and (phase is None or r.phase == phase)]

    def attempt_id(self, request_id: str) -> str:
        return request_id


# The safety timeout fires GRACE_S after the budget's deadline (less the later experiments' reserve:
# none here), not after the experiment's own 1 s one. On a 60 s budget an overrun waited 62 s of
# real time; 1.5 s keeps that slack past the experiment's deadline and brings the overrun at 3.5 s.
OVERRUN_BUDGET = ActiveBudget(100, 1.5)
# The stand-in hangs for an hour where told to: an attempt that the safety timeout does not end
# fails here instead of hanging the suite (ten times the 3.5 s it takes, for a busy host).
HANG_GUARD_S = 35.0


async def _attempt_bounded(plan: DecodePlan, ctx: ExperimentContext, guard: BudgetGuard):
    try:
        async with asyncio.timeout(HANG_GUARD_S):
            return await E._attempt("decode", plan, ctx, guard, _Client(), TargetHost(True))  # type: ignore[arg-type]
    except TimeoutError:
        pytest.fail(f"the attempt was not ended by its safety timeout within {HANG_GUARD_S:g} s")


def _attempt(tmp_path, driver_kw: dict, plan: DecodePlan, metrics=None):
    events = JsonlWriter(tmp_path / "events.jsonl")
    guard = BudgetGuard(OVERRUN_BUDGET)
    driver = _StandInDriver(guard, **driver_kw)
    ctx = ExperimentContext(driver, PromptMaker(), "test", "completions", events, metrics)  # type: ignore[arg-type]
    outcome, _, _ = asyncio.run(_attempt_bounded(plan, ctx, guard))
    events.close()
    return outcome, ctx, driver


def test_batch_one_survives_when_a_later_decode_phase_overruns(tmp_path):
    """Before: one phase past the deadline fired the safety timeout, and every decode key became
    'not measured', batch 1 included. Now batch 1, done before the overrun, keeps its figures."""
    plan = DecodePlan(batch1_requests=3, output_tokens=20, concurrency_levels=(2,), time_cap_s=1.0, closing_s=0.2)
    outcome, ctx, _ = _attempt(tmp_path, {"hang_phases": ("concurrency-2",), "stuck_stop": "concurrency"}, plan)
    p50 = outcome.results[Q.DECODE_BATCH1_ITL_P50]
    assert isinstance(p50, Measurement) and p50.value == pytest.approx(0.002) and p50.n == 3 * 19
    growth = outcome.results[Q.DECODE_ITL_GROWTH]
    assert isinstance(growth, NotMeasured) and "did not finish within its 1 s deadline" in growth.reason
    assert "run it again" in growth.hint
    assert any("the phases it completed are kept" in n for n in ctx.notes)


def test_a_phase_overrun_with_nothing_completed_says_so(tmp_path):
    reads: list[int] = []

    async def metrics():  # the experiment's own first scrape never answers: it overruns before batch 1
        reads.append(1)
        if len(reads) > 1:
            await asyncio.sleep(3600)

    plan = DecodePlan(batch1_requests=3, output_tokens=20, concurrency_levels=(2,), time_cap_s=1.0, closing_s=0.2)
    outcome, _, driver = _attempt(tmp_path, {}, plan, metrics)
    assert not driver.records
    assert all(isinstance(r, NotMeasured) for r in outcome.results.values())
    assert "did not finish within its 1 s deadline" in outcome.results[Q.DECODE_BATCH1_ITL_P50].reason


def test_the_closing_batch_one_is_stopped_at_the_phase_deadline_and_kept(tmp_path):
    """The request that lost the whole decode experiment at 38 ms a token: the closing batch-1 one,
    bounded only by the run's deadline. It now stops at the experiment's own deadline, before the
    safety timeout, keeping the tokens it had."""
    plan = DecodePlan(batch1_requests=3, output_tokens=20, concurrency_levels=(2,), time_cap_s=1.0, closing_s=0.2)
    outcome, ctx, driver = _attempt(tmp_path, {"hang_phases": ("batch-1-after",)}, plan)
    assert not any("overran" in n for n in ctx.notes)
    closing = driver.records_of("decode", "batch-1-after")
    assert closing and closing[0].fault is FaultKind.STOPPED_BY_CLIENT and "deadline" in closing[0].fault_detail
    assert isinstance(outcome.results[Q.DECODE_ITL_GROWTH], Measurement)
    assert math.isfinite(outcome.results[Q.DECODE_BATCH1_ITL_P50].value)


# --- the hint for a left-out experiment holds at every larger budget ------------------------------
# The slow server of tests/test_experiments_leftover.py: tiny-llama on vLLM on a busy 2-core CPU,
# 55 ms per output token, 1.95 ms per prompt token, 2 s spent on the set-up and the calibration.
# The others: the grid's servers with a 512- and an 8192-token step budget. At these budgets each
# leaves experiments out, and a larger budget leaves one out again here and there (55, 25 and 100 ms
# at 15 and 20 s; all of them at 12 requests); at 100 ms and 12 requests heterogeneity needs both.
HINT_SERVERS: dict[str, tuple[Calibration, EngineLimits]] = {
    "55ms-busy-cpu": (
        Calibration(0.055, 0.00195, "a busy CPU server's speed", spent_s=2.0),
        EngineLimits(max_model_len=2048, kv_capacity_tokens=43_648),
    ),
    **{
        f"{t * 1e3:g}ms-step{step}": (
            Calibration(t, t / PREFILL_RATIO, "test"),
            EngineLimits(max_num_seqs=256, step_tokens=step, max_model_len=32768),
        )
        for t in (0.002, 0.025, 0.100)
        for step in (512, 8192)
    },
}
HINT_BUDGETS = (ActiveBudget(200, 15), ActiveBudget(200, 20), ActiveBudget(12, 60))
HINT_CHECKED_ABOVE = 30  # budgets checked above each hint: past the holes these servers have


def _hint(plan: ExperimentPlan, name: str) -> int:
    hint = {n: h for n, _, h in plan.skipped}[name]
    return int(hint.rsplit(" ", 1)[1])


@functools.cache
def _planned_at(server: str, budget: ActiveBudget) -> frozenset[str]:
    return frozenset(n for n, _ in size_experiments(*HINT_SERVERS[server], budget).steps)


def test_the_seconds_hint_holds_where_a_larger_budget_leaves_the_experiment_out_again():
    """Planning is not monotone in the budget: at 55 ms a token spec is planned at 51-56 s, left out
    at 57-62 s (prefix then fits at its floor, before spec, and takes its time) and planned again
    from 63 s. The hint at 45 s said 'at least 51', untrue at 57; it is now the least budget from
    which every larger one plans spec."""
    planned = {x: _planned_at("55ms-busy-cpu", ActiveBudget(200, x)) for x in range(45, 200)}
    assert "spec" in planned[51] and "spec" not in planned[57] and "prefix" in planned[57]  # the hole is there
    plan = size_experiments(*HINT_SERVERS["55ms-busy-cpu"], ActiveBudget(200, 45))
    for name in ("prefix", "spec"):
        least = _hint(plan, name)
        assert all(name in planned[x] for x in range(least, 200)), (name, least)
        assert name not in planned[least - 1], (name, least)
    assert (_hint(plan, "prefix"), _hint(plan, "spec")) == (57, 63)


@pytest.mark.parametrize("budget", HINT_BUDGETS, ids=lambda b: f"{b.max_requests}req-{b.max_seconds:g}s")
@pytest.mark.parametrize("server", HINT_SERVERS)
def test_every_budget_from_the_hint_up_plans_the_experiment(server, budget):
    """For each left-out experiment, every budget from the hint's figure to HINT_CHECKED_ABOVE past it
    (whole seconds or requests, the other bound as it was) plans it, and one less does not; where the
    hint raises both, budgets at least as large in both bounds plan it."""
    plan = size_experiments(*HINT_SERVERS[server], budget)
    assert plan.skipped
    for name, _, hint in plan.skipped:
        figures = [int(f) for f in re.findall(r"[0-9]+", hint)]
        if hint.startswith("raise --budget-requests to at least ") and "--budget-seconds" in hint:
            requests, seconds = figures
            larger = [
                ActiveBudget(n, x)
                for n in (requests, requests + HINT_CHECKED_ABOVE)
                for x in range(seconds, seconds + HINT_CHECKED_ABOVE)
            ]
            assert not [b for b in larger if name not in _planned_at(server, b)], (name, hint)
            continue
        assert hint.startswith(("raise --budget-seconds to at least ", "raise --budget-requests to at least ")), hint
        bound = "max_seconds" if "--budget-seconds" in hint else "max_requests"
        (least,) = figures
        left_out = [
            v
            for v in range(least, least + HINT_CHECKED_ABOVE)
            if name not in _planned_at(server, replace(budget, **{bound: v}))
        ]
        assert not left_out, (name, hint, left_out)
        assert name not in _planned_at(server, replace(budget, **{bound: least - 1})), (name, hint)


def test_a_floor_never_shrinks_as_the_budget_grows():
    """What the hint's argument rests on (sizing._kept_between): a larger budget never sizes an
    experiment's floor smaller, in requests or in time. Interference's does grow with the time left
    (one long prefill may take 8% of it) until the step budget or the context bounds its prompts:
    by 400 s for these servers."""
    rooms = [*range(0, 400), 1000, 5000, 86400]
    grew = set()
    for server, (calibration, limits) in HINT_SERVERS.items():
        fits = [sizing._fit(sizing._resolve(calibration, limits, r), 200, r, list(ALL_EXPERIMENTS)) for r in rooms]
        for name in ALL_EXPERIMENTS:
            floors = [f.floors[name] for f in fits]
            shrunk = [(r, a, b) for r, a, b in zip(rooms, floors, floors[1:]) if b[0] < a[0] or b[1] < a[1]]
            assert not shrunk, (server, name, shrunk[:3])
            if floors[0] != floors[-1]:
                grew.add(name)
    assert grew == {"interference"}  # the one that depends on the budget: checked, not assumed constant
