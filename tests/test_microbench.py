"""Roofline arithmetic (exact), the static-cache step setup (correct), and a small CPU grid (shape)."""

from __future__ import annotations

import pytest

from llm_diagnose.diagnose.tree.evidence import Evidence, Target
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.microbench import Ceilings, Grid, ModelCosts, roofline_floor, run_microbench
from llm_diagnose.probes.microbench.ceilings import matmul_sweep
from llm_diagnose.probes.microbench.roofline import StepCost
from llm_diagnose.probes.microbench.run import StepResult, bound_by_steps
from llm_diagnose.probes.microbench.steps import StepBench, build_causal_lm
from llm_diagnose.probes.results import Measurement, Provenance
from llm_diagnose.probes.timing import rate_from_time

# A Llama-3-8B-like shape on H200 datasheet ceilings (4.8 TB/s, 989 dense bf16 TFLOP/s).
LLAMA8B = ModelCosts(
    layers=32,
    heads=32,
    kv_heads=8,
    head_dim=128,
    linear_params_per_token=6_979_321_856,
    lm_head_params=525_336_576,
    weight_bytes=2 * (6_979_321_856 + 525_336_576),
    kv_dtype_bytes=2,
)
H200 = Ceilings(memcpy_bytes_per_s=4.8e12, matmul_flops_per_s=989e12, source="datasheet")


def test_decode_is_memory_bound_and_long_prefill_compute_bound() -> None:
    b1 = roofline_floor(LLAMA8B.decode_step(1, 1024), H200)
    assert b1.bound == "memory"
    kv = 1025 * 32 * 2 * 8 * 128 * 2  # tokens x layers x (K,V) x kv heads x head_dim x bytes
    assert b1.memory_s == pytest.approx((LLAMA8B.weight_bytes + kv) / 4.8e12)
    assert 2.9e-3 < b1.seconds < 3.3e-3  # ~15 GB of weights at 4.8 TB/s
    assert roofline_floor(LLAMA8B.prefill(2048), H200).bound == "compute"
    # Batching amortizes the weights: 64 decodes cost far less than 64 single steps.
    assert roofline_floor(LLAMA8B.decode_step(64, 1024), H200).seconds < 3 * b1.seconds


def test_costs_are_counted_from_the_model_modules() -> None:
    costs = ModelCosts.from_model(build_causal_lm("tiny"))
    per_layer = 4 * 128 * 128 + 3 * 128 * 352  # q, k, v, o and the SwiGLU MLP of the tiny shape
    assert costs.linear_params_per_token == 2 * per_layer and costs.lm_head_params == 4096 * 128
    assert costs.weight_bytes == 2 * (2 * per_layer + 4096 * 128)  # bf16
    assert costs.kv_bytes_per_token == 2 * 2 * 4 * 32 * 2


def test_rewound_static_cache_decode_matches_a_dynamic_cache_decode() -> None:
    import torch
    from transformers import DynamicCache, StaticCache

    model = build_causal_lm("tiny")
    bench = StepBench(model, budget_s=0.01)
    ids, nxt = bench._tokens(2, 10), bench._tokens(2, 1)
    with torch.inference_mode():
        dynamic = DynamicCache(config=model.config)
        model(input_ids=ids, past_key_values=dynamic, use_cache=True)
        expected = model(input_ids=nxt, past_key_values=dynamic, use_cache=True).logits
        static = StaticCache(config=model.config, max_cache_len=11)
        model(input_ids=ids, position_ids=torch.arange(10).expand(2, 10), past_key_values=static, use_cache=True)
        for _ in range(3):  # every repetition is the same step, not the next one
            bench._rewind(static, 10)
            got = model(
                input_ids=nxt, position_ids=torch.full((2, 1), 10), past_key_values=static, use_cache=True
            ).logits
            torch.testing.assert_close(got, expected)


def test_small_grid_on_cpu_gives_latencies_floors_and_evidence() -> None:
    report = run_microbench(
        build_causal_lm("tiny"),
        Grid(batches=(1, 4), contexts=(32,), prompts=(64,), mixed_decodes=4, mixed_chunk=32),
        budget_s=0.05,
    )
    items = report.evidence_items()
    for key in (
        Q.decode_step_latency_key(1),
        Q.decode_floor_key(4),
        Q.decode_bound_key(1),
        Q.prefill_latency_key(64),
        Q.MEMCPY_BYTES_PER_S,
        Q.MATMUL_FLOPS_PER_S,
        Q.MIXED_STEP_RATIO,
    ):
        assert key in items, key
    for step in report.steps:
        assert step.floor is not None and 0 < step.floor.seconds < step.latency.value  # a floor is below the step
    assert items[Q.MEMCPY_BYTES_PER_S].unit == "bytes/s" and items[Q.MEMCPY_BYTES_PER_S].value > 1e8
    assert items[Q.decode_step_latency_key(1)].provenance.method == "cpu-timer"
    assert "| decode | 4 | 32 |" in report.table()
    ev = Evidence(Target(label="microbench"), items)
    assert Evidence.from_json(ev.to_json()) == ev


