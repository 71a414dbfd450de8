"""Microbenchmarks of a causal LM's steps, in-process, on a transformers static KV cache.

Each step is one `model(...)` forward, timed with the timing core:

- decode(batch, context): one new token for each of `batch` sequences holding `context`
  cached tokens (the cache holds exactly context + 1 positions, so attention reads no slack);
- eager_decode(batch, context): the same step on the host clock with the device synchronized
  after each call: what a server that launches every kernel from Python pays per step;
- prefill(prompt_len): a prompt from an empty cache, logits for its last token only;
- packed(tokens, context): one row of `tokens` new tokens over a `context`-token cache: the
  shape of a mixed step, in which decode tokens and a prefill chunk share one forward.
  `packed(B + C) / packed(B)` is the cost a prefill chunk of C tokens adds to a step of B
  decodes. It is a proxy: exact for the linear layers (their weights and FLOPs scale with the
  tokens in the step, which dominates short contexts), approximate for attention (one shared
  context instead of B separate ones), so it understates the attention share at long contexts.

A static cache keeps every shape fixed from call to call, which CUDA-graph capture needs; the
cache's write position is reset before each call (a one-element fill per layer, part of the
timed call), so every repetition is the same step, not the next one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llm_diagnose.probes.results import Measurement
from llm_diagnose.probes.timing import CpuTimer, Timer, select_timer

__all__ = ["StepBench", "MODEL_PRESETS", "build_causal_lm"]

# Llama-shaped presets created in-process with seeded random weights (nothing is downloaded).
MODEL_PRESETS: dict[str, dict[str, int]] = {
    # The project's tiny model shape (1.45 M parameters): fast enough for CPU tests.
    "tiny": {
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 32,
        "intermediate_size": 352,
        "vocab_size": 4096,
    },
    # 0.87 B parameters, 1.7 GB in bf16: big enough on a GPU that decode streams weights from HBM.
    "gpu-small": {
        "hidden_size": 2048,
        "num_hidden_layers": 16,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 5504,
        "vocab_size": 32000,
    },
}


def build_causal_lm(
    preset: str | dict[str, int] = "tiny",
    *,
    device: Any = "cpu",
    dtype: Any = None,
    seed: int = 0,
    max_positions: int = 8192,
) -> Any:
    """A Llama causal LM with seeded random weights, created directly on `device`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = MODEL_PRESETS[preset] if isinstance(preset, str) else dict(preset)
    dtype = dtype or torch.bfloat16
    kwargs: dict[str, Any] = {
        **shape,
        "max_position_embeddings": max_positions,
        "tie_word_embeddings": False,
        "attn_implementation": "sdpa",
    }
    config = LlamaConfig(**kwargs)
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype)
    return model.eval()


@dataclass
class StepBench:
    """Times decode, prefill and packed steps of `model` with one timer (chosen for its device)."""

    model: Any
    timer: Timer | None = None
    budget_s: float = 0.3
    seed: int = 0

    def __post_init__(self) -> None:
        if self.timer is None:
            self.timer = select_timer(self.device)

    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device

    def _tokens(self, batch: int, length: int) -> Any:
        import torch

        gen = torch.Generator(device="cpu").manual_seed(self.seed + 7919 * batch + length)
        vocab = self.model.config.vocab_size
        return torch.randint(3, vocab, (batch, length), generator=gen).to(self.device)

    def _filled_cache(self, batch: int, max_len: int, context: int) -> Any:
        """A static cache for `batch` rows of `max_len` positions, holding `context` tokens."""
        import torch
        from transformers import StaticCache

        cache = StaticCache(config=self.model.config, max_cache_len=max_len)
        # A forward allocates the cache tensors (lazily, at the right dtype and device) and,
        # when context > 0, fills them; context 0 still needs one call to allocate.
        fill = max(context, 1)
        ids = self._tokens(batch, fill)
        pos = torch.arange(fill, device=self.device).expand(batch, fill)
        with torch.inference_mode():
            self.model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return cache

    @staticmethod
    def _rewind(cache: Any, length: int) -> None:
        for layer in cache.layers:
            layer.cumulative_length.fill_(length)

    def _time(
        self, cache: Any, context: int, ids: Any, pos: Any, label: str, timer: Timer | None = None, sync: bool = False
    ) -> Measurement:
        import torch

        model = self.model
        synchronize = torch.cuda.synchronize if sync and self.device.type == "cuda" else None

        def step() -> None:
            self._rewind(cache, context)
            model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=1)
            if synchronize is not None:
                synchronize()

        with torch.inference_mode():
            timer = timer or self.timer
            assert timer is not None
            return timer.measure(step, budget_s=self.budget_s, label=label)

    def decode(self, batch: int, context: int) -> Measurement:
        """One decode step: `batch` sequences, each with `context` tokens cached."""
        import torch

        cache = self._filled_cache(batch, context + 1, context)
        ids = self._tokens(batch, 1)
        pos = torch.full((batch, 1), context, device=self.device)
        return self._time(cache, context, ids, pos, f"decode step, batch {batch}, context {context}")

    def eager_decode(self, batch: int, context: int) -> Measurement:
        """The same decode step launched eagerly, as a server without CUDA graphs runs it: the host
        clock around each call, the device synchronized after it, so every kernel launch from
        Python is in the figure (on a CPU this is the decode step itself)."""
        import torch

        cache = self._filled_cache(batch, context + 1, context)
        ids = self._tokens(batch, 1)
        pos = torch.full((batch, 1), context, device=self.device)
        timer = CpuTimer(
            why="the eager step: host clock around each call with the device synchronized after it, so the "
            "per-kernel dispatch from Python is in it"
        )
        label = f"eager decode step, batch {batch}, context {context}"
        return self._time(cache, context, ids, pos, label, timer=timer, sync=True)

    def prefill(self, prompt_len: int, batch: int = 1) -> Measurement:
        """A prefill of `prompt_len` tokens per row into an empty cache."""
        import torch

        cache = self._filled_cache(batch, prompt_len, 0)
        ids = self._tokens(batch, prompt_len)
        pos = torch.arange(prompt_len, device=self.device).expand(batch, prompt_len)
        return self._time(cache, 0, ids, pos, f"prefill, batch {batch}, prompt {prompt_len}")

    def packed(self, tokens: int, context: int) -> Measurement:
        """`tokens` new tokens in one row over a `context`-token cache (the mixed-step proxy)."""
        import torch

        cache = self._filled_cache(1, context + tokens, context)
        ids = self._tokens(1, tokens)
        pos = (context + torch.arange(tokens, device=self.device)).unsqueeze(0)
        return self._time(cache, context, ids, pos, f"packed step, {tokens} tokens over context {context}")
