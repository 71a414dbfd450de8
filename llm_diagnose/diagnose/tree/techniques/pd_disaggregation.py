"""Prefill/decode disaggregation: prefill and decode on separate instances (decided by Q6)."""

from __future__ import annotations

from llm_diagnose.diagnose.tree.techniques.claim import RELATIVE_MIN_EFFECT, TAIL_MIN_EFFECT, Claim, down
from llm_diagnose.diagnose.tree.techniques.record import Technique
from llm_diagnose.diagnose.tree.techniques.setting import Setting, per_engine
from llm_diagnose.probes import quantities as Q

TECHNIQUE = Technique(
    id="pd-disaggregation",
    name="Prefill/decode disaggregation",
    fixes="prefill still stalls decode with chunked prefill on, at a scale that can spare instances",
    rank=100,
    claims=(down(Q.ITL_P99, TAIL_MIN_EFFECT), Claim(Q.TTFT_P50, "not-up", RELATIVE_MIN_EFFECT)),
    switch=Q.PD_DISAGGREGATION,
    options=per_engine(
        vllm=[
            Setting(
                '--kv-transfer-config \'{"kv_connector": "NixlConnector", "kv_role": "kv_both"}\'',
                "on separate prefill and decode instances behind a P/D-aware router: llm-d, Dynamo, or vLLM's "
                "disaggregated proxy example",
                versions="vLLM 0.10+",
            )
        ],
        sglang=[
            Setting(
                "--disaggregation-mode prefill --disaggregation-transfer-backend mooncake",
                "the prefill instance; the decode instance takes --disaggregation-mode decode; nixl is the other "
                "transfer backend; the SGLang router routes between them",
            )
        ],
        trtllm=[
            Setting(
                "trtllm-serve disaggregated -c disagg_config.yaml",
                "context and generation servers listed in the YAML, each with a cache_transceiver_config",
                kind="command",
            )
        ],
    ),
)
