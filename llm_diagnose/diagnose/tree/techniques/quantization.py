"""Quantization: fewer bytes per weight and per KV token (decided by Q1)."""

from __future__ import annotations

from llm_diagnose.diagnose.tree.techniques.claim import PREEMPTION_MIN_EFFECT, QUEUE_MIN_EFFECT, down, up
from llm_diagnose.diagnose.tree.techniques.record import Technique
from llm_diagnose.diagnose.tree.techniques.setting import TRT_YAML, Setting, per_engine
from llm_diagnose.probes import quantities as Q

TECHNIQUE = Technique(
    id="quantization",
    name="Quantization (weights and KV cache)",
    fixes="the model and its KV cache do not fit with room to spare",
    rank=20,
    claims=(
        up(Q.KV_CAPACITY_TOKENS),
        down(Q.PREEMPTIONS, PREEMPTION_MIN_EFFECT, relative=False),
        down(Q.WAITING_MEAN, QUEUE_MIN_EFFECT, relative=False),
    ),
    tuned_by=(Q.WEIGHT_QUANTIZATION, Q.KV_CACHE_DTYPE),
    options=per_engine(
        vllm=[
            Setting(
                "--quantization fp8",
                "FP8 weights and activations, quantized at load on Ada, Hopper, Blackwell; "
                "a pre-quantized AWQ/GPTQ/compressed-tensors checkpoint needs no flag",
            ),
            Setting("--kv-cache-dtype fp8", "halves KV bytes per token"),
        ],
        sglang=[
            Setting("--quantization fp8", "FP8 weights quantized at load; a pre-quantized checkpoint needs no flag"),
            Setting(
                "--kv-cache-dtype fp8_e4m3",
                "halves KV bytes per token; FlashAttention-3, the Hopper default, takes only fp8_e4m3",
            ),
        ],
        trtllm=[
            Setting(
                "",
                "serve a checkpoint quantized with NVIDIA ModelOpt, FP8 or NVFP4 on Blackwell: "
                "trtllm-serve reads the scheme from the checkpoint",
                kind="none",
            ),
            Setting(
                "kv_cache_config: {dtype: fp8}",
                f"FP8 KV cache, {TRT_YAML}",
                kind="config",
                versions="TensorRT-LLM 1.0+, PyTorch backend",
            ),
        ],
    ),
)
