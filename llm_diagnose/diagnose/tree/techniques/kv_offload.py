"""KV-cache offload: a CPU or disk tier keeps evicted prefix blocks for reuse (decided by the KV question)."""

from __future__ import annotations

from llm_diagnose.diagnose.tree.techniques.claim import FRACTION_MIN_EFFECT, up
from llm_diagnose.diagnose.tree.techniques.record import Technique
from llm_diagnose.diagnose.tree.techniques.setting import TRT_YAML, Setting, per_engine
from llm_diagnose.probes import quantities as Q

TECHNIQUE = Technique(
    id="kv-offload",
    name="KV-cache offload (CPU / disk tier)",
    fixes="useful prefix cache is evicted before it is reused",
    rank=80,
    claims=(up(Q.PREFIX_HIT_RATE, FRACTION_MIN_EFFECT, relative=False, towards=Q.PREFIX_POTENTIAL),),
    on_node="KV.offload-on",
    switch=Q.KV_OFFLOAD,
    options=per_engine(
        vllm=[
            Setting(
                "--kv-offloading-size <GiB> --kv-offloading-backend native",
                "a CPU tier for evicted prefix blocks",
                versions="vLLM 0.14+",
            ),
            Setting(
                '--kv-transfer-config \'{"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}\'',
                "LMCache, installed separately",
                versions="vLLM 0.10+",
            ),
        ],
        sglang=[
            Setting(
                "--enable-hierarchical-cache --hicache-ratio 2",
                "a host KV pool twice the device pool; --hicache-size sets it in GB instead",
            )
        ],
        trtllm=[
            Setting(
                "kv_cache_config: {host_cache_size: <bytes>}",
                f"a host tier for reusable blocks, {TRT_YAML}",
                kind="config",
            )
        ],
    ),
)
