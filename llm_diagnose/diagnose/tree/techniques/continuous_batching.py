"""Continuous (iteration-level) batching: short requests stop waiting for long ones (decided by Q3)."""

from __future__ import annotations

from llm_diagnose.diagnose.tree.techniques.claim import down, up
from llm_diagnose.diagnose.tree.techniques.record import Technique
from llm_diagnose.diagnose.tree.techniques.setting import Setting, per_engine
from llm_diagnose.probes import quantities as Q

TECHNIQUE = Technique(
    id="continuous-batching",
    name="Continuous (iteration-level) batching",
    fixes="short requests wait for long ones in a static batch",
    rank=30,
    claims=(down(Q.SHORT_WAIT_FOR_LONG), up(Q.GEN_TOKENS_PER_S)),
    on_node="Q3.continuous-batching-on",
    switch=Q.CONTINUOUS_BATCHING,
    options=per_engine(
        vllm=[
            Setting(
                "",
                "built in, nothing to turn on: if short requests still wait, the batch is capped: "
                "raise --max-num-seqs and --max-num-batched-tokens",
                kind="none",
            )
        ],
        sglang=[
            Setting("", "built in, nothing to turn on: the batch is capped by --max-running-requests", kind="none")
        ],
        trtllm=[
            Setting(
                "",
                "built in: trtllm-serve batches in flight; the batch is capped by --max_batch_size and "
                "--max_num_tokens",
                kind="none",
            )
        ],
        transformers=[Setting("transformers serve --continuous-batching", kind="command")],
    ),
)
