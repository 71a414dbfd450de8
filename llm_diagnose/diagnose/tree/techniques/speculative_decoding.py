"""Speculative decoding: several tokens per step where drafts are accepted (decided by Q5)."""

from __future__ import annotations

from llm_diagnose.diagnose.tree.techniques.claim import Claim, down
from llm_diagnose.diagnose.tree.techniques.record import Technique
from llm_diagnose.diagnose.tree.techniques.setting import TRT_YAML, Setting, per_engine
from llm_diagnose.probes import quantities as Q

ACCEPTANCE_FLOOR = 0.5  # drafts accepted less often than this cost more steps than they save

TECHNIQUE = Technique(
    id="speculative-decoding",
    name="Speculative decoding",
    fixes="per-token decode latency is the complaint and drafts would be accepted",
    rank=70,
    claims=(
        down(Q.ITL_P50),
        Claim(Q.SPEC_ACCEPTANCE_RATE, "at-least", 0.0, relative=False, level=ACCEPTANCE_FLOOR),
    ),
    on_node="Q5.spec-decode-on",
    switch=Q.SPEC_DECODE,
    tuned_by=(Q.NUM_SPECULATIVE_TOKENS, Q.SPEC_METHOD),
    options=per_engine(
        vllm=[
            Setting(
                '--speculative-config \'{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}\'',
                "prompt lookup, no draft model: pays off when outputs repeat the prompt",
                versions="vLLM 0.9+",
            ),
            Setting(
                '--speculative-config \'{"method": "eagle3", "model": "<draft>", "num_speculative_tokens": 3}\'',
                "an EAGLE-3 draft trained for this model; method eagle takes EAGLE-1/2 drafts, draft_model a "
                "small model of the same family",
                versions="vLLM 0.9+",
            ),
            Setting(
                '--speculative-config \'{"method": "mtp", "num_speculative_tokens": 1}\'',
                "models that ship multi-token-prediction heads, e.g. DeepSeek-V3, Qwen3-Next",
                versions="vLLM 0.12+; per-model names such as deepseek_mtp before",
            ),
        ],
        sglang=[
            Setting(
                "--speculative-algorithm EAGLE3 --speculative-draft-model-path <draft> --speculative-num-steps 3 "
                "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4",
                "EAGLE for EAGLE-1/2 drafts, STANDALONE for a small draft model, NEXTN for MTP heads",
            ),
            Setting("--speculative-algorithm NGRAM", "no draft model; CUDA only"),
        ],
        trtllm=[
            Setting(
                "speculative_config: {decoding_type: Eagle3, max_draft_len: 3, speculative_model_dir: <draft>}",
                f"{TRT_YAML}; decoding_type NGram needs no draft, MTP uses the model's own heads; "
                "speculative_model is the newer name of speculative_model_dir",
                kind="config",
                versions="TensorRT-LLM 1.0+, PyTorch backend",
            )
        ],
    ),
)
