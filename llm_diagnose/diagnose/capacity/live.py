"""The live goodput search of `plan --active`: planned from what the server demonstrably meets,
measured, then judged.

Probes measure, diagnose judges, and this module is mostly judgement: it picks the rate the
search starts from (`start_rate`: the highest rate at which a batch of the evidence's requests
met the SLO, scaled to the workload's requests, or a light rate), caps the search at the
engine's ceiling (`capacity.ceiling`), judges every trial against the SLO, fits the model on the
evidence and the trials with the trial at the measured goodput held back (so the model covers
the concurrency the plan runs at, and its error is measured there), and walks the same search
with the model, so the measured and the predicted answer stand side by side. The prediction
plays no part in which rates are tried: a wild one cannot put the trials where the server
cannot go. The measurement itself (`llm_diagnose.probes.experiments.ramp`, run by
`experiments.goodput.run_goodput_search` through the run's BudgetGuard) happens in
`run_live_search`, which only opens the session it runs in (the client, the served model, the
prompts sized by POST /tokenize, the requests file), as `collect.run_target` does for `run`.

    search = plan_live_search(trace, items, limits, slo, model, budget, records=evidence_records,
                              trial_requests=40, steps=3, factor=2.0)
    print(search.describe(url))                       # nothing has been sent yet
    live = run_live_search(url, search, requests_out=folder / "requests.jsonl")

The probes are imported by the functions that use them: `plan` without --active never loads the
HTTP client.
"""

from __future__ import annotations

import asyncio
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from llm_diagnose.diagnose.capacity.ceiling import Ceiling, engine_ceiling
from llm_diagnose.diagnose.capacity.fit import MIN_REQUESTS, fit_step_model
from llm_diagnose.diagnose.capacity.goodput import predict_ramp, slo_judge, values_from_records
from llm_diagnose.diagnose.capacity.inputs import split_groups
from llm_diagnose.diagnose.capacity.measured import MeasuredGoodput
from llm_diagnose.diagnose.capacity.model import ModelError, StepModel, group_name
from llm_diagnose.diagnose.capacity.simulate import EngineLimits, SimRequest, simulate
from llm_diagnose.diagnose.capacity.validate import ModelValidation, validate_model
from llm_diagnose.diagnose.errors import TargetError, UsageError
from llm_diagnose.diagnose.tree.slo import SLO
from llm_diagnose.probes.experiments.goodput import DRAIN_FACTOR, MIN_TRIAL_REQUESTS, SETUP_RESERVE_S
from llm_diagnose.probes.experiments.ramp import RAMP_FACTOR, RampPlan, plan_ramp
from llm_diagnose.probes.load.budget import ActiveBudget
from llm_diagnose.probes.load.records import RequestRecord

if TYPE_CHECKING:
    from llm_diagnose.probes.experiments.goodput import GoodputSearch
    from llm_diagnose.probes.traces.records import TraceRequest

__all__ = [
    "LiveSearchPlan",
    "LiveGoodput",
    "plan_live_search",
    "run_live_search",
    "start_rate",
    "measured_items",
    "DEFAULT_START_RPS",
    "LIGHT_LOAD",
]

TRIAL_PREFIX = "goodput"  # a trial's request ids: goodput{trial}-{index in the trace}
LIGHT_LOAD = 0.5  # a light rate: one request in flight about half the time
DEFAULT_START_RPS = 0.5  # the start with neither a model nor a record to say how long a request takes
MIN_GROUP_REQUESTS = 4  # fewer completed requests in a batch cannot show that the SLO held
PLANNED_TRIALS = 4  # trials are made smaller (to half the asked size at most) until this many fit the budget


@dataclass(frozen=True)
class LiveSearchPlan:
    """What the live search will send and how it will be judged; nothing is sent in making it."""

    goodput: RampPlan  # the trials (start, factor, ceiling, count, requests each), fitted into the budget
    budget: ActiveBudget  # the hard bound the session runs under
    trace: tuple[TraceRequest, ...]  # the workload: every trial replays its first goodput.requests
    items: tuple[SimRequest, ...]  # the same requests as the model sees them (prefix blocks included)
    limits: EngineLimits
    slo: SLO
    model: StepModel | None  # fitted before the search on the evidence's requests; None: there were none
    records: tuple[RequestRecord, ...] = ()  # the evidence's requests: the model is refitted on them and the trials
    notes: tuple[str, ...] = ()
    ceiling: Ceiling | None = None  # the engine's ceiling for a trial's requests (None: no model to say)

    def describe(self, url: str) -> str:
        """What will be sent where, said before anything is sent."""
        return (
            f"Active goodput search will send streaming POST /v1/completions requests to {url}:\n  "
            f"{self.goodput.describe()}\n  budget: {self.budget.describe()} - a hard bound\n  also: one POST "
            "/tokenize first (to size prompts in tokens; it takes a budget slot) and GET /v1/models"
        )


