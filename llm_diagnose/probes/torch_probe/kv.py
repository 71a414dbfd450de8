"""KV-cache accounting: token slots allocated to live sequences against slots holding a token.

Read from the cache objects transformers already keeps, duck-typed so that a version that
moves an attribute degrades to "not accounted" instead of failing the server:

- `Cache` with per-layer `keys` tensors (DynamicCache, StaticCache, sliding variants):
  allocated = rows x positions of each layer's key tensor, used = rows x tokens stored.
  A DynamicCache grows by concatenation, so it allocates what it uses (waste 0; its cost is
  allocator churn instead). A StaticCache reserves max_cache_len positions per row up front:
  generate sizes it for the longest request seen so far, so the reservation of every later,
  shorter request is waste (the PagedAttention paper's "reservation" loss).
- the continuous-batching `PagedAttentionCache` with the scheduler's request states:
  allocated = blocks in each request's block table x tokens per block, used = each request's
  position (tokens written), capacity = the pool's blocks x tokens per block.

Counts are summed over layers (token-layers), so a hybrid model's sliding layers weigh in
with their own, smaller allocation. Every figure is a host-side integer except a StaticCache's
length, a one-element tensor read once per step (one tiny device-to-host copy on CUDA).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["KvSnapshot", "kv_from_hf_cache", "kv_from_paged"]

Layout = Literal["dynamic", "static", "paged"]


@dataclass(frozen=True)
class KvSnapshot:
    layout: Layout
    allocated_tokens: int  # token slots (summed over layers) reserved for live sequences
    used_tokens: int  # of those, slots that hold a token
    nbytes: int  # bytes of the KV tensors (the whole pool for a paged cache)
    capacity_tokens: int | None = None  # paged: the pool's token slots, per layer
    block_size: int | None = None  # paged: tokens per block
    layers: int = 1  # layers summed into the token counts (to report per-layer figures)


def _as_int(x: Any) -> int:
    return int(x.item()) if hasattr(x, "item") else int(x)


def kv_from_hf_cache(cache: Any) -> KvSnapshot | None:
    """Accounting for a transformers `Cache` with per-layer key tensors; None if unrecognised."""
    layers = getattr(cache, "layers", None)
    if not layers:
        return None
    allocated = used = nbytes = counted = 0
    static = False
    length: int | None = None
    for layer in layers:
        keys = getattr(layer, "keys", None)
        if not getattr(layer, "is_initialized", False) or keys is None or getattr(keys, "ndim", 0) != 4:
            continue
        rows, slots = int(keys.shape[0]), int(keys.shape[-2])
        values = getattr(layer, "values", None)
        nbytes += keys.numel() * keys.element_size() + (
            values.numel() * values.element_size() if values is not None else 0
        )
        if hasattr(layer, "max_cache_len") and hasattr(layer, "cumulative_length"):
            static = True
            if length is None:  # every full-attention layer holds the same number of tokens: read it once
                length = _as_int(layer.cumulative_length)
            stored = min(length, slots)
        else:
            stored = int(layer.get_seq_length()) if hasattr(layer, "get_seq_length") else slots
            stored = min(stored, slots)
        allocated += rows * slots
        used += rows * stored
        counted += 1
    if counted == 0:
        return None
    return KvSnapshot("static" if static else "dynamic", allocated, used, nbytes, layers=counted)


def kv_from_paged(cache: Any, scheduler: Any) -> KvSnapshot | None:
    """Accounting for a continuous-batching paged cache and its scheduler; None if unrecognised."""
    allocators = getattr(cache, "cache_allocators", None)
    active = getattr(scheduler, "active_requests", None)
    if not allocators or active is None:
        return None
    positions = {rid: int(getattr(state, "position_offset", 0)) for rid, state in list(active.items())}
    allocated = used = capacity = layers = 0
    block_size = None
    for allocator in list(allocators.values()):
        per_block = int(getattr(allocator, "tokens_per_page", 0))
        n_layers = len(getattr(allocator, "layer_indices", ())) or 1
        table = getattr(allocator, "block_table", None)
        if per_block <= 0 or table is None:
            return None
        block_size = block_size or per_block
        capacity += int(getattr(allocator, "num_blocks", 0)) * per_block * n_layers
        layers += n_layers
        window = getattr(allocator, "sliding_window", None)
        for rid, blocks in list(table.items()):
            slots = len(blocks) * per_block
            stored = positions.get(rid, slots)  # a request without a state (being forked): count as full
            if window:
                stored = min(stored, int(window))
            allocated += slots * n_layers
            used += min(stored, slots) * n_layers
    tensor = getattr(cache, "cache_tensor", None)
    nbytes = int(tensor.numel() * tensor.element_size()) if tensor is not None else 0
    return KvSnapshot(
        "paged",
        allocated,
        used,
        nbytes,
        capacity_tokens=capacity // max(layers, 1),
        block_size=block_size,
        layers=max(layers, 1),
    )