def test_tiny_decode_is_memory_bound_in_fp32() -> None:
    # fp32 gets the BLAS on every CPU, so its matmul rate is far above copy bandwidth x the
    # tiny decode's ~1 FLOP/byte. (In bf16 that holds only where the CPU has native bf16; on
    # AVX2-only parts a bf16 matmul runs at a few GFLOP/s and the tiny decode is compute-bound.)
    import torch

    report = run_microbench(
        build_causal_lm("tiny", dtype=torch.float32),
        Grid(batches=(2,), contexts=(16,), prompts=(16,), mixed_decodes=2, mixed_chunk=8),
        budget_s=0.05,
    )
    step = report.decode(2, 16)
    assert step is not None and step.floor is not None and step.floor.bound == "memory"
    assert 0 < step.floor.seconds < step.latency.value


def _timed(seconds: tuple[float, ...], note: str) -> Measurement:
    return Measurement(
        sorted(seconds)[len(seconds) // 2],
        "s",
        Provenance(method="cpu-timer", source="cpu"),
        samples=seconds,
        note=note,
    )


def test_a_ceiling_a_step_beats_is_raised_to_that_steps_fastest_sample() -> None:
    cost = StepCost(bytes=1e6, flops=1e7)
    step = StepResult("decode", 1, 16, 1, _timed((2e-3, 1e-3, 4e-3), "decode step"), cost, None)
    slow = rate_from_time(_timed((1.0,), "matmul"), 1e9, "flop/s", "matmul")  # 1 GFLOP/s < the step's 10
    raised = bound_by_steps(slow, [step], lambda c: c.flops, "matmul rate")
    assert raised.value == pytest.approx(1e10) and raised.warnings and "decode step" in raised.note
    assert roofline_floor(cost, Ceilings(1e12, raised.value)).seconds < step.latency.value
    fast = rate_from_time(_timed((1e-3,), "matmul"), 1e9, "flop/s", "matmul")  # 1 TFLOP/s: kept
    assert bound_by_steps(fast, [step], lambda c: c.flops, "matmul rate") is fast


def test_matmul_sweep_takes_the_best_size_and_skips_sizes_past_the_budget() -> None:
    rates = {128: 2e9, 256: 1e9, 512: 5e8, 1024: 4e8}  # a kernel that slows as n grows (bf16 without native support)
    asked: list[int] = []

    def measure_at(n: int, share: float) -> Measurement:
        asked.append(n)
        return rate_from_time(_timed((2.0 * n**3 / rates[n],), f"n={n}"), 2.0 * n**3, "flop/s", f"n={n}")

    best = matmul_sweep((1024, 128, 256, 512), 1.0, measure_at)
    assert best.value == pytest.approx(2e9) and "n=128" in best.note
    # 256 takes ~34 ms a call (7 calls fit its 0.25 s share); 512 is predicted at ~270 ms and skipped.
    assert asked == [128, 256] and "skipped n=512, 1024" in best.note


def test_microbench_command_writes_evidence(tmp_path) -> None:
    from llm_diagnose.diagnose.cli import _Parser
    from llm_diagnose.diagnose.commands import microbench

    parser = _Parser(prog="llm-diagnose")
    microbench.register(parser.add_subparsers(dest="command", parser_class=_Parser))
    args = parser.parse_args(
        ["microbench", "--batch", "2", "--context", "16", "--prompt", "16", "--budget", "0.02", "--out", str(tmp_path)]
    )
    assert args.func(args) == 0
    ev = Evidence.from_json((tmp_path / "evidence.json").read_text())
    assert ev.measurement(Q.decode_step_latency_key(2)) is not None
    # The bound written is the one the written ceilings imply for the tiny model's step (memory
    # where bf16 runs natively; compute on CPUs that emulate bf16 matmuls, see the fp32 test).
    cost = ModelCosts.from_model(build_causal_lm("tiny")).decode_step(2, 16)
    ridge = ev.measurement(Q.MATMUL_FLOPS_PER_S).value / ev.measurement(Q.MEMCPY_BYTES_PER_S).value
    assert ev.fact(Q.decode_bound_key(2)) == ("memory" if cost.intensity <= ridge else "compute")
