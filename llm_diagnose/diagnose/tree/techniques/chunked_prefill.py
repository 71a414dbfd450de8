"""Chunked prefill: long prefills in pieces, so decode steps of running streams keep going (decided by Q6)."""

from __future__ import annotations

from llm_diagnose.diagnose.tree.techniques.claim import TAIL_MIN_EFFECT, down
from llm_diagnose.diagnose.tree.techniques.record import Technique
from llm_diagnose.diagnose.tree.techniques.setting import TRT_YAML, Setting, per_engine
from llm_diagnose.probes import quantities as Q

TECHNIQUE = Technique(
    id="chunked-prefill",
    name="Chunked prefill",
    fixes="long prefills stall the decode steps of running streams",
    rank=60,
    claims=(down(Q.ITL_INFLATION), down(Q.ITL_P99, TAIL_MIN_EFFECT)),
    on_node="Q6.chunked-prefill-on",
    switch=Q.CHUNKED_PREFILL,
    tuned_by=(Q.MAX_NUM_BATCHED_TOKENS,),
    options=per_engine(
        vllm=[
            Setting("--enable-chunked-prefill", versions="on by default since vLLM 0.8, the V1 engine"),
            Setting(
                "--max-num-batched-tokens 2048",
                "the token budget of a step, so the chunk: smaller bounds the stall, "
                "larger favours TTFT; vLLM 0.32 defaults to 2048 on most GPUs, 8192 on H100/H200",
            ),
            Setting("--long-prefill-token-threshold 512", "caps the tokens one long prompt takes from a step"),
        ],
        sglang=[
            Setting(
                "--chunked-prefill-size 2048",
                "the chunk size; its default depends on GPU memory, -1 turns chunking off",
            ),
            Setting("--enable-mixed-chunk", "runs decodes in the same batch as a prefill chunk"),
        ],
        trtllm=[
            Setting("--enable_chunked_prefill", "off by default in trtllm-serve; the chunk follows --max_num_tokens"),
            Setting("enable_chunked_prefill: true", f"the same, {TRT_YAML}", kind="config"),
        ],
    ),
)
