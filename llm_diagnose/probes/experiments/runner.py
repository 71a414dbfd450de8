"""Runs the active experiments within one budget: the calibration, the sizing, each experiment in
its time cap (once more for a starved client), those the plan left out sized again in what the
others left unused, what an overrun keeps, and the evidence they give. The package's docstring
shows the calls; this module holds them."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.experiments import agreement
from llm_diagnose.probes.experiments.calibration import (
    CALIBRATION_SHARE,
    calibrate,
    calibration_results,
    engine_limits,
)
from llm_diagnose.probes.experiments.common import (
    ExperimentContext,
    ExperimentOutcome,
    MetricsReader,
    ServerDelta,
    burst_warning,
    gaps_of,
    not_measured,
    with_warnings,
)
from llm_diagnose.probes.experiments.decode import KEYS as DECODE_KEYS
from llm_diagnose.probes.experiments.decode import run_decode
from llm_diagnose.probes.experiments.heterogeneity import KEYS as HETEROGENEITY_KEYS
from llm_diagnose.probes.experiments.heterogeneity import run_heterogeneity
from llm_diagnose.probes.experiments.interference import KEYS as INTERFERENCE_KEYS
from llm_diagnose.probes.experiments.interference import run_interference
from llm_diagnose.probes.experiments.plan import ALL_EXPERIMENTS, ExperimentPlan, StepPlan, describe_plan
from llm_diagnose.probes.experiments.prefix import KEYS as PREFIX_KEYS
from llm_diagnose.probes.experiments.prefix import run_prefix
from llm_diagnose.probes.experiments.sizing import Calibration, EngineLimits, plan_experiments, size_experiments
from llm_diagnose.probes.experiments.spec import KEYS as SPEC_KEYS
from llm_diagnose.probes.experiments.spec import run_spec
from llm_diagnose.probes.http import ProbeHTTPError, get_json, make_session, normalize_base_url, redact_url
from llm_diagnose.probes.load.active_run import input_recorder, run_summary, run_writers
from llm_diagnose.probes.load.budget import ActiveBudget, BudgetGuard
from llm_diagnose.probes.load.client import StreamingClient, StreamTimeouts
from llm_diagnose.probes.load.health import ClientHealth, HealthWindow, TargetHost
from llm_diagnose.probes.load.prompts import PromptMaker, calibrate_prompts
from llm_diagnose.probes.load.records import Endpoint
from llm_diagnose.probes.load.runner import Driver
from llm_diagnose.probes.results import Fact, Measurement, NotMeasured, Provenance, Result

if TYPE_CHECKING:
    from llm_diagnose.probes.metrics.window import ScrapeRecord

__all__ = ["EXPERIMENT_KEYS", "prepare_plan", "run_experiments", "metrics_reader", "discover_model"]

EXPERIMENT_KEYS: dict[str, tuple[str, ...]] = {
    "decode": DECODE_KEYS,
    "interference": INTERFERENCE_KEYS,
    "heterogeneity": HETEROGENEITY_KEYS,
    "prefix": PREFIX_KEYS,
    "spec": SPEC_KEYS,
}
# Each runner takes its own plan type: `step` is the plan of the experiment named.
_RUNNERS: dict[str, Callable[[ExperimentContext, Any, float], Awaitable[ExperimentOutcome]]] = {
    "decode": run_decode,
    "interference": run_interference,
    "heterogeneity": run_heterogeneity,
    "prefix": run_prefix,
    "spec": run_spec,
}
GRACE_S = 2.0  # past an experiment's cap, the safety net cancels it (it should have stopped itself)


async def discover_model(session: aiohttp.ClientSession, base_url: str) -> tuple[str | None, int | None]:
    """The first served model's name and its max_model_len, from GET /v1/models.

    Raises:
        TargetUnreachable, HTTPStatusError, NotAnLLMServer: as llm_diagnose.probes.http.get_json.
    """
    answer = await get_json(session, base_url + "/v1/models")
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        return None, None
    max_len = data[0].get("max_model_len")
    return data[0].get("id"), int(max_len) if isinstance(max_len, int) else None


async def prepare_plan(
    base_url: str,
    model: str | None,
    budget: ActiveBudget,
    experiments: tuple[str, ...] = ALL_EXPERIMENTS,
    *,
    endpoint: Endpoint = "completions",
) -> ExperimentPlan:
    """The provisional plan for this server (its max_model_len from GET /v1/models), sized at an
    assumed speed; sends no load. run_experiments sizes it again from its calibration request."""
    base = normalize_base_url(base_url)
    async with make_session() as session:
        try:
            served, max_len = await discover_model(session, base)
        except ProbeHTTPError:
            served, max_len = None, None  # run_experiments will meet the same failure and record it
    return plan_experiments(
        budget,
        experiments,
        max_model_len=max_len,
        endpoint=endpoint,
        target=redact_url(base),
        model=model or served or "",
    )


def metrics_reader(session: aiohttp.ClientSession, metrics_url: str) -> MetricsReader:
    """A MetricsReader over llm_diagnose.probes.metrics' scrape_once (one GET per call, never raises)."""
    from llm_diagnose.probes.metrics.scraper import scrape_once

    async def read() -> ScrapeRecord | None:
        record, _, _ = await scrape_once(session, metrics_url)
        return record

    return read


