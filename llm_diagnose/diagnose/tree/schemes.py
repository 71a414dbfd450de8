"""What a configuration string means: quantization schemes, KV dtypes, draft methods, defaults.

Engines name the same thing many ways ("awq_marlin", "compressed-tensors W4A16", "GPTQ"), so
the tree judges by the scheme behind the name: weight-only (activations stay 16-bit, weights
are dequantized per GEMM) or weight-and-activation (FP8 W8A8, NVFP4 W4A4). Pure functions of
strings; `None` means the string does not say.
"""

from __future__ import annotations

import re

__all__ = ["weight_scheme", "kv_quantized", "spec_method_class", "default_on", "engine_is_vllm_v1"]

# Method names that quantize weights only (vLLM --quantization values and checkpoint formats).
_WEIGHT_ONLY = frozenset(
    {
        "awq",
        "awq_marlin",
        "awq_triton",
        "gptq",
        "gptq_marlin",
        "gptq_marlin_24",
        "gptq_bitblas",
        "marlin",
        "bitblas",
        "bitsandbytes",
        "bnb",
        "nf4",
        "gguf",
        "hqq",
        "aqlm",
        "exl2",
        "quip",
        "squeezellm",
        "machete",
        "int4_awq",
        "int8_wo",
        "int4_wo",
        "int4wo",
        "int8wo",
        "moe_wna16",
        "experts_int8",
        "quark_w4a16",
        "inc",
        "auto-round",
        "autoround",
        "torchao_int4",
    }
)
# Names that quantize activations too.
_WEIGHT_ACT = frozenset(
    {
        "fp8",
        "fbgemm_fp8",
        "ptpc_fp8",
        "modelopt",
        "modelopt_fp4",
        "nvfp4",
        "w8a8",
        "int8_w8a8",
        "fp8_w8a8",
        "smoothquant",
        "w4a8",
        "w4a4",
        "mxfp8",
        "fp8_e4m3",
        "fp8_e5m2",
        "deepspeedfp",
    }
)
_NONE = frozenset({"none", "", "no", "null", "false", "unquantized", "bf16", "bfloat16", "fp16", "float16", "auto"})
_WA = re.compile(r"w(\d+)a(\d+)")


def weight_scheme(method: str | None) -> str | None:
    """'none', 'weight-only', 'weight-activation', or None when the string does not say which
    (e.g. bare 'compressed-tensors', whose scheme lives in the checkpoint)."""
    if method is None:
        return None
    text = method.strip().lower()
    if text in _NONE:
        return "none"
    m = _WA.search(text.replace("-", "").replace("_", ""))
    if m:
        return "weight-only" if m.group(2) == "16" else "weight-activation"
    tokens = set(re.split(r"[\s,;:/()]+", text)) | {text}
    if tokens & _WEIGHT_ONLY or any(t.startswith(("awq", "gptq", "marlin", "bnb", "bitsandbytes")) for t in tokens):
        return "weight-only"
    if tokens & _WEIGHT_ACT or any(t.startswith(("fp8", "nvfp4", "modelopt")) for t in tokens):
        return "weight-activation"
    return None


_KV_QUANT = re.compile(r"(fp8|fp4|int8|int4|int2|nf4|e4m3|e5m2|q8|q4|turboquant)")


def kv_quantized(dtype: str | None) -> bool | None:
    """Whether a KV-cache dtype is quantized (FP8, the FP4 family, int8/int4); None when unseen."""
    if dtype is None:
        return None
    text = dtype.strip().lower()
    if text in ("", "auto", "bf16", "bfloat16", "fp16", "float16", "half", "fp32", "float32", "float"):
        return False
    return bool(_KV_QUANT.search(text))


def spec_method_class(method: str | None) -> str | None:
    """'ngram' (prompt lookup: no forward pass), 'head' (EAGLE, EAGLE-3, MTP, Medusa, MLP
    speculators: a layer on the target's hidden states), 'model' (a separate draft model), or None."""
    if not method:
        return None
    text = method.strip().lower().replace("-", "_")
    if any(k in text for k in ("ngram", "n_gram", "suffix", "lookup", "prompt_lookup")):
        return "ngram"
    if any(k in text for k in ("eagle", "mtp", "medusa", "mlp", "hydra", "nextn", "lilicorr")):
        return "head"
    if any(k in text for k in ("draft", "pard", "standalone", "model")):
        return "model"
    return None


def _version(text: str | None) -> tuple[int, ...] | None:
    m = re.match(r"\s*v?(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def engine_is_vllm_v1(engine: str | None, version: str | None) -> bool:
    """vLLM's V1 engine is the default from 0.8.0 (and the only engine from 0.11)."""
    v = _version(version)
    return (engine or "").lower() == "vllm" and v is not None and v >= (0, 8)


# Settings on by default: (engine, setting key) -> the condition's wording. SGLang turns chunked
# prefill on by default (chunked_prefill_size is set from GPU memory; -1 disables it) and runs
# its radix prefix cache unless --disable-radix-cache.
_DEFAULTS = {
    ("vllm", "config.chunked_prefill"): "on by default in vLLM V1 (0.8+)",
    ("vllm", "config.prefix_caching"): "on by default in vLLM V1 (0.8+)",
    ("sglang", "config.chunked_prefill"): "on by default in SGLang (--chunked-prefill-size)",
    ("sglang", "config.prefix_caching"): "on by default in SGLang (the radix cache)",
}


def default_on(key: str, engine: str | None, version: str | None) -> str | None:
    """Why `key` is on by the engine's default, or None when it is not known to be."""
    name = (engine or "").lower()
    if name == "vllm" and not engine_is_vllm_v1(engine, version):
        return None
    return _DEFAULTS.get((name, key))
