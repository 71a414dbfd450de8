"""REAL ENGINE: `verify` on pairs of runs of the tiny vLLM, for the verdicts the demo does not show.

The demo test (test_cli_run_demo.py) proves "delivered": prefix caching turned on under a shared
system prompt. Here, four runs with the demo's own workload driver and run pipeline
(`run_target`) on two servers that differ only in prefix caching, paired three ways:

- a change with nothing to act on: prefix caching turned on for prompts too short to fill one
  128-token KV block, so nothing can hit before or after;
- a harmful change: prefix caching turned off under the shared ~840-token system prompt;
- two different workloads on the same server: not comparable, so no verdict.

The file is named to run right after test_capacity_live.py, whose two servers these are (each
start costs ~45 s on the 2-core host).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llm_diagnose.diagnose.cli import main
from llm_diagnose.diagnose.collect import RunPlan, run_target
from llm_diagnose.diagnose.demo.workload import DemoWorkload
from llm_diagnose.diagnose.errors import ExitCode
from llm_diagnose.diagnose.runfolder import REQUESTS, RunFolder
from llm_diagnose.diagnose.verify.judge import RunSide, verify
from llm_diagnose.diagnose.verify.result import VerifyResult

pytestmark = pytest.mark.real_engine

SHARED = DemoWorkload(requests=24, spread_s=4.0)  # ~840-token system prompt before every question
QUESTIONS_ONLY = DemoWorkload(requests=24, spread_s=4.0, system_prompt="")  # ~20 tokens, nothing shared


def observe(server, out: Path, workload: DemoWorkload) -> Path:
    """A run folder as the demo makes one: the workload driven while /metrics is scraped."""
    out.mkdir(parents=True)

    async def drive(base_url, found, run_dir):
        completed, failed, health = await workload.drive(base_url, server.model_name, run_dir / REQUESTS, delay_s=0.5)
        assert failed == 0, f"{failed} of the workload's requests failed (server log: {server.log_path})"
        return health.measurements(f"the demo's workload against {base_url}")

    plan = RunPlan(
        url=server.url,
        out_dir=out,
        duration_s=workload.spread_s + 3.0,
        interval_s=0.5,
        trace=workload.write_trace(out / "workload.jsonl"),
        trace_format="prompts",
    )
    assert not run_target(plan, active=drive).partial
    return out


def warm_up(server, scratch: Path) -> None:
    """Unrecorded traffic first, as the demo does (DemoWorkload.warm_up: a freshly started vLLM CPU
    serves its first requests several times slower, which a comparison would read as the change's
    effect), for each of the workloads this module records."""
    scratch.mkdir(parents=True, exist_ok=True)
    for workload in (QUESTIONS_ONLY, SHARED):
        completed = workload.warm_up(server.url, server.model_name, scratch / REQUESTS)
        assert completed, f"the warm-up got no answer (server log: {server.log_path})"


@pytest.fixture(scope="module")
def runs(vllm_server_factory, tmp_path_factory) -> dict[str, Path]:
    on, off = vllm_server_factory(prefix_caching=True), vllm_server_factory(prefix_caching=False)
    root = tmp_path_factory.mktemp("change-verified")
    warm_up(on, root / "warm-on")
    warm_up(off, root / "warm-off")
    return {
        "off-questions": observe(off, root / "off-questions", QUESTIONS_ONLY),
        "on-questions": observe(on, root / "on-questions", QUESTIONS_ONLY),
        "on-shared": observe(on, root / "on-shared", SHARED),
        "off-shared": observe(off, root / "off-shared", SHARED),
    }


def verified(before: Path, after: Path) -> VerifyResult:
    sides = [RunFolder.load(p) for p in (before, after)]
    return verify(*(RunSide.of(f, f.diagnosis) for f in sides))


def test_prefix_caching_with_nothing_to_share_has_no_measurable_effect(runs):
    result = verified(runs["off-questions"], runs["on-questions"])
    assert [a.technique for a in result.adopted] == ["prefix-caching"], result.adopted
    assert result.comparability.comparable, result.comparability.reasons
    claims = {c.claim.key: c for c in result.claims}
    assert claims["prefix.hit_rate"].verdict == "no-measurable-effect", claims["prefix.hit_rate"]
    # The TTFT of a ~20-token prompt is the same work either way; on a shared 2-core host its
    # interval can be wider than +-10% (cannot tell), but it is never a gain or a loss.
    assert claims["latency.ttft_p50_s"].verdict in ("no-measurable-effect", "cannot-tell"), claims
    assert result.verdict in ("no-measurable-effect", "cannot-tell")


def test_turning_prefix_caching_off_under_a_shared_prompt_made_it_worse(runs, capsys):
    result = verified(runs["on-shared"], runs["off-shared"])
    assert result.comparability.comparable, result.comparability.reasons
    assert result.adopted == () or all(a.technique != "prefix-caching" for a in result.adopted)
    harm = {s.name for s in result.side_effects if s.harmful}
    assert result.verdict == "made-it-worse", result.side_effects
    # Every request now prefills the ~840 shared tokens again.
    assert harm & {"requests.ttft_p50_s", "latency.ttft_p50_s", "prefix.hit_rate"}, harm
    assert main(["verify", str(runs["on-shared"]), str(runs["off-shared"])]) == ExitCode.REGRESSION
    assert capsys.readouterr().out.startswith("llm-diagnose verify: MADE-IT-WORSE")


def test_two_different_workloads_are_not_comparable(runs, capsys):
    result = verified(runs["on-shared"], runs["on-questions"])
    assert result.verdict == "not-comparable" and result.claims == ()
    assert any(r.startswith("prompt tokens (median) differs") for r in result.comparability.reasons), result
    assert main(["verify", str(runs["on-shared"]), str(runs["on-questions"])]) == ExitCode.INCONCLUSIVE
    assert "NOT COMPARABLE" in capsys.readouterr().out
