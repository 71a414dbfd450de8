"""Bytes and FLOPs of a transformer step, and the roofline floor they put under its latency.

A step cannot be faster than the time to move its bytes at the measured copy bandwidth, nor
than the time to do its FLOPs at the measured matmul rate: floor = max(bytes / BW, FLOPs / rate).
Which term wins says what kind of help exists. Decode at small batch is memory-bound (every
step streams all the weights for a few tokens): only fewer bytes (quantization) or fewer steps
(speculative decoding, larger batches) make it faster. A compute-bound step needs fewer FLOPs
or a faster device.

What is counted (per step):
- weights: every linear layer's weight is read once per step (lm_head included; the input
  embedding only for the rows looked up, which is negligible);
- KV cache: a decode step reads each sequence's `context` cached tokens and writes one;
  a prefill writes its prompt's tokens (and reads them back inside attention, not counted);
- FLOPs: 2 per multiply-add of the linear layers per token (logits for one token per
  sequence), plus attention's QK^T and PV: 4 x layers x heads x head_dim per (query, key)
  pair that a causal kernel must compute.
Activations are not counted: next to the weights they are small for decode, and prefill is
compute-bound anyway. The floor is therefore a lower bound, which is what a floor must be.

Standard library only: a ModelCosts can be built from numbers (tests, other engines), from a
config.json's shapes (`ModelCosts.from_config`: the floor where no step can be timed) or from a
loaded torch model (`ModelCosts.from_model`, torch imported there).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["ModelCosts", "StepCost", "Ceilings", "Floor", "roofline_floor"]

_CONFIG_FIELDS = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size")
_EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts")


@dataclass(frozen=True)
class StepCost:
    bytes: float  # bytes moved to/from device memory
    flops: float  # floating-point operations

    @property
    def intensity(self) -> float:
        """FLOPs per byte: above the machine's rate/bandwidth ratio the step is compute-bound."""
        return self.flops / self.bytes if self.bytes else float("inf")


@dataclass(frozen=True)
class ModelCosts:
    """The shape facts a roofline needs, nothing more."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    linear_params_per_token: int  # weights of the decoder's linear layers, each used once per token
    lm_head_params: int  # vocab x hidden
    weight_bytes: float  # bytes of every weight a step reads (linear layers and lm_head)
    kv_dtype_bytes: float  # bytes per cached element (2 for bf16/fp16)

    @property
    def kv_bytes_per_token(self) -> float:
        return self.layers * 2 * self.kv_heads * self.head_dim * self.kv_dtype_bytes

    def _attention_flops(self, query_key_pairs: float) -> float:
        return 4.0 * self.layers * self.heads * self.head_dim * query_key_pairs

    def _linear_flops(self, tokens: int, logits: int) -> float:
        return 2.0 * self.linear_params_per_token * tokens + 2.0 * self.lm_head_params * logits

    def decode_step(self, batch: int, context: int) -> StepCost:
        """One token for each of `batch` sequences that already hold `context` tokens."""
        kv = batch * (context + 1) * self.kv_bytes_per_token  # read context, write one
        return StepCost(
            self.weight_bytes + kv, self._linear_flops(batch, batch) + self._attention_flops(batch * (context + 1))
        )

    def prefill(self, prompt_len: int, batch: int = 1) -> StepCost:
        """A prompt of `prompt_len` tokens from an empty cache (logits for the last token only)."""
        pairs = batch * prompt_len * (prompt_len + 1) / 2  # causal: token i attends i keys
        return StepCost(
            self.weight_bytes + batch * prompt_len * self.kv_bytes_per_token,
            self._linear_flops(batch * prompt_len, batch) + self._attention_flops(pairs),
        )

    @classmethod
    def from_config(cls, config: Mapping[str, Any], dtype_bytes: float) -> ModelCosts:
        """From a decoder config's shapes alone (a config.json's fields), no weights and no torch.

        Counts a Llama-style decoder (Llama, Mistral, Qwen2/3, Gemma): q, k, v and o projections
        and a gated MLP (gate, up, down) per layer, plus the lm_head; biases and norms are a
        rounding error next to them. Raises ValueError for a config it cannot count (a field
        missing, a mixture of experts), saying which.
        """
        cfg = dict(config.get("text_config") or config)
        missing = [k for k in _CONFIG_FIELDS if not isinstance(cfg.get(k), int) or isinstance(cfg.get(k), bool)]
        if missing:
            raise ValueError(f"the config has no integer {', '.join(missing)}: its shapes cannot be counted")
        experts = [k for k in _EXPERT_FIELDS if isinstance(cfg.get(k), int) and cfg[k] > 1]
        if experts:
            raise ValueError(f"a mixture of experts ({experts[0]} = {cfg[experts[0]]}) is not counted yet")
        hidden, heads, layers = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
        kv_heads = cfg.get("num_key_value_heads") or heads
        head_dim = cfg.get("head_dim") or hidden // heads
        per_layer = hidden * head_dim * (2 * heads + 2 * kv_heads) + 3 * hidden * cfg["intermediate_size"]
        lm_head = cfg["vocab_size"] * hidden
        return cls(
            layers=layers,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            linear_params_per_token=layers * per_layer,
            lm_head_params=lm_head,
            weight_bytes=(layers * per_layer + lm_head) * dtype_bytes,
            kv_dtype_bytes=dtype_bytes,
        )

    @classmethod
    def from_model(cls, model: Any) -> ModelCosts:
        """From a loaded transformers causal LM: linear layers counted from its modules."""
        import torch

        cfg = model.config
        text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        heads = int(text_cfg.num_attention_heads)
        head_dim = int(getattr(text_cfg, "head_dim", None) or text_cfg.hidden_size // heads)
        lm_head = model.get_output_embeddings()
        linear_params, weight_bytes = 0, 0.0
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                weight_bytes += module.weight.numel() * module.weight.element_size()
                if module is not lm_head:
                    linear_params += module.weight.numel()
        lm_params = lm_head.weight.numel() if lm_head is not None else 0
        dtype_bytes = next(model.parameters()).element_size()
        return cls(
            layers=int(text_cfg.num_hidden_layers),
            heads=heads,
            kv_heads=int(getattr(text_cfg, "num_key_value_heads", None) or heads),
            head_dim=head_dim,
            linear_params_per_token=linear_params,
            lm_head_params=lm_params,
            weight_bytes=weight_bytes,
            kv_dtype_bytes=dtype_bytes,
        )


@dataclass(frozen=True)
class Ceilings:
    """The machine's measured ceilings (or a datasheet's, when stated so in `source`)."""

    memcpy_bytes_per_s: float
    matmul_flops_per_s: float
    source: str = "measured"


@dataclass(frozen=True)
class Floor:
    seconds: float
    memory_s: float
    compute_s: float
    bound: Literal["memory", "compute"]

    def efficiency(self, measured_s: float) -> float:
        """floor / measured: 1.0 is at the physical limit, 0.1 is ten times slower than it."""
        return self.seconds / measured_s if measured_s > 0 else 0.0


def roofline_floor(cost: StepCost, ceilings: Ceilings) -> Floor:
    memory_s = cost.bytes / ceilings.memcpy_bytes_per_s
    compute_s = cost.flops / ceilings.matmul_flops_per_s
    return Floor(max(memory_s, compute_s), memory_s, compute_s, "memory" if memory_s >= compute_s else "compute")
