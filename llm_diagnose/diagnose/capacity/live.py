"""The live goodput search of `plan --active`: planned around the model, measured, then judged.

Probes measure, diagnose judges, and this module is mostly judgement: it centres the search's
bracket on the goodput the model predicts, judges every trial against the SLO, fits the model on
the trials (or checks the one fitted before on all of them), and predicts the goodput at the same
rates and the same Poisson draws, so the measured and the predicted answer stand side by side.
The measurement itself, a bisection that sends each trial through the run's BudgetGuard, is
`llm_diagnose.probes.experiments.goodput.run_goodput_search`; `run_live_search` only opens the
session it runs in (the client, the served model, the prompts sized by POST /tokenize, the
requests file), as `collect.run_target` does for `run`.

    search = plan_live_search(trace, items, limits, slo, model, budget, trial_requests=40, steps=3, span=3.0)
    print(search.describe(url))                       # nothing has been sent yet
    live = run_live_search(url, search, requests_out=folder / "requests.jsonl")

The probes are imported by the functions that use them: `plan` without --active never loads the
HTTP client.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from llm_diagnose.diagnose.capacity.goodput import predict_goodput, slo_judge
from llm_diagnose.diagnose.capacity.inputs import fit_and_validate, split_groups
from llm_diagnose.diagnose.capacity.model import ModelError, StepModel
from llm_diagnose.diagnose.capacity.plan import PREDICTION_RANGE, MeasuredGoodput
from llm_diagnose.diagnose.capacity.simulate import EngineLimits, SimRequest
from llm_diagnose.diagnose.capacity.validate import ModelValidation, validate_model
from llm_diagnose.diagnose.errors import TargetError, UsageError
from llm_diagnose.diagnose.tree.slo import SLO
from llm_diagnose.probes.experiments.goodput import GoodputPlan, plan_goodput
from llm_diagnose.probes.load.budget import ActiveBudget
from llm_diagnose.probes.load.records import RequestRecord

if TYPE_CHECKING:
    from llm_diagnose.probes.experiments.goodput import GoodputSearch
    from llm_diagnose.probes.traces.records import TraceRequest

__all__ = ["LiveSearchPlan", "LiveGoodput", "plan_live_search", "run_live_search", "UNMODELLED_RANGE"]

UNMODELLED_RANGE = (0.5, 64.0)  # requests/s the search spans when no model predicts where to look
CENTRE_STEPS = 16  # bisection steps of the prediction the bracket is centred on


@dataclass(frozen=True)
class LiveSearchPlan:
    """What the live search will send and how it will be judged; nothing is sent in making it."""

    goodput: GoodputPlan  # the trials (rates, count, requests each), fitted into the budget
    budget: ActiveBudget  # the hard bound the session runs under
    trace: tuple[TraceRequest, ...]  # the workload: every trial replays its first goodput.requests
    items: tuple[SimRequest, ...]  # the same requests as the model sees them (prefix blocks included)
    limits: EngineLimits
    slo: SLO
    model: StepModel | None  # fitted before the search; None: fitted on the search's own trials
    notes: tuple[str, ...] = ()
    centred_span: float | None = None  # the bracket is the prediction / span to x span, unclipped

    def describe(self, url: str) -> str:
        """What will be sent where, said before anything is sent."""
        return (
            f"Active goodput search will send streaming POST /v1/completions requests to {url}:\n  "
            f"{self.goodput.describe()}\n  budget: {self.budget.describe()} - a hard bound\n  also: one POST "
            "/tokenize first (to size prompts in tokens; it takes a budget slot) and GET /v1/models"
        )


@dataclass(frozen=True)
class LiveGoodput:
    """The search's answer: the model the plan uses, its error on the trials, measured beside predicted."""

    model: StepModel
    validation: ModelValidation
    measured: MeasuredGoodput
    notes: tuple[str, ...]


