"""REAL ENGINE: `verify` on pairs of runs of the tiny vLLM, for the verdicts the demo does not show.

The demo test (test_cli_run_demo.py) proves "delivered" (prefix caching turned on under a shared
system prompt). Here, each with the demo's own workload driver and run pipeline (`run_target`):
- a change with nothing to act on: prefix caching turned on for prompts that share no KV block;
- a harmful change: the same server with a far smaller KV cache (16 blocks of 128 tokens);
- two different workloads on one server: not comparable, no verdict.
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

SHARED = DemoWorkload(requests=24, spread_s=5.0)  # ~840-token system prompt before every question
QUESTIONS_ONLY = DemoWorkload(requests=24, spread_s=5.0, system_prompt="")  # ~20 tokens, nothing shared
SMALL_KV = ("--num-gpu-blocks-override", "16")  # 2048 tokens of KV: two of the shared prompts at once


def observe(server, out: Path, workload: DemoWorkload) -> Path:
    """A run folder as the demo makes one: the workload driven while /metrics is scraped."""
    out.mkdir(parents=True)

    async def drive(base_url, found, run_dir):
        completed, failed = await workload.drive(base_url, server.model_name, run_dir / REQUESTS, delay_s=0.5)
        assert failed == 0, f"{failed} of the workload's requests failed (server log: {server.log_path})"
        return {}

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


def verified(before: Path, after: Path) -> VerifyResult:
    return verify(*(RunSide.of(RunFolder.load(p), RunFolder.load(p).diagnosis) for p in (before, after)))


def test_prefix_caching_with_nothing_shared_has_no_measurable_effect_on_the_hit_rate(vllm_server_factory, tmp_path):
    before = observe(vllm_server_factory(prefix_caching=False), tmp_path / "off", QUESTIONS_ONLY)
    after = observe(vllm_server_factory(prefix_caching=True), tmp_path / "on", QUESTIONS_ONLY)
    result = verified(before, after)
    assert [a.technique for a in result.adopted] == ["prefix-caching"], result.adopted
    assert result.comparability.comparable, result.comparability.reasons
    claims = {c.claim.key: c for c in result.claims}
    # No prompt fills a 128-token block: nothing to hit, before or after.
    assert claims["prefix.hit_rate"].verdict == "no-measurable-effect", claims["prefix.hit_rate"]
    # TTFT of ~20-token prompts is the same work either way; on a shared 2-core host its interval
    # can be wider than +-10% (cannot tell), but it is never a gain.
    assert claims["latency.ttft_p50_s"].verdict in ("no-measurable-effect", "cannot-tell"), claims
    assert result.verdict in ("no-measurable-effect", "cannot-tell")


def test_a_far_smaller_kv_cache_made_it_worse(vllm_server_factory, tmp_path, capsys):
    before = observe(vllm_server_factory(), tmp_path / "roomy", SHARED)
    after = observe(vllm_server_factory(extra_args=SMALL_KV), tmp_path / "small", SHARED)
    result = verified(before, after)
    assert result.comparability.comparable, result.comparability.reasons
    harm = {s.name for s in result.side_effects if s.harmful}
    assert result.verdict == "made-it-worse", (harm, result.side_effects)
    # 8 requests in flight needing ~7-10 blocks each against 15 usable: they queue for the cache.
    assert harm & {"requests.ttft_p50_s", "requests.e2e_p50_s", "latency.ttft_p50_s", "kv.preemptions_per_s"}, harm
    assert main(["verify", str(before), str(after)]) == ExitCode.REGRESSION
    assert capsys.readouterr().out.startswith("llm-diagnose verify: MADE-IT-WORSE")


def test_two_different_workloads_are_not_comparable(vllm_server, tmp_path, capsys):
    before = observe(vllm_server, tmp_path / "shared", SHARED)
    after = observe(vllm_server, tmp_path / "questions", QUESTIONS_ONLY)
    result = verified(before, after)
    assert result.verdict == "not-comparable" and result.claims == ()
    assert any(r.startswith("prompt tokens (median) differs") for r in result.comparability.reasons), result
    assert main(["verify", str(before), str(after)]) == ExitCode.INCONCLUSIVE
    assert "NOT COMPARABLE" in capsys.readouterr().out
