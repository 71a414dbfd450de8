"""Roofline arithmetic (exact), the static-cache step setup (correct), a small CPU grid (shape), and the
step of a served model from its config.json alone (random weights, sharded, scaled in layers)."""

from __future__ import annotations

import json
from dataclasses import replace

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


# --- the step from a config.json alone (issue 25) ------------------------------------------------------
def test_costs_from_a_config_equal_the_costs_counted_from_the_built_model() -> None:
    import torch

    from llm_diagnose.probes.microbench.config_model import build

    tiny = {
        "model_type": "llama",
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,  # grouped-query attention: k and v narrower than q
        "head_dim": 32,
        "intermediate_size": 352,
        "vocab_size": 4096,
        "tie_word_embeddings": False,
    }
    for dtype, size in (("bfloat16", 2), ("float32", 4)):
        model = build(tiny, dtype=dtype)
        assert next(model.parameters()).dtype == getattr(torch, dtype)
        assert ModelCosts.from_config(tiny, size) == ModelCosts.from_model(model)
    with pytest.raises(ValueError, match="mixture of experts"):
        ModelCosts.from_config({**tiny, "num_local_experts": 8}, 2)


def test_a_tensor_parallel_shard_divides_the_widths_and_says_so() -> None:
    from llm_diagnose.probes.microbench.config_model import ConfigError, shard

    cfg = {
        "model_type": "llama",
        "hidden_size": 8192,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "intermediate_size": 28672,
        "vocab_size": 128256,
    }
    part, note = shard(cfg, 4)
    assert (part["num_attention_heads"], part["num_key_value_heads"], part["head_dim"]) == (16, 2, 128)
    assert (part["intermediate_size"], part["vocab_size"], part["hidden_size"]) == (7168, 32064, 8192)
    assert "tensor parallel 4" in note and "all-reduces" in note
    # A quarter of the 70B's linear weights per device (the lm_head sharded by vocabulary too).
    whole, quarter = ModelCosts.from_config(cfg, 2), ModelCosts.from_config(part, 2)
    assert quarter.weight_bytes == pytest.approx(whole.weight_bytes / 4, rel=1e-4)
    assert shard(cfg, 16)[0]["num_key_value_heads"] == 1  # fewer KV heads than devices: replicated
    with pytest.raises(ConfigError, match="not divisible"):
        shard(cfg, 3)


def _timed_step(value: float, method: str = "cpu-timer") -> Measurement:
    samples = (value * 0.98, value, value * 1.02)
    return Measurement(value, "s", Provenance(method=method, source="test"), samples=samples, note="decode step")


def test_layer_extrapolation_follows_the_line_through_two_layer_counts_and_names_itself() -> None:
    from llm_diagnose.probes.microbench.from_config import extrapolate
    from llm_diagnose.probes.microbench.run import MicrobenchReport

    def report(layers: int, seconds: float) -> MicrobenchReport:
        cost = StepCost(bytes=1e6 + layers * 2e6, flops=1e7 + layers * 3e7)
        step = StepResult("decode", 1, 64, 1, _timed_step(seconds, "cuda-graph-replay"), cost, None)
        step = replace(step, eager=_timed_step(seconds * 2))
        mem = Measurement(1e12, "bytes/s", Provenance(method="cuda-graph-replay", source="test"))
        flops = Measurement(1e15, "flop/s", Provenance(method="cuda-graph-replay", source="test"))
        return MicrobenchReport(f"{layers} layers", "cuda:0", "bf16", 64, (step,), mem, flops)

    # 1 ms fixed (embedding, lm_head) + 0.5 ms per layer: 4 and 8 layers timed, 80 in the config.
    out = extrapolate(report(4, 0.003), 4, report(8, 0.005), 8, 80, "shard note; 4 and 8 of its 80 layers timed")
    step = out.steps[0]
    assert step.latency.value == pytest.approx(0.041) and step.latency.provenance.method == "cuda-graph-replay"
    assert "4 and 8 of its 80 layers" in step.latency.provenance.source and "extrapolated" in step.latency.note
    assert step.eager is not None and step.eager.value == pytest.approx(0.082)
    assert step.cost == StepCost(bytes=1e6 + 80 * 2e6, flops=1e7 + 80 * 3e7)  # bytes and FLOPs grow per layer too
    assert step.floor is not None and step.floor.seconds == pytest.approx((1e6 + 160e6) / 1e12)
    noisy = extrapolate(report(4, 0.005), 4, report(8, 0.005), 8, 80, "n").steps[0]  # no per-layer cost seen
    assert noisy.latency.value == pytest.approx(0.05) and "in proportion" in noisy.latency.warnings[-1]


