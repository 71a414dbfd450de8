"""More replicas or admission limits: the model fits, the load does not (decided by Q1 and Q5)."""

from __future__ import annotations

from llm_diagnose.diagnose.tree.techniques.claim import (
    FRACTION_MIN_EFFECT,
    PREEMPTION_MIN_EFFECT,
    QUEUE_MIN_EFFECT,
    down,
)
from llm_diagnose.diagnose.tree.techniques.record import Technique
from llm_diagnose.diagnose.tree.techniques.setting import Setting, per_engine
from llm_diagnose.probes import quantities as Q

_REPLICAS = Setting("", "more replicas behind the load balancer: size them with llm-diagnose plan", kind="none")
_PER_REPLICA = "down per replica"

TECHNIQUE = Technique(
    id="scale-out",
    name="More replicas or admission limits",
    fixes="the model fits, but load fills the KV cache, queues requests or preempts them",
    rank=110,
    claims=(
        down(Q.WAITING_MEAN, QUEUE_MIN_EFFECT, relative=False, said=_PER_REPLICA),
        down(Q.PREEMPTIONS, PREEMPTION_MIN_EFFECT, relative=False, said=_PER_REPLICA),
        down(Q.KV_USAGE_P95, FRACTION_MIN_EFFECT, relative=False, said="below saturation"),
    ),
    tuned_by=(Q.MAX_NUM_SEQS,),
    options=per_engine(
        vllm=[
            _REPLICAS,
            Setting("--data-parallel-size <N>", "replicas inside one server, one per device group"),
            Setting(
                "--max-num-seqs <N>",
                "an admission limit: fewer sequences per step, the rest wait instead of preempting",
            ),
            Setting("--kv-cache-dtype fp8", "a capacity lever: about twice the KV tokens in the same memory"),
        ],
        sglang=[
            _REPLICAS,
            Setting("--dp-size <N>", "replicas inside one server"),
            Setting("--max-running-requests <N>", "an admission limit"),
            Setting("--kv-cache-dtype fp8_e4m3", "a capacity lever: about twice the KV tokens in the same memory"),
        ],
        trtllm=[
            _REPLICAS,
            Setting("--max_batch_size <N>", "an admission limit, an option of trtllm-serve"),
        ],
    ),
)