async def run_experiments(
    base_url: str,
    model: str | None,
    budget: ActiveBudget,
    run_dir: str | Path | None,
    *,
    metrics_scraper: MetricsReader | None = None,
    metrics_url: str | None = None,
    experiments: tuple[str, ...] = ALL_EXPERIMENTS,
    plan: ExperimentPlan | None = None,
    endpoint: Endpoint = "completions",
    timeouts: StreamTimeouts = StreamTimeouts(),
    on_result: Callable[[str, dict[str, Result]], None] | None = None,
    seed: int | None = None,
    engine_facts: Mapping[str, Result] | None = None,
) -> dict[str, Result]:
    """Run the planned experiments within `budget`; evidence items keyed by quantity.

    A provisional `plan` (from prepare_plan, already printed), or none, is sized here from one
    calibration request and the engine's limits (`engine_facts`: discovery's facts, such as
    max_num_seqs; the metrics page adds the KV capacity), within the same budget; the sized plan
    and why each size was chosen go to events.jsonl ('experiments-sized'). The time caps are upper
    bounds and experiments often end early: after the planned ones, those the plan left out are
    sized again by the same fit in the time and requests really left, and those that now fit run
    ('experiments-resized'); the rest keep their "did not run". A plan that is not provisional
    (built by hand) is run as it is, with no calibration. `metrics_scraper` (or
    `metrics_url`, read with this run's session) gives the server's counters before and after
    each experiment. `on_result(name, results)` sees each experiment's results as they come,
    for a partial diagnosis if the run is interrupted. The budget's clock starts here: set-up
    calls count against its time; the POST /tokenize and the calibration request each take one
    of its requests (GET /v1/models and scrapes are read-only).
    """
    guard = BudgetGuard(budget)
    base = normalize_base_url(base_url)
    source = redact_url(base)
    requests_out, events_out, inputs_out = run_writers(run_dir)
    results: dict[str, Result] = {}
    host = TargetHost.of(base)
    try:
        async with StreamingClient(base, model or "", timeouts=timeouts) as client:
            client.on_body = input_recorder(inputs_out, time.perf_counter())
            notes: list[str] = []
            max_len: int | None = None
            if not model or plan is None:
                try:
                    served, max_len = await discover_model(client.session, base)
                except ProbeHTTPError as exc:
                    served, max_len = None, None
                    notes.append(str(exc))
                client.model = model or served or ""
            if await guard.admit():  # the POST /tokenize leaves the client: it takes a budget slot
                prompts, tokenizer_max_len = await calibrate_prompts(client.session, base, client.model)
            else:
                prompts, tokenizer_max_len = (
                    PromptMaker(
                        source="uncalibrated: the request budget had no slot left for POST /tokenize; about 1.3 "
                        "tokens per word assumed"
                    ),
                    None,
                )
            context_len = max_len or tokenizer_max_len or (plan.max_model_len if plan is not None else None)
            sizing = plan is None or plan.provisional  # a hand-built plan runs as it is, uncalibrated
            if plan is None:
                plan = plan_experiments(
                    budget, experiments, max_model_len=context_len, endpoint=endpoint, target=source, model=client.model
                )
            if metrics_scraper is None and metrics_url:
                metrics_scraper = metrics_reader(client.session, metrics_url)
            driver = Driver(client, guard, requests_out)
            ctx = ExperimentContext(
                driver,
                prompts,
                source,
                plan.endpoint,
                events_out,
                metrics_scraper,
                context_len,
                random.Random(seed),
                notes,
            )
            events_out.event(
                "run-start",
                target=source,
                model=client.model,
                budget=budget.describe(),
                prompts=prompts.describe(),
                plan=describe_plan(plan),
            )
            fit: tuple[Calibration, EngineLimits] | None = None  # what the plan was sized from
            if sizing:
                plan, calibration, limits = await _size(ctx, plan, guard, engine_facts, context_len)
                results.update(calibration_results(calibration, source))
                fit = (calibration, limits)
            side_by_side: dict[str, list[agreement.SideBySide]] = {}  # client vs server, per experiment
            skipped = plan.skipped
            async with HealthWindow(client.counters, host) as run_health:
                steps = plan.steps
                while steps:  # the plan's steps, then those it left out that what is left now holds
                    for i, (name, step) in enumerate(steps):
                        later = steps[i + 1 :]
                        reserve = (sum(p.time_cap_s for _, p in later), sum(p.requests for _, p in later))
                        outcome = await _run_one(name, step, ctx, guard, client, host, reserve, side_by_side)
                        results.update(outcome)
                        if on_result is not None:
                            on_result(name, outcome)
                    steps = ()
                    if fit is not None and skipped and not guard.exhausted():
                        steps, skipped = _resize_left_out(ctx, plan, skipped, guard, *fit)
            for name, why, hint in skipped:
                results.update(not_measured(EXPERIMENT_KEYS[name], f"{name} did not run: {why}", hint))
            assert run_health.health is not None
            results.update(run_health.health.measurements(source))
            results.update(run_summary(driver, source, run_health.health.window_s))
            results.update(agreement.run_level(side_by_side, source))
            run_notes = [*ctx.notes, *client.negotiated]
            if run_notes:
                results[Q.ACTIVE_NOTES] = Fact(
                    "; ".join(run_notes), Provenance(method="active-probe/run", source=source)
                )
            events_out.event(
                "run-end",
                sent=guard.sent,
                not_sent=driver.not_sent,
                budget=guard.describe(),
                server_gone=driver.server_gone,
                resent_on_closed_connection=client.resent_stale,
                notes=[*ctx.notes, *client.negotiated],
            )
    finally:
        requests_out.close()
        events_out.close()
        inputs_out.close()
    return results


