"""The remedies: what each technique fixes, the settings that turn it on, what should improve.

Settings are per engine. vLLM flags are those of `vllm serve` (checked against vLLM 0.32's
`--help`); SGLang and TensorRT-LLM are given where they differ. `expect` names the evidence
key that should move, so a re-run after the change can confirm it.
"""

from __future__ import annotations

from dataclasses import dataclass

from probes import quantities as Q

__all__ = ["Technique", "CATALOGUE", "ENGINES"]

ENGINES = ("vllm", "sglang", "trtllm", "transformers")


@dataclass(frozen=True)
class Technique:
    id: str
    name: str
    fixes: str
    settings: tuple[tuple[str, tuple[str, ...]], ...]
    expect: str


def _t(id, name, fixes, expect, **settings) -> Technique:
    return Technique(id, name, fixes, tuple((e, tuple(settings[e])) for e in ENGINES if e in settings), expect)


CATALOGUE: dict[str, Technique] = {t.id: t for t in [
    _t("quantization", "Quantization (weights and KV cache)",
       "the model and its KV cache do not fit with room to spare",
       f"{Q.KV_CAPACITY_TOKENS} up, {Q.PREEMPTIONS} and {Q.WAITING_MEAN} down",
       vllm=["--quantization fp8  (FP8 weights+activations on Ada/Hopper; or serve an AWQ/GPTQ checkpoint)",
             "--kv-cache-dtype fp8  (halves KV bytes per token)"],
       sglang=["--quantization fp8", "--kv-cache-dtype fp8_e5m2"],
       trtllm=["quantize with --qformat fp8 --kv_cache_dtype fp8 (ModelOpt), then rebuild the engine"]),
    _t("parallelism", "Tensor / pipeline parallelism",
       "the weights do not fit one device at all",
       f"{Q.WEIGHTS_FRACTION} below 1 per device",
       vllm=["--tensor-parallel-size N  (within a node)", "--pipeline-parallel-size M  (across nodes)"],
       sglang=["--tp-size N", "--pp-size M"],
       trtllm=["build with --tp_size N --pp_size M"]),
    _t("prefix-caching", "Automatic prefix caching",
       "requests re-prefill a prompt prefix the server has already computed",
       f"{Q.PREFIX_HIT_RATE} up, {Q.TTFT_P50} down",
       vllm=["--enable-prefix-caching  (default on in V1; exact prefixes only: put static content first)"],
       sglang=["drop --disable-radix-cache  (the radix cache is on by default)"],
       trtllm=["kv_cache_config: enable_block_reuse: true"]),
    _t("continuous-batching", "Continuous (iteration-level) batching",
       "short requests wait for long ones in a static batch",
       f"{Q.SHORT_WAIT_FOR_LONG} down, {Q.GEN_TOKENS_PER_S} up",
       vllm=["built in: serve with vLLM (every vLLM release batches continuously)"],
       sglang=["built in"],
       trtllm=["--batching_strategy inflight_fused_batching  (Triton: gpt_model_type=inflight_fused_batching)"],
       transformers=["transformers serve --continuous-batching"]),
    _t("paged-attention", "Paged KV cache (PagedAttention)",
       "KV memory reserved per request at max length caps the batch",
       f"{Q.KV_WASTE_FRACTION} down, {Q.RUNNING_MEAN} up",
       vllm=["built in (block size: --block-size 16)"],
       sglang=["built in (--page-size 1 by default)"],
       trtllm=["build with --paged_kv_cache enable"],
       transformers=["transformers serve --continuous-batching  (paged attention)"]),
    _t("speculative-decoding", "Speculative decoding",
       "per-token decode latency is the complaint and drafts would be accepted",
       f"{Q.ITL_P50} down while {Q.SPEC_ACCEPTANCE_RATE} stays >= 0.5",
       vllm=["--speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4}'",
             "or a draft/EAGLE model: '{\"method\": \"eagle\", \"model\": \"<draft>\", \"num_speculative_tokens\": 3}'"],
       sglang=["--speculative-algorithm EAGLE --speculative-draft-model-path <draft> --speculative-num-steps 3 "
               "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4"],
       trtllm=["speculative_config (LLM API) / --speculative_decoding_mode draft_tokens_external|eagle"]),
    _t("chunked-prefill", "Chunked prefill",
       "long prefills stall the decode steps of running streams",
       f"{Q.ITL_INFLATION} and {Q.ITL_P99} down",
       vllm=["--enable-chunked-prefill  (default on in V1)",
             "--max-num-batched-tokens 2048  (smaller chunks bound the stall; larger favour TTFT)"],
       sglang=["--chunked-prefill-size 2048"],
       trtllm=["--enable_chunked_context  (enable_chunked_prefill=True in the LLM API)"]),
    _t("pd-disaggregation", "Prefill/decode disaggregation",
       "prefill still stalls decode with chunked prefill on, at a scale that can spare instances",
       f"{Q.ITL_P99} down at equal {Q.TTFT_P50}",
       vllm=["separate prefill and decode instances with "
             "--kv-transfer-config '{\"kv_connector\": \"NixlConnector\", \"kv_role\": \"kv_both\"}' behind a P/D router"],
       sglang=["--disaggregation-mode prefill|decode --disaggregation-transfer-backend nixl|mooncake"],
       trtllm=["trtllm-serve disaggregated -c disagg_config.yaml"]),
    _t("kv-offload", "KV-cache offload (CPU / disk tier)",
       "useful prefix cache is evicted before it is reused",
       f"{Q.PREFIX_HIT_RATE} up towards {Q.PREFIX_POTENTIAL}",
       vllm=["--kv-offloading-size <GiB> --kv-offloading-backend native  (0.13+)",
             "or --kv-transfer-config '{\"kv_connector\": \"LMCacheConnectorV1\", \"kv_role\": \"kv_both\"}'"],
       sglang=["--enable-hierarchical-cache --hicache-ratio 2"],
       trtllm=["kv_cache_config: host_cache_size: <bytes>"]),
    _t("offline-batch", "Offline batch inference",
       "nobody waits for the responses, so latency is wasted on a throughput job",
       f"{Q.GEN_TOKENS_PER_S} up",
       vllm=["vllm run-batch -i requests.jsonl -o results.jsonl --model <model>  (or vllm.LLM(...).generate)",
             "raise --max-num-seqs and --max-num-batched-tokens"],
       sglang=["sglang.Engine(...).generate(prompts) offline"],
       trtllm=["tensorrt_llm.LLM(...).generate(prompts) offline"]),
]}
