"""Paged KV cache (PagedAttention): no KV memory reserved per request at max length (decided by Q4)."""

from __future__ import annotations

from llm_diagnose.diagnose.tree.techniques.claim import FRACTION_MIN_EFFECT, down, up
from llm_diagnose.diagnose.tree.techniques.record import Technique
from llm_diagnose.diagnose.tree.techniques.setting import Setting, per_engine
from llm_diagnose.probes import quantities as Q

TECHNIQUE = Technique(
    id="paged-attention",
    name="Paged KV cache (PagedAttention)",
    fixes="KV memory reserved per request at max length caps the batch",
    rank=40,
    claims=(down(Q.KV_WASTE_FRACTION, FRACTION_MIN_EFFECT, relative=False), up(Q.RUNNING_MEAN)),
    on_node="Q4.paged-kv-on",
    switch=Q.PAGED_KV,
    tuned_by=(Q.BLOCK_SIZE,),
    mechanism=Q.KV_WASTE_FRACTION,
    options=per_engine(
        vllm=[
            Setting(
                "",
                "built in: the KV cache is always paged; --block-size sets tokens per block "
                "16 by default on GPUs, 128 on the CPU backend",
                kind="none",
            )
        ],
        sglang=[
            Setting(
                "",
                "built in: --page-size sets tokens per page; 1 by default, but the attention backend can "
                "raise it (FlashMLA 64, Cutlass MLA 128, TRT-LLM MHA 64, the default on Blackwell)",
                kind="none",
            )
        ],
        trtllm=[
            Setting(
                "",
                "built in: the PyTorch backend's KV cache is paged; kv_cache_config.tokens_per_block "
                "sets the page, 32 by default",
                kind="none",
            ),
            Setting(
                "trtllm-build --kv_cache_type paged",
                "TensorRT engines only; paged is the default, and replaces the deprecated paged_kv_cache option",
                kind="command",
            ),
        ],
        transformers=[
            Setting(
                "transformers serve --continuous-batching",
                "continuous batching runs on a paged cache",
                kind="command",
            )
        ],
    ),
)