async def _run_one(
    name: str,
    step: StepPlan,
    ctx: ExperimentContext,
    guard: BudgetGuard,
    client: StreamingClient,
    host: TargetHost,
    reserve: tuple[float, int] = (0.0, 0),
    side_by_side: dict[str, list[agreement.SideBySide]] | None = None,
) -> dict[str, Result]:
    """Run one experiment; once more if the client was starved during it and the budget has room.

    `reserve` (seconds, requests) is what the experiments after this one were planned to use:
    a repeat happens only where the budget covers it on top of that reserve, so a repeat never
    starves a later experiment. A result still taken while the client was starved carries the
    CLIENT_STARVED_WARNING, and the tree gives no verdict from it; so does one whose client timings
    the engine's own histograms contradict where the client is the side not to believe
    (experiments.agreement). The client-vs-server pairs go to `side_by_side[name]`.
    """
    keys = EXPERIMENT_KEYS[name]
    reason = guard.exhausted()
    if reason:
        return not_measured(
            keys,
            f"{name} did not run: {reason}",
            "raise --budget-requests / --budget-seconds"
            if not ctx.driver.server_gone
            else "check that the server is up (its log), then run again",
        )
    cap = step.time_cap_s
    ctx.driver.first_attempt()
    for attempt in (1, 2):
        outcome, health, server = await _attempt(name, step, ctx, guard, client, host, reserve[0])
        starved = health.starved(outcome.starvation_scale_s)
        room = guard.remaining_s >= cap + reserve[0] and guard.remaining_requests >= step.requests + reserve[1]
        if not starved or attempt == 2 or not room or ctx.driver.server_gone:
            break
        dropped = ctx.driver.begin_attempt()
        ctx.events.event("experiment-repeated", experiment=name, reason=starved, records_before=dropped)
        ctx.notes.append(f"{name} was run again: the client was starved during its first attempt ({starved})")
    results = dict(outcome.results)
    if outcome.judge is not None:
        results.update(outcome.judge(health))
    records = ctx.driver.records_of(name)
    pairs, not_compared = agreement.compare(records, server)
    if side_by_side is not None and pairs:
        side_by_side[name] = pairs
    if pairs or not_compared:
        ctx.events.event(
            "client-vs-server",
            experiment=name,
            compared=[p.describe() for p in pairs],
            not_compared=not_compared,
        )
    distrust = agreement.disbelieved(pairs, starved, burst_warning(gaps_of(records)) is not None) or starved
    warnings = health.warnings(outcome.median_gap_s)
    if distrust:
        warnings = (distrust, *warnings)
        ctx.notes.append(
            f"{name}: the client was starved of CPU "
            + ("in both attempts" if attempt == 2 else "and the budget had no room to repeat it")
            + ": its figures are kept but give no verdict"
            if starved
            else f"{name}: the engine's histograms contradict the client's timings: its figures give no verdict"
        )
    shared = ctx.other_traffic_warning()
    if shared:
        warnings = (*warnings, shared)
        ctx.notes.append(f"{name}: {shared}")
        ctx.events.event("beside-other-traffic", experiment=name, others_max=ctx.others_max)
    out = with_warnings(results, warnings)
    stall = health.stall()
    if stall:  # a hole the client's own stall may explain says so
        out = {
            k: replace(v, reason=f"{v.reason}; {stall}", hint=v.hint or "run it again on a less busy host")
            if isinstance(v, NotMeasured)
            else v
            for k, v in out.items()
        }
    if ctx.driver.server_gone:
        out = {
            k: (NotMeasured(f"{name} was cut short: {ctx.driver.server_gone}") if not isinstance(v, Measurement) else v)
            for k, v in out.items()
        }
    return out