def test_the_step_from_config_json_alone_is_the_step_of_the_real_weights(tmp_path) -> None:
    """The tiny model's decode step built from its config.json (random weights) against the same
    step of its saved weights: timed in alternation, pair by pair, on a shared host whose load
    moves both alike. The band: the median of the pairs' ratios within 0.67-1.5. A different shape
    or dtype moves it further (fp32 against bf16 on these CPUs: 2-10x); the exact equality of the
    two models' bytes and FLOPs is the strict half of the check."""
    import statistics

    import torch
    from transformers import AutoModelForCausalLM

    from llm_diagnose.diagnose.demo.tiny_model import make_tiny_model
    from llm_diagnose.probes.microbench.config_model import build, config_dtype, read_config

    folder = make_tiny_model(tmp_path / "tiny")
    config = read_config(folder / "config.json")
    assert config_dtype(config) == "bfloat16"
    from_config = build(config, dtype="float32")
    from_weights = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert ModelCosts.from_model(from_config) == ModelCosts.from_model(from_weights)
    benches = (StepBench(from_config, budget_s=0.03), StepBench(from_weights, budget_s=0.03))
    ratios = []
    for i in range(9):
        a, b = benches if i % 2 == 0 else benches[::-1]  # alternate which goes first
        first, second = a.decode(1, 32).value, b.decode(1, 32).value
        config_s, weights_s = (first, second) if a is benches[0] else (second, first)
        ratios.append(config_s / weights_s)
    assert 0.67 <= statistics.median(ratios) <= 1.5, ratios


def test_microbench_from_a_config_at_a_runs_batch_and_context(tmp_path) -> None:
    from llm_diagnose.diagnose.cli import main
    from llm_diagnose.diagnose.demo.tiny_model import make_tiny_model
    from tests.evidence_builders import build

    folder = make_tiny_model(tmp_path / "tiny")
    run = build(
        {
            "engine.model": str(folder),  # a local folder: its config.json is the served model's
            "batch.running_mean": 3.4,
            "inputs.length_p50": 40.0,
            "outputs.length_p50": 16.0,
        }
    )
    (tmp_path / "run.json").write_text(run.to_json())
    out = tmp_path / "mb"
    argv = ["microbench", "--run", str(tmp_path / "run.json"), "--dtype", "float32", "--budget", "0.01"]
    assert main([*argv, "--out", str(out)]) == 0
    ev = Evidence.from_json((out / "evidence.json").read_text())
    assert ev.fact(Q.MICROBENCH_CONTEXT) == 48  # the median prompt and half the median output
    assert "random weights of its shapes (no weights read), float32" in ev.fact(Q.MICROBENCH_MODEL)
    for batch in (1, 3):  # batch 1 (the decode experiment's) and the run's running batch
        step = ev.measurement(Q.decode_step_latency_key(batch))
        assert step is not None and step.provenance.method == "cpu-timer"
        assert ev.measurement(Q.decode_eager_step_latency_key(batch)) == step, "on the CPU the step is eager"
        assert ev.measurement(Q.decode_floor_key(batch)) is not None
    assert ev.measurement(Q.decode_step_latency_key(4)) is None and ev.measurement(Q.MIXED_STEP_RATIO) is None


def test_a_config_the_host_cannot_build_gets_its_roofline_floor_and_says_so(tmp_path, capsys) -> None:
    from llm_diagnose.diagnose.cli import main

    cfg = {
        "model_type": "no-such-architecture",
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 352,
        "vocab_size": 4096,
        "dtype": "float32",
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    argv = ["microbench", "--config", str(tmp_path), "--batch", "1", "--context", "16", "--budget", "0.01"]
    assert main([*argv, "--out", str(tmp_path / "mb.json")]) == 0
    assert "its roofline floor stands in" in capsys.readouterr().err
    ev = Evidence.from_json((tmp_path / "mb.json").read_text())
    assert ev.measurement(Q.decode_step_latency_key(1)) is None, "nothing was timed"
    floor = ev.measurement(Q.decode_floor_key(1))
    assert floor is not None and "not timed" in floor.note and "stands in" in floor.provenance.source
    assert floor.value == pytest.approx(
        roofline_floor(
            ModelCosts.from_config(cfg, 4).decode_step(1, 16),
            Ceilings(ev.measurement(Q.MEMCPY_BYTES_PER_S).value, ev.measurement(Q.MATMUL_FLOPS_PER_S).value),
        ).seconds
    )
    (tmp_path / "bad.json").write_text("{")
    assert main(["microbench", "--config", str(tmp_path / "bad.json")]) == 2  # bad input: one line, exit 2
    assert "is not JSON" in capsys.readouterr().err
