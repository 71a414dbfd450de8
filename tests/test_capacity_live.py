"""Capacity planning against the real vLLM CPU server: the model's goodput against the measured one.

Each workload is a small Mooncake-style trace (hash ids: requests of a group share whole
512-token blocks). A run folder gets the server's passive evidence (`llm-diagnose run`) and a
short calibration (requests one at a time, then an open-loop ramp of rates until the queue
builds); `llm-diagnose plan --active` then searches the real goodput up from the highest rate a
calibration level met the SLO at (doubling until the SLO breaks, then bisection), refits the
model on the calibration and the trials (the trial at the measured goodput held back), and walks
the same search with the model, so both answers come from the same rates, the same Poisson draws
and the same SLO.

The SLO is set from the calibration itself: e2e p50 at most the geometric mean of the median
e2e of requests sent one at a time (no queue) and of the same 24 requests sent all at once; a
trial sends twice as many, so at the search's high end it queues well past that burst. So the
objective breaks somewhere inside the range a trial can reach, whatever this machine's speed; a
factor of the lone latency alone did not (seen: a slow moment while the lone requests ran set an
SLO that even a burst of all 24 met, and neither the model nor the server had a goodput left to
find). A calibration level in which the client's own event loop stalled is measured again.

TOLERANCE is a gross bound (see its comment); the model's measured accuracy on this machine,
over repeated runs, is in benchmarks/RESULTS.md ("Capacity planning") with the command.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import statistics
from pathlib import Path

import pytest

from llm_diagnose.diagnose.capacity import items_from_trace
from llm_diagnose.diagnose.capacity.goodput import slo_judge
from llm_diagnose.diagnose.cli import main
from llm_diagnose.diagnose.runfolder import REQUESTS
from llm_diagnose.diagnose.tree.slo import SLO, Objective
from llm_diagnose.probes.experiments.goodput import plan_goodput, run_goodput_search
from llm_diagnose.probes.load import (
    ActiveBudget,
    BudgetGuard,
    ClosedLoop,
    Driver,
    JsonlWriter,
    PoissonArrivals,
    StreamingClient,
)
from llm_diagnose.probes.load.health import HealthWindow, TargetHost
from llm_diagnose.probes.load.prompts import calibrate_prompts
from llm_diagnose.probes.load.replay import load_trace, trace_workload

# Measured / predicted goodput must lie within [1/10, 10]. That bound catches a broken model (a unit
# slip, a cost on the wrong term), not the model's accuracy: on this 2-core box measured / predicted
# spread 0.33-2.28 over repeated runs, and a single 24-request trial's median swung 2x between
# neighbouring rates, so a 3x bound failed about one comparison in four (benchmarks/RESULTS.md,
# "Capacity planning", has the runs and the 3x figure the README states). Four bisection steps after
# the ramp's first break keep the resolution at 2^(1/16).
TOLERANCE = 10.0
CALIBRATION_ALONE = 8  # requests one at a time: the latency floor (one end of the SLO)
CALIBRATION_RATES = (4.0, 8.0, 16.0, 32.0, 64.0, 128.0)  # Poisson levels of 24 requests, until the queue builds
RAMP_STOP = 3.0  # e2e p50 over this x the floor: past the knee
STALLED_TRIES = 3  # a calibration level in which the client's loop stalled is measured again
CALIBRATION_REQUESTS = 24  # a ramp level and the burst: the trace's first 24
# Trials of twice as many requests as the calibration's burst. The SLO lies between the floor and
# a burst of 24 (about 0.15 and 0.3-0.5 s here), and a trial at the bracket's high end is itself
# a burst: of 24, its median sat inside that spread (266 ms against an SLO of 271 ms: met, so the
# search found no edge). A burst of 48 queues about twice as long, clear of the SLO.
TRIAL_REQUESTS, SEARCH_STEPS = 48, 4
PROJECTION_TRIAL_REQUESTS = 48  # the projection test's trials, on the server with caching on (see there)


def write_trace(path: Path, kind: str, n: int = 24, seed: int = 0) -> Path:
    """shared-prefix: 3 groups sharing a 512-token block, 64 own tokens; heavy-tailed: log-normal
    outputs after 512-token prompts (long enough that a burst of all 24 queues for its prefills,
    so the burst's latency stands well clear of the lone one: 128 tokens gave only ~3x)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        if kind == "shared-prefix":
            rows.append(
                {
                    "timestamp": i * 100,
                    "input_length": 576,
                    "output_length": rng.randint(16, 48),
                    "hash_ids": [1000 * (i % 3), 50_000 + i],
                }
            )
        else:
            out = int(min(600, max(4, 40 * math.exp(rng.gauss(0.0, 1.0)))))  # CV about 1.3
            rows.append({"timestamp": i * 100, "input_length": 512, "output_length": out, "hash_ids": [70_000 + i]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


async def _unstalled_level(driver, writer, host: TargetHost, items, prompts, pacing, name: str) -> list:
    """One calibration level's records, from an attempt in which the client's event loop did not
    stall (ClientHealth.stall); only that attempt is written, and the model is fitted on it.

    Seen here, with the client in a process of its own: a burst of 24 whose answers all came at
    once, after 2.4 s in which the client got 0.05 s of CPU (its loop stalled 2.4 s), while the
    same burst took 0.3-0.5 s with the loop running. In CI such a burst set an SLO (515 ms) that a
    trial at 10x the prediction met (210 ms), so the search found no edge.
    """
    for attempt in range(STALLED_TRIES):
        async with HealthWindow(driver.client.counters, host) as window:
            records = await driver.run(
                trace_workload(items, prompts, pacing=pacing, name=f"{name}.{attempt}", experiment="calibration")
            )
        assert window.health is not None
        if window.health.stall() is None:
            break
    for r in records:  # the last attempt's, stalled or not (the SLO and the model then carry the stall)
        writer.write(r.to_dict())
    return records


def _median_e2e(records) -> float:
    assert records, "the calibration sent nothing (the budget, or the server stopped answering)"
    return statistics.median(r.e2e_s or math.inf for r in records)


async def _calibrate(url: str, trace: tuple, out: Path) -> SLO:
    """Requests one at a time (the latency floor), an open-loop ramp until the queue builds, and
    all of them at once; the SLO between the floor and the burst."""
    async with StreamingClient(url, "tiny-llama") as client:
        prompts, _ = await calibrate_prompts(client.session, url, "tiny-llama")
        # Warm-up, not recorded: a fresh server is slower the first times it meets a batch shape
        # (measured here: the same burst of 24 took a median 4.0 s, then 2.4 s, then 0.4 s).
        warm_up = Driver(client, BudgetGuard(ActiveBudget(3 * len(trace), 60)))
        for _ in range(2):
            await warm_up.run(trace_workload(trace, prompts, pacing=ClosedLoop(len(trace))))
        with JsonlWriter(out / REQUESTS) as writer:
            # Unwritten (each level writes the attempt it keeps): every level at most STALLED_TRIES times.
            most = CALIBRATION_ALONE + len(trace) * (len(CALIBRATION_RATES) + 1)
            driver = Driver(client, BudgetGuard(ActiveBudget(STALLED_TRIES * most, 300)))
            host = TargetHost.of(url)  # the server's processes, found once for every level

            async def level(pacing, name: str, items=trace) -> list:
                return await _unstalled_level(driver, writer, host, items, prompts, pacing, name)

            alone = await level(ClosedLoop(1), "cal1", trace[:CALIBRATION_ALONE])
            floor = _median_e2e(alone)
            for k, rate in enumerate(CALIBRATION_RATES):
                if _median_e2e(await level(PoissonArrivals(rate, 100 + k), f"ramp{k}")) > RAMP_STOP * floor:
                    break  # the queue built up: the model now has seen both sides of the knee
            burst = await level(ClosedLoop(len(trace)), "burst")
    limit = math.sqrt(floor * _median_e2e(burst))
    assert _median_e2e(burst) > 1.5 * floor, (floor, _median_e2e(burst))  # else the SLO has no room on either side
    return SLO((Objective("e2e", 50, limit),), True)


def _run_folder(url: str, trace_path: Path, out: Path) -> SLO:
    """Passive evidence plus a calibration; the SLO this machine's queueing breaks."""
    assert (
        main(
            [
                "run",
                "--url",
                url,
                "--duration",
                "2",
                "--out",
                str(out),
                "--quiet",
                "--trace",
                str(trace_path),
                "--block-size",
                "512",
            ]
        )
        == 0
    )  # hash ids: 512-token blocks
    return asyncio.run(_calibrate(url, load_trace(trace_path)[:CALIBRATION_REQUESTS], out))


def _slo_flag(slo: SLO) -> str:
    o = slo.objectives[0]
    return f"{o.metric}:p{o.percentile:g}:{o.limit_s * 1e3:.1f}ms"


def _within_tolerance(ratio: float) -> bool:
    """TOLERANCE's band, ends included: a search whose low end is the projection / TOLERANCE held
    there, and 3.6113666372836106 / 36.11366637283611 is 0.09999999999999999 in floats (the
    projection test failed so in a full run: held at a tenth of the projection, broke at it)."""
    return 1 / TOLERANCE * (1 - 1e-9) <= ratio <= TOLERANCE * (1 + 1e-9)


def _agrees(goodput: dict) -> tuple[bool, float | None]:
    """Whether the live search found the edge (held at one rate, broke at a higher one) within
    TOLERANCE of the model's goodput for the same search; and the ratio."""
    measured, predicted = goodput["measured"], goodput["predicted"]
    if measured["bound"] != "bracketed":
        return False, None
    ratio = measured["goodput_rps"] / predicted["goodput_rps"]
    return _within_tolerance(ratio), ratio


def _plan_active(server, trace_path: Path, folder: Path, capsys) -> dict:
    slo = _run_folder(server.url, trace_path, folder)
    capsys.readouterr()
    code = main(
        [
            "plan",
            "--evidence",
            str(folder),
            "--trace",
            str(trace_path),
            "--target-rps",
            "100",
            "--slo",
            _slo_flag(slo),
            "--json",
            "--out",
            str(folder / "plan"),
            "--active",
            "--url",
            server.url,
            "--trial-requests",
            str(TRIAL_REQUESTS),
            "--search-steps",
            str(SEARCH_STEPS),
            "--budget-requests",
            str(8 * TRIAL_REQUESTS + 1),  # 7 trials, and room to try one again that broke in a client stall
            "--budget-seconds",
            "600",  # the bound the plan fits its trials in: 7 of 48 requests, the low end's at ~1/s
        ]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "Active goodput search will send" in out.err  # said before anything was sent
    plan = json.loads(out.out)
    assert plan["measured_goodput"]["predicted"]["bound"] == "bracketed"  # the model walked the same ramp to a break
    return plan


# The suite runs `plan --active` on the heavy-tailed workload; the shared-prefix one goes through the
# model in the projection test below. The benchmark (benchmarks/RESULTS.md, "Capacity planning")
# runs both: LLMD_CAPACITY_WORKLOADS=shared-prefix,heavy-tailed.
WORKLOADS = [w for w in os.environ.get("LLMD_CAPACITY_WORKLOADS", "heavy-tailed").split(",") if w.strip()]


@pytest.mark.parametrize("kind", WORKLOADS)
def test_measured_goodput_agrees_with_the_model(kind, vllm_server_factory, tmp_path, capsys):
    # One search, no second try: TOLERANCE is about 3x beyond the widest disagreement measured
    # (RESULTS.md: 0.33-3.3), so a broken model or a stopped server fails it.
    server = vllm_server_factory()
    trace_path = write_trace(tmp_path / f"{kind}.jsonl", kind, n=TRIAL_REQUESTS)
    plan = _plan_active(server, trace_path, tmp_path, capsys)
    ok, ratio = _agrees(plan["measured_goodput"])
    print(f"{kind}: measured/predicted goodput {ratio}; model error {plan['model_error']['max_abs_error']:.0%}")
    assert ok, plan["measured_goodput"]
    assert plan["model_error"]["comparisons"]  # on the trial at the measured goodput, held back from the fit
    today = plan["scenarios"][0]
    # The headline is the measured goodput, never above the engine's ceiling.
    assert today["source"] == "measured" and today["goodput_per_replica_rps"] <= (today["ceiling_rps"] or math.inf)
    assert today["replicas"] == math.ceil(100 / today["goodput_per_replica_rps"])
    # The report of the plan's folder shows the plan.
    (tmp_path / "plan" / "evidence.json").write_text((tmp_path / "evidence.json").read_text())
    assert main(["report", str(tmp_path / "plan"), "--out", str(tmp_path / "report.html")]) == 0
    assert 'id="capacity-plan"' in (tmp_path / "report.html").read_text()


def test_prefix_caching_projection_matches_a_run_with_caching_on(vllm_server_factory, tmp_path, capsys):
    trace_path = write_trace(tmp_path / "shared.jsonl", "shared-prefix")
    trace = load_trace(trace_path)
    off = vllm_server_factory(prefix_caching=False)
    slo = _run_folder(off.url, trace_path, tmp_path)
    # Trials of twice as many requests of the same shape as the calibration's: with caching on, a
    # burst of 24 can meet the SLO set from the server without it (seen in CI: 450 ms against
    # 508 ms, at 10x the projection), and then no rate a 24-request trial can send breaks it: the
    # search has no edge to find. A burst of 48 queues about twice as long for its prefills. The
    # projection is made for those same 48 requests: a trial's goodput depends on its size (CI,
    # one model: 915/s for the first 24 requests, 151/s for all 48; projected on 24 and measured
    # on 48, the live search broke at its low end, a tenth of the 915).
    trial_path = write_trace(tmp_path / "shared-trial.jsonl", "shared-prefix", n=PROJECTION_TRIAL_REQUESTS)
    capsys.readouterr()
    assert (
        main(
            [
                "plan",
                "--evidence",
                str(tmp_path),
                "--trace",
                str(trial_path),
                "--target-rps",
                "100",
                "--slo",
                _slo_flag(slo),
                "--json",
            ]
        )
        == 0
    )
    plan = json.loads(capsys.readouterr().out)
    by = {s["name"]: s for s in plan["scenarios"]}
    assert "prefix-caching" in by, plan["notes"]  # the diagnosis recommends it: Q2 sees the shared blocks
    projected = by["prefix-caching"]["goodput_per_replica_rps"]
    assert projected >= by["today"]["goodput_per_replica_rps"]

    on = vllm_server_factory()  # the same server with prefix caching on (and the default one of other tests)
    trial = load_trace(trial_path)
    budget = ActiveBudget(6 * PROJECTION_TRIAL_REQUESTS, 120)
    gplan = plan_goodput(
        budget, projected / TOLERANCE, projected * TOLERANCE, requests=PROJECTION_TRIAL_REQUESTS, steps=SEARCH_STEPS
    )

    async def measure():
        async with StreamingClient(on.url, "tiny-llama") as client:
            prompts, _ = await calibrate_prompts(client.session, on.url, "tiny-llama")
            driver = Driver(client, BudgetGuard(budget))
            return await run_goodput_search(
                driver,
                gplan,
                lambda rate, i: trace_workload(
                    trial, prompts, pacing=PoissonArrivals(rate, gplan.seed), name=f"g{i}", experiment="goodput"
                ),
                slo_judge(slo),
            )

    def agrees(search) -> bool:
        return search.bound == "bracketed" and _within_tolerance(search.goodput_rps / projected)

    result = asyncio.run(measure())  # one search (see the test above)
    print(f"prefix caching: measured/projected goodput {result.search.goodput_rps} / {projected}")
    assert agrees(result.search), result.search.trials
    assert items_from_trace(trace, 128)[3].blocks[:4] == items_from_trace(trace, 128)[0].blocks[:4]
