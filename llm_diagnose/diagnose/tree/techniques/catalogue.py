"""The registry of techniques: an explicit tuple of the records, in the order a diagnosis lists
them, and the views the rest of the tool reads (by id, the headline's ranking, the nodes that
record a technique on). A technique is in the tool exactly when its record is in `TECHNIQUES`.
"""

from __future__ import annotations

from llm_diagnose.diagnose.tree.techniques import (
    chunked_prefill,
    continuous_batching,
    kv_offload,
    offline_batch,
    paged_attention,
    parallelism,
    pd_disaggregation,
    prefix_caching,
    quantization,
    scale_out,
    speculative_decoding,
)
from llm_diagnose.diagnose.tree.techniques.record import Technique

__all__ = ["TECHNIQUES", "CATALOGUE", "TECHNIQUE_IDS", "TECHNIQUE_RANK", "TECHNIQUE_ON_NODES"]

TECHNIQUES: tuple[Technique, ...] = (
    quantization.TECHNIQUE,
    parallelism.TECHNIQUE,
    scale_out.TECHNIQUE,
    prefix_caching.TECHNIQUE,
    continuous_batching.TECHNIQUE,
    paged_attention.TECHNIQUE,
    speculative_decoding.TECHNIQUE,
    chunked_prefill.TECHNIQUE,
    pd_disaggregation.TECHNIQUE,
    kv_offload.TECHNIQUE,
    offline_batch.TECHNIQUE,
)

CATALOGUE: dict[str, Technique] = {t.id: t for t in TECHNIQUES}
TECHNIQUE_IDS: tuple[str, ...] = tuple(CATALOGUE)
# Most consequential first: what slows every request or caps throughput, before what costs a share.
TECHNIQUE_RANK: tuple[str, ...] = tuple(t.id for t in sorted(TECHNIQUES, key=lambda t: t.rank))
# The path node where the tree records whether a technique is switched on (yes / no / unknown).
TECHNIQUE_ON_NODES: dict[str, str] = {t.id: t.on_node for t in TECHNIQUES if t.on_node}