@dataclass(frozen=True)
class LiveGoodput:
    """The search's answer: the model the plan uses, its error at the measured rate, measured beside predicted."""

    model: StepModel
    validation: ModelValidation
    measured: MeasuredGoodput
    notes: tuple[str, ...]
    items: tuple[SimRequest, ...]  # the workload with the prompt lengths the server reported for the trials


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def _demonstrated(records: Sequence[RequestRecord], slo: SLO, items: Sequence[SimRequest]) -> tuple[float, str] | None:
    """The highest rate at which a batch of `records` (a level, a phase) completed with the SLO met,
    scaled down to the workload's requests where these were lighter; None where no batch met it."""
    out_w = _mean([it.output_tokens for it in items])
    tok_w = _mean([it.prompt_tokens + it.output_tokens for it in items])
    best: tuple[float, str] | None = None
    for name, group in split_groups(records).items():
        done = [r for r in group if r.completed and r.event_times and r.e2e_s]
        if len(done) < MIN_GROUP_REQUESTS or slo.met_by(values_from_records(group)) is not True:
            continue
        span = max(r.t_send + (r.e2e_s or 0.0) for r in done) - min(r.t_send for r in done)
        if span <= 0:
            continue
        out_g = _mean([r.tokens_out for r in done])
        tok_g = _mean([(r.prompt_tokens or r.planned_prompt_tokens or 0) + r.tokens_out for r in done])
        scale = min(1.0, out_g / out_w if out_w else 1.0, tok_g / tok_w if tok_w else 1.0)
        rate = len(done) / span * scale
        if best is None or rate > best[0]:
            best = (
                rate,
                f"the evidence's '{name}' met the SLO while completing {len(done) / span:.3g} requests/s"
                + (f", x{scale:.2g} for this workload's longer requests" if scale < 1 else ""),
            )
    return best


def _light(model: StepModel | None, limits: EngineLimits, items: Sequence[SimRequest], records) -> tuple[float, str]:
    """A light rate: one request in flight about LIGHT_LOAD of the time."""
    if model is not None and items:
        mean = SimRequest(
            0.0,
            max(1, round(_mean([it.prompt_tokens for it in items]))),
            max(1, round(_mean([it.output_tokens for it in items]))),
        )
        [alone] = simulate([mean], model, limits).outcomes
        if alone.e2e_s:
            return LIGHT_LOAD / alone.e2e_s, f"a light rate: the model's {alone.e2e_s:.3g} s for one request alone"
    e2e = [r.e2e_s for r in records if r.completed and r.e2e_s]
    if e2e:
        median = statistics.median(e2e)
        return LIGHT_LOAD / median, f"a light rate: the evidence's median request took {median:.3g} s"
    return DEFAULT_START_RPS, "no model or request to say how long a request takes"


def start_rate(
    records: Sequence[RequestRecord],
    slo: SLO,
    model: StepModel | None,
    limits: EngineLimits,
    items: Sequence[SimRequest],
) -> tuple[float, str]:
    """The rate the search starts from, and where it came from: the higher of what the evidence's
    requests demonstrably met (`_demonstrated`) and a light rate."""
    light = _light(model, limits, items, records)
    shown = _demonstrated(records, slo, items)
    return shown if shown is not None and shown[0] > light[0] else light