def plan_live_search(
    trace: Sequence[TraceRequest],
    items: Sequence[SimRequest],
    limits: EngineLimits,
    slo: SLO,
    model: StepModel | None,
    budget: ActiveBudget,
    *,
    trial_requests: int,
    steps: int,
    span: float,
) -> LiveSearchPlan:
    """The search bracketing the model's goodput for what a trial sends (prediction / span to x span),
    or UNMODELLED_RANGE without a model; sized to the budget less the slot POST /tokenize takes.

    Raises:
        UsageError: span not above 1, or no search fits the budget (the message says what would).
    """
    notes = []
    trial_requests = min(trial_requests, len(trace))
    if model is not None:
        # Centred on the goodput of what a trial sends (its first requests), not of the whole trace.
        g = (
            predict_goodput(
                items[:trial_requests],
                model,
                limits,
                slo,
                low_rps=PREDICTION_RANGE[0],
                high_rps=PREDICTION_RANGE[1],
                steps=CENTRE_STEPS,
            ).goodput_rps
            or PREDICTION_RANGE[0]
        )
        if not span > 1:
            raise UsageError("--search-span must be above 1 (the bracket is prediction / X to prediction x X)")
        low, high = g / span, g * span
    else:
        low, high = UNMODELLED_RANGE
        notes.append(f"no model before the search: it spans {low:g}-{high:g} requests/s")
    try:
        # The POST /tokenize that sizes prompts takes one slot of the budget; the trials share the rest.
        trials_budget = replace(budget, max_requests=max(1, budget.max_requests - 1))
        gplan = plan_goodput(trials_budget, low, high, requests=trial_requests, steps=steps)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    # The budget may have cut the trial's size: every use below (what is sent, what is
    # predicted, what is said) takes the planned size, so the two sides run the same requests.
    gplan = replace(gplan, workload=f"the trace's first {gplan.requests} requests")
    # Only a bracket centred on the prediction can contradict it at an end (capacity.plan.live_contradiction).
    centred = model is not None and math.isclose(gplan.low_rps, low) and math.isclose(gplan.high_rps, high)
    return LiveSearchPlan(
        gplan, budget, tuple(trace), tuple(items), limits, slo, model, tuple(notes), span if centred else None
    )


def run_live_search(url: str, plan: LiveSearchPlan, *, requests_out: Path | None = None) -> LiveGoodput:
    """Run the planned search against `url` (every request is written to `requests_out` as it
    ends), then fit or check the model on its trials and predict the same search.

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
    blocks_of = _blocks_of(plan.items)
    if plan.model is None:
        try:
            fitted = fit_and_validate(result.records, plan.limits, blocks_of=blocks_of, source="the goodput search")
        except ModelError as exc:
            raise UsageError(f"the goodput search recorded too little to fit a model: {exc}") from None
        model, validation = fitted.model, fitted.validation
        notes.append(
            f"model error measured by fitting the search's alternate trials ({fitted.fitted_on} requests) "
            f"and replaying the others ({fitted.held_back}); the plan's model is refitted on all of them"
        )
    else:
        model = plan.model
        validation = validate_model(model, plan.limits, split_groups(result.records), blocks_of=blocks_of)
        notes.append("model checked on every trial of the live search (none was used to fit it)")
    gplan = plan.goodput
    predicted = predict_goodput(
        plan.items[: gplan.requests],
        model,
        plan.limits,
        plan.slo,
        low_rps=gplan.low_rps,
        high_rps=gplan.high_rps,
        steps=gplan.steps,
        seed=gplan.seed,
    )
    measured = MeasuredGoodput(result.search, predicted.search, plan.centred_span)
    return LiveGoodput(model, validation, measured, tuple(notes))


async def _measure(url: str, base: str, plan: LiveSearchPlan, requests_out: Path | None) -> GoodputSearch:
    """The session the probes' search runs in: the served model, the prompts, the driver."""
    from llm_diagnose.probes.experiments import discover_model
    from llm_diagnose.probes.experiments.goodput import run_goodput_search
    from llm_diagnose.probes.http import ProbeHTTPError
    from llm_diagnose.probes.load import BudgetGuard, Driver, JsonlWriter, PoissonArrivals, StreamingClient
    from llm_diagnose.probes.load.prompts import calibrate_prompts
    from llm_diagnose.probes.load.replay import trace_workload

    gplan, n = plan.goodput, plan.goodput.requests
    async with StreamingClient(base, "") as client:
        try:
            model, _ = await discover_model(client.session, base)
        except ProbeHTTPError as exc:
            raise TargetError(f"{url}: {exc}") from None
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
                    name=f"goodput{i}",
                    experiment="goodput",
                ),
                slo_judge(plan.slo),
            )


def _blocks_of(items: Sequence[SimRequest]) -> Callable[[RequestRecord], tuple]:
    """A trial record's prefix blocks: its request id ends with its index in the trace."""

    def blocks(record: RequestRecord) -> tuple:
        try:
            return items[int(record.request_id.rsplit("-", 1)[1])].blocks
        except (ValueError, IndexError):
            return ()

    return blocks
