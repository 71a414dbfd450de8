"""The PyTorch probe in-process: KV accounting on real transformers caches, the paged path, evidence, launcher."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.metrics.window import Window, record_from_text
from llm_diagnose.probes.torch_probe import TorchProbe, classify_step
from llm_diagnose.probes.torch_probe.evidence import evidence_from_window

USED, ALLOCATED = "llmd_torch:kv_used_token_steps_total", "llmd_torch:kv_allocated_token_steps_total"


def _value(page: str, series: str) -> float:
    line = next(line for line in page.splitlines() if line.startswith(series + " "))
    return float(line.rsplit(" ", 1)[1])


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)


def _record(probe: TorchProbe):
    return record_from_text(time.time(), time.monotonic(), probe.exposition(), None, None, "in-process")


def test_phases_are_classified_from_shapes() -> None:
    assert classify_step(8, 8) == "decode" and classify_step(1, 300) == "prefill"
    assert classify_step(9, 264) == "mixed"


def test_static_cache_reservation_is_waste_and_dynamic_cache_wastes_nothing(model) -> None:
    import torch

    probe = TorchProbe(process_metrics=False)
    probe.instrument(model)
    ids = torch.tensor([[1, 5, 6, 7, 8]])
    before = _record(probe)
    model.generate(ids, max_new_tokens=10, do_sample=False, eos_token_id=None)
    page = probe.exposition()
    assert _value(page, USED) == _value(page, ALLOCATED)
    model.generate(ids, max_new_tokens=10, do_sample=False, eos_token_id=None, cache_implementation="static")
    after = _record(probe)
    ev = evidence_from_window(Window("in-process", (before, after)))
    slots = _value(probe.exposition(), "llmd_torch:kv_allocated_tokens") / 2  # per layer: 2 layers
    used = sum(range(5, 15))  # prefill writes 5 tokens, then 9 decodes write one each
    expected = 1 - used / (10 * slots)  # the static half of the window; the dynamic half wasted nothing
    assert ev[Q.KV_WASTE_FRACTION].value == pytest.approx(expected * 10 * slots / (10 * slots + used))
    assert ev[Q.CONTINUOUS_BATCHING].value is False and ev[Q.PAGED_KV].value is False
    assert ev[Q.ENGINE_NAME].value == "transformers" and ev[Q.FORWARD_STEPS].value == 20
    assert ev[Q.OUTPUT_LEN_P50].value == pytest.approx(10, abs=2)  # bucket estimate (8-16 bucket)
    assert ev[Q.ALLOCATOR_FRAGMENTATION].kind == "not-measured" and "cpu" in ev[Q.ALLOCATOR_FRAGMENTATION].reason


def test_continuous_batching_paged_cache_is_accounted_per_step(model) -> None:
    from transformers import ContinuousBatchingConfig, GenerationConfig
    from transformers.generation.continuous_batching import continuous_api

    from llm_diagnose.probes.torch_probe.autopatch import patch_continuous_batching

    probe = TorchProbe(process_metrics=False)
    probe.instrument(model)
    cls = continuous_api.ContinuousBatchProcessor
    saved = cls._generation_step, cls.update_batch
    try:
        assert patch_continuous_batching(continuous_api, probe)
        manager = model.init_continuous_batching(
            generation_config=GenerationConfig(max_new_tokens=6, do_sample=False, eos_token_id=-1),
            continuous_batching_config=ContinuousBatchingConfig(page_size=16, num_blocks=64),
        )
        manager.start()
        ids = [
            manager.add_request([1, 5, 6, 7, 8, 9], max_new_tokens=4),
            manager.add_request([1, 5, 6], max_new_tokens=20),
        ]
        for _ in ids:
            manager.get_result(timeout=60)
        manager.stop(block=True)
    finally:
        cls._generation_step, cls.update_batch = saved
    page = probe.exposition()
    assert 'kv_layout="paged"' in page and 'continuous_batching="true"' in page
    assert _value(page, "llmd_torch:kv_block_size_tokens") == 16
    assert _value(page, "llmd_torch:kv_capacity_tokens") >= 64 * 16
    assert _value(page, "llmd_torch:requests_finished_total") == 2
    assert _value(page, "llmd_torch:request_generation_tokens_sum") == 24
    waste = 1 - _value(page, USED) / _value(page, ALLOCATED)
    assert 0.2 < waste < 0.9  # 6- and 3-token prompts in 16-token blocks: most of each block is empty


def test_launcher_starts_the_probe_and_instruments_from_pretrained(tiny_model_dir: Path) -> None:
    child = (
        "import sys, torch, urllib.request\n"
        "from transformers import AutoModelForCausalLM\n"
        "from llm_diagnose.probes.torch_probe import get_probe\n"
        f"m = AutoModelForCausalLM.from_pretrained({str(tiny_model_dir)!r})\n"
        "m.generate(torch.tensor([[1, 5, 6]]), max_new_tokens=3, do_sample=False)\n"
        "host, port = get_probe().address\n"
        "print(urllib.request.urlopen(f'http://{host}:{port}/metrics').read().decode())\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "llm_diagnose", "instrument", "--port", "0", "--", sys.executable, "-c", child],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "llm-diagnose instrument: probe metrics on http://127.0.0.1:" in out.stderr
    assert 'engine="transformers"' in out.stdout and 'llmd_torch:forward_seconds_count{phase="decode"}' in out.stdout


def test_instrument_cli_errors_are_one_line_usage_errors() -> None:
    for argv, message in (
        (["instrument"], "no command to run"),
        (["instrument", "--", "no-such-command-xyz"], "command not found"),
    ):
        out = subprocess.run([sys.executable, "-m", "llm_diagnose", *argv], capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and message in out.stderr