def _fitted_ramp(
    budget: ActiveBudget, start: float, n: int, steps: int, factor: float, max_rps: float | None, source: str
) -> tuple[RampPlan, list[str]]:
    """The ramp in the budget: trials made smaller (to half the asked size at most) until PLANNED_TRIALS
    fit; a start too slow for two trials in the budget's time raised until they fit (and said)."""
    notes: list[str] = []
    floor = max(MIN_TRIAL_REQUESTS, n // 2)
    while n > floor and budget.max_requests // n < PLANNED_TRIALS:
        n -= 1
    try:
        return plan_ramp(
            budget, start, requests=n, steps=steps, factor=factor, max_rps=max_rps, start_source=source
        ), notes
    except ValueError as exc:
        room = budget.max_seconds - SETUP_RESERVE_S - 2 * RampPlan(start).drain_s
        if budget.max_requests < 2 * MIN_TRIAL_REQUESTS or room <= 0:
            raise UsageError(str(exc)) from None
        # The lowest start at which two trials of the asked size fit: the start's own and one step up.
        raised = min(n, budget.max_requests // 2) * DRAIN_FACTOR * (1 + 1 / factor) / room * 1.01
        if max_rps is not None and raised > max_rps:
            raise UsageError(str(exc)) from None
        notes.append(
            f"the search starts at {raised:.3g}/s, not {start:.3g}/s ({source}): two trials from there would not "
            "fit the budget's time"
        )
    try:
        plan = plan_ramp(budget, raised, requests=n, steps=steps, factor=factor, max_rps=max_rps, start_source=source)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return plan, notes


def plan_live_search(
    trace: Sequence[TraceRequest],
    items: Sequence[SimRequest],
    limits: EngineLimits,
    slo: SLO,
    model: StepModel | None,
    budget: ActiveBudget,
    *,
    records: Sequence[RequestRecord] = (),
    trial_requests: int,
    steps: int,
    factor: float = RAMP_FACTOR,
) -> LiveSearchPlan:
    """The ramp from `start_rate` up to the engine's ceiling for what a trial sends, sized to the
    budget less the slot POST /tokenize takes.

    Raises:
        UsageError: factor not above 1, or no search fits the budget (the message says what would).
    """
    if not factor > 1:
        raise UsageError("--search-span must be above 1 (each step up multiplies the rate by it)")
    n = min(trial_requests, len(trace))
    trial_items = items[:n]
    ceiling = engine_ceiling(trial_items, model, limits) if model is not None else None
    max_rps = ceiling.rps if ceiling is not None and math.isfinite(ceiling.rps) else None
    start, source = start_rate(records, slo, model, limits, trial_items)
    # The POST /tokenize that sizes prompts takes one slot of the budget; the trials share the rest.
    trials_budget = replace(budget, max_requests=max(1, budget.max_requests - 1))
    gplan, notes = _fitted_ramp(trials_budget, start, n, steps, factor, max_rps, source)
    if ceiling is not None:
        notes.append(f"the search never goes above the engine's ceiling for a trial's requests, {ceiling.describe()}")
    # The budget may have cut the trial's size: every use below (what is sent, what is
    # predicted, what is said) takes the planned size, so the two sides run the same requests.
    gplan = replace(gplan, workload=f"the trace's first {gplan.requests} requests, behind a salt of each trial's own")
    return LiveSearchPlan(
        gplan, budget, tuple(trace), tuple(items), limits, slo, model, tuple(records), tuple(notes), ceiling
    )


def _trial_of(record: RequestRecord) -> int | None:
    """The trial a search record belongs to (its id: goodput{trial}-{index})."""
    head = record.request_id.rsplit("-", 1)[0]
    if record.experiment != TRIAL_PREFIX or not head.startswith(TRIAL_PREFIX):
        return None
    try:
        return int(head[len(TRIAL_PREFIX) :])
    except ValueError:
        return None


def _index_of(record: RequestRecord) -> int | None:
    if _trial_of(record) is None:
        return None
    try:
        return int(record.request_id.rsplit("-", 1)[1])
    except (ValueError, IndexError):
        return None


def measured_items(items: Sequence[SimRequest], records: Sequence[RequestRecord]) -> tuple[SimRequest, ...]:
    """`items` with the prompt lengths the server reported for the search's requests (a text
    prompt's length is approximated until the server counts it)."""
    counted: dict[int, int] = {}
    for r in records:
        i = _index_of(r)
        if i is not None and r.prompt_tokens and 0 <= i < len(items):
            counted[i] = r.prompt_tokens
    return tuple(replace(it, prompt_tokens=counted[i]) if i in counted else it for i, it in enumerate(items))


def _fit_at_rate(
    plan: LiveSearchPlan, result: GoodputSearch, blocks_of: Callable[[RequestRecord], tuple]
) -> tuple[StepModel, ModelValidation, float | None, list[str]]:
    """The plan's model, fitted on the evidence and the trials with those at the measured goodput
    (or, with none, at the lowest rate tried) held back; its error on them; that rate; notes."""
    trials = result.search.trials
    rate = result.search.goodput_rps
    if rate is None and trials:
        rate = min(t.rate_rps for t in trials)
    at_rate = {i for i, t in enumerate(trials) if rate is not None and t.rate_rps == rate}
    held = [r for r in result.records if _trial_of(r) in at_rate]
    rest = [*plan.records, *(r for r in result.records if _trial_of(r) not in at_rate)]
    usable = [r for r in rest if r.completed and r.event_times and r.e2e_s]
    notes = []
    fit_on, validated = (rest, True) if len(usable) >= MIN_REQUESTS and held else ([*rest, *held], False)
    source = "the evidence's requests and the goodput search" if plan.records else "the goodput search"
    try:
        model = fit_step_model(fit_on, plan.limits, blocks_of=blocks_of, source=source)
    except ModelError as exc:
        raise UsageError(f"the goodput search recorded too little to fit a model: {exc}") from None
    if validated and rate is not None:
        validation = validate_model(model, plan.limits, {f"trial at {rate:.3g}/s": held}, blocks_of=blocks_of)
        notes.append(
            f"the plan's model is fitted on {len(fit_on)} requests ({source}), the trial(s) at {rate:.3g}/s held "
            "back: its error there is measured, not assumed"
        )
    else:
        validation = ModelValidation(())
        rate = None
        notes.append(f"the plan's model is fitted on every request ({source}): too few to hold a trial back")
    return model, validation, rate, notes


def run_live_search(url: str, plan: LiveSearchPlan, *, requests_out: Path | None = None) -> LiveGoodput:
    """Run the planned search against `url` (every request is written to `requests_out` as it
    ends), then fit the model on the evidence and the trials and predict the same search.

    Raises:
        TargetError: the server does not answer GET /v1/models.
        UsageError: the budget has no slot for POST /tokenize; the model cannot be fitted on the trials.
    """
    from llm_diagnose.probes.http import normalize_base_url

    base = normalize_base_url(url)
    if requests_out is not None:
        requests_out.parent.mkdir(parents=True, exist_ok=True)
    result = asyncio.run(_measure(url, base, plan, requests_out))
    notes = [*plan.notes, *result.notes]
    items = measured_items(plan.items, result.records)
    blocks_of = _blocks_of(items)
    model, validation, rate, fit_notes = _fit_at_rate(plan, result, blocks_of)
    notes += fit_notes
    gplan = plan.goodput
    trial_items = items[: gplan.requests]
    predicted = predict_ramp(trial_items, model, plan.limits, plan.slo, gplan)
    before = None if plan.model is None else predict_ramp(trial_items, plan.model, plan.limits, plan.slo, gplan)
    measured = MeasuredGoodput(
        result.search,
        predicted,
        before,
        validation,
        rate,
        gplan.requests,
        gplan.start_source,
    )
    return LiveGoodput(model, validation, measured, tuple(notes), items)


async def _measure(url: str, base: str, plan: LiveSearchPlan, requests_out: Path | None) -> GoodputSearch:
    """The session the probes' search runs in: the served model, the prompts, the driver."""
    from llm_diagnose.probes.experiments import discover_model
    from llm_diagnose.probes.experiments.goodput import run_goodput_search
    from llm_diagnose.probes.http import ProbeHTTPError, redact_url
    from llm_diagnose.probes.load import BudgetGuard, Driver, JsonlWriter, PoissonArrivals, StreamingClient
    from llm_diagnose.probes.load.prompts import calibrate_prompts
    from llm_diagnose.probes.load.replay import trace_workload

    gplan, n = plan.goodput, plan.goodput.requests
    async with StreamingClient(base, "") as client:
        try:
            model, _ = await discover_model(client.session, base)
        except ProbeHTTPError as exc:
            raise TargetError(f"{redact_url(url)}: {exc}") from None
        client.model = model or ""
        guard = BudgetGuard(plan.budget)
        if not await guard.admit():  # the POST /tokenize leaves the client: it takes a budget slot
            raise UsageError("the request budget has no slot for POST /tokenize: raise --budget-requests")
        prompts, _ = await calibrate_prompts(client.session, base, client.model)
        with JsonlWriter(requests_out) as writer:
            driver = Driver(client, guard, writer)
            return await run_goodput_search(
                driver,
                gplan,
                lambda rate, i: trace_workload(
                    plan.trace[:n],
                    prompts,
                    pacing=PoissonArrivals(rate, gplan.seed),
                    name=f"{TRIAL_PREFIX}{i}",
                    experiment=TRIAL_PREFIX,
                    fresh_cache=True,  # a trial does not find the last one's prompts in the prefix cache
                ),
                slo_judge(plan.slo),
            )


def _blocks_of(items: Sequence[SimRequest]) -> Callable[[RequestRecord], tuple]:
    """A trial record's prefix blocks: its request id ends with its index in the trace, and its
    trial's salt leads every prompt (trace_workload's fresh_cache), so blocks are shared within a
    trial and never across: keyed by the trial too. Other records (the evidence's experiments)
    have none: their ids do not index the trace."""

    def blocks(record: RequestRecord) -> tuple:
        i = _index_of(record)
        if i is None or not 0 <= i < len(items):
            return ()
        trial = group_name(record)
        return tuple((trial, key) for key in items[i].blocks)

    return blocks