async def _attempt(
    name: str,
    step: StepPlan,
    ctx: ExperimentContext,
    guard: BudgetGuard,
    client: StreamingClient,
    host: TargetHost,
    reserve_s: float = 0.0,
) -> tuple[ExperimentOutcome, ClientHealth, ServerDelta]:
    """One run of an experiment within its time cap, the client's health over it, and what the
    engine's metrics say happened meanwhile (unavailable without a metrics URL).

    `reserve_s` is what the experiments after it were planned to use: a runner that finds its own
    deadline too short for the server it meets may go on to `ctx.slack_until` (the budget's deadline
    less that reserve), as the interference experiment does for its minimum of prefills."""
    keys = EXPERIMENT_KEYS[name]
    now = time.perf_counter()
    cap = step.time_cap_s
    deadline = min(guard.deadline, now + cap)
    ctx.slack_until = max(deadline, min(guard.deadline, guard.deadline - reserve_s))
    ctx.events.event("experiment-start", experiment=name, time_cap_s=round(deadline - now, 3))
    ctx.salvage, ctx.others_max = None, 0.0
    before = await ctx.scrape()  # the engine's histograms, for the client-vs-server comparison
    overran = False
    async with HealthWindow(client.counters, host) as window:
        try:
            async with asyncio.timeout(ctx.slack_until - now + GRACE_S):
                outcome = await _RUNNERS[name](ctx, step, deadline)
        except TimeoutError:
            overran = True
        except Exception as exc:  # noqa: BLE001 - one broken experiment must not lose the others
            outcome = ExperimentOutcome(not_measured(keys, f"{name} failed: {type(exc).__name__}: {exc}"))
        finally:
            await ctx.driver.stop_all(f"{name}: experiment over")
    if overran:  # after stop_all: the streams it stopped are on file, with what they measured
        outcome = _overran(name, keys, cap, ctx)
    assert window.health is not None
    ctx.events.event("experiment-end", experiment=name, sent=guard.sent, health=window.health.describe())
    after = await ctx.scrape() if before is not None else None
    return outcome, window.health, ServerDelta(before, after)


def _overran(name: str, keys: tuple[str, ...], cap: float, ctx: ExperimentContext) -> ExperimentOutcome:
    """The safety timeout fired: what the phases completed before it measured, and why the rest is missing.

    The deadline came from the speed the calibration request measured, so a phase that overran
    it met a server slower than that (other traffic, a compute-bound step); a phase already done
    keeps its figures (ExperimentContext.salvage)."""
    why = (
        f"{name} did not finish within its {cap:.0f} s deadline, which was sized from the speed measured at the "
        "start: the server ran slower than that during it"
    )
    hint = "run it again when the server's own load is steadier (the deadlines follow the speed measured then)"
    holes = not_measured(keys, why, hint)
    if ctx.salvage is None:
        return ExperimentOutcome(holes)
    try:
        kept = ctx.salvage()
    except Exception as exc:  # noqa: BLE001 - a failed salvage leaves the holes, not a crash
        ctx.notes.append(f"{name}: what it completed could not be analysed ({type(exc).__name__}: {exc})")
        return ExperimentOutcome(holes)
    ctx.notes.append(f"{name} overran its {cap:.0f} s deadline: the phases it completed are kept")
    results: dict[str, Result] = {
        k: r if isinstance(r, (Measurement, Fact)) else NotMeasured(f"{r.reason}; {why}", r.hint or hint)
        for k, r in {**holes, **kept.results}.items()
    }
    return replace(kept, results=results)


async def _size(
    ctx: ExperimentContext,
    plan: ExperimentPlan,
    guard: BudgetGuard,
    engine_facts: Mapping[str, Result] | None,
    context_len: int | None,
) -> tuple[ExperimentPlan, Calibration, EngineLimits]:
    """Measure the server's speed with one request, read its limits, and size the plan's experiments."""
    names = tuple(n for n in ALL_EXPERIMENTS if n in {s for s, _ in plan.steps} | {s for s, *_ in plan.skipped})
    limits = await engine_limits(ctx, engine_facts, context_len)
    calibration = await calibrate(ctx, time.perf_counter() + CALIBRATION_SHARE * guard.remaining_s, guard.started)
    sized = size_experiments(
        calibration,
        limits,
        guard.budget,
        names,
        spent_requests=guard.sent,
        endpoint=plan.endpoint,
        target=plan.target,
        model=plan.model,
    )
    ctx.events.event(
        "experiments-sized",
        sized_from=sized.sized_from,
        plan=describe_plan(sized, reasons=True),
        why={n: list(p.why) for n, p in sized.steps},
        skipped=[{"experiment": n, "why": why, "hint": hint} for n, why, hint in sized.skipped],
        notes=list(sized.notes),
    )
    ctx.notes.append(f"experiments sized from {sized.sized_from}")
    ctx.notes.extend(sized.notes)
    return sized, calibration, limits


def _resize_left_out(
    ctx: ExperimentContext,
    plan: ExperimentPlan,
    skipped: tuple[tuple[str, str, str], ...],
    guard: BudgetGuard,
    calibration: Calibration,
    limits: EngineLimits,
) -> tuple[tuple[tuple[str, StepPlan], ...], tuple[tuple[str, str, str], ...]]:
    """The experiments the plan left out, sized again by the same fit in what the budget really has
    left (the steps before them often end well inside their caps): those that now fit, in priority
    order, and those that still do not.

    One still left out gets the second sizing's `why` (what was really left) and keeps the plan's
    hint: the least budget from which every larger one holds it (sizing the plan again at larger budgets),
    which what the others happened to leave unused cannot make untrue. Each re-size goes to
    events.jsonl ('experiments-resized'); the first plan stays in 'experiments-sized'."""
    left_s, left_requests = guard.remaining_s, guard.remaining_requests  # read once: the sizes and the event agree
    spent_s = guard.budget.max_seconds - left_s
    again = size_experiments(
        calibration,
        limits,
        guard.budget,
        tuple(name for name, *_ in skipped),
        spent_s=spent_s,
        spent_requests=guard.sent,
        hints=False,  # the plan's hints stay (the docstring says why): no search on the budget's clock
        endpoint=plan.endpoint,
        target=plan.target,
        model=plan.model,
    )
    hints = {name: hint for name, _, hint in skipped}
    still = tuple((name, why, hints[name]) for name, why, _ in again.skipped)
    left = f"{left_s:.1f} s and {left_requests} requests"
    ctx.events.event(
        "experiments-resized",
        why=f"the experiments before left {left} of the budget unused ({spent_s:.1f} s and {guard.sent} requests "
        "spent); those the plan left out are sized again in that",
        left_s=round(left_s, 3),
        left_requests=left_requests,
        resized={
            name: {"time_cap_s": round(p.time_cap_s, 3), "requests": p.requests, "plan": p.describe(), "why": [*p.why]}
            for name, p in again.steps
        },
        skipped=[{"experiment": n, "why": why, "hint": hint} for n, why, hint in still],
    )
    for name, step in again.steps:
        ctx.notes.append(
            f"{name} was left out of the plan, but the planned experiments left {left} unused: it was sized "
            f"again to fit them and run last (at most {step.requests} requests, {step.time_cap_s:.0f} s)"
        )
    return again.steps, still
