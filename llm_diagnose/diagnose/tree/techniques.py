"""The remedies: what each technique fixes, the settings that turn it on, what should improve.

Settings are per engine, each a `Setting`: the part one types (`command`), kept apart from
why or when (`note`) and the releases it holds for (`versions`), so tests/test_engine_settings.py
can take the flags out and check them against the engine's own parser (vLLM: the installed
`vllm serve` parser) or its recorded flag list (SGLang, TensorRT-LLM: source and version named
in that test). Where a command goes is its `kind`:

- "flags": options of the engine's server (`vllm serve`, `python -m sglang.launch_server`,
  `trtllm-serve`);
- "command": a whole command line whose first words name the program (`vllm run-batch ...`);
- "config": YAML for the engine's config file (TensorRT-LLM: the file `trtllm-serve --config`
  reads), written in flow style so it is one line;
- "python": a Python call;
- "none": nothing to type (built in, or on by default); the note says what to check.

Placeholders are in angle brackets (`<N>`, `<draft>`). A plain string (the old form) still
works: "command  (note)" is split at the two spaces before the parenthesis, as "flags".
`expect` names the evidence key that should move, so a re-run after the change can confirm it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from llm_diagnose.probes import quantities as Q

__all__ = ["Technique", "Setting", "CATALOGUE", "ENGINES", "ENGINE_NAMES"]

ENGINES = ("vllm", "sglang", "trtllm", "transformers")
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM", "transformers": "transformers"}

Kind = Literal["flags", "command", "config", "python", "none"]


@dataclass(frozen=True)
class Setting:
    """One engine setting: what to type, why or when, and for which releases."""

    command: str  # exactly what is typed; "" when nothing is (kind "none")
    note: str = ""
    kind: Kind = "flags"
    versions: str = ""  # e.g. "vLLM 0.14+"; "" when every release the tool knows has it

    def __str__(self) -> str:
        extra = "; ".join(p for p in (self.note, self.versions) if p)
        if not self.command:
            return extra
        return f"{self.command}  ({extra})" if extra else self.command


_PLAIN = re.compile(r"^(?P<command>.*?)\s{2,}\((?P<note>.*)\)$")


def _setting(s: Setting | str) -> Setting:
    if isinstance(s, Setting):
        return s
    m = _PLAIN.match(s)
    return Setting(m["command"], m["note"]) if m else Setting(s)


@dataclass(frozen=True)
class Technique:
    id: str
    name: str
    fixes: str
    options: tuple[tuple[str, tuple[Setting, ...]], ...]  # (engine, settings) in ENGINES order
    expect: str

    @property
    def settings(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """The settings as printed: (engine, lines) in ENGINES order."""
        return tuple((e, tuple(str(s) for s in ss)) for e, ss in self.options)

    def settings_for(self, engine: str) -> tuple[Setting, ...]:
        return dict(self.options).get(engine, ())


def _t(id, name, fixes, expect, **settings) -> Technique:
    options = tuple((e, tuple(_setting(s) for s in settings[e])) for e in ENGINES if e in settings)
    return Technique(id, name, fixes, options, expect)


S = Setting
_TRT_YAML = "in the YAML that trtllm-serve --config reads"

CATALOGUE: dict[str, Technique] = {
    t.id: t
    for t in [
        _t(
            "quantization",
            "Quantization (weights and KV cache)",
            "the model and its KV cache do not fit with room to spare",
            f"{Q.KV_CAPACITY_TOKENS} up, {Q.PREEMPTIONS} and {Q.WAITING_MEAN} down",
            vllm=[
                S(
                    "--quantization fp8",
                    "FP8 weights and activations, quantized at load on Ada, Hopper, Blackwell; "
                    "a pre-quantized AWQ/GPTQ/compressed-tensors checkpoint needs no flag",
                ),
                S("--kv-cache-dtype fp8", "halves KV bytes per token"),
            ],
            sglang=[
                S("--quantization fp8", "FP8 weights quantized at load; a pre-quantized checkpoint needs no flag"),
                S(
                    "--kv-cache-dtype fp8_e4m3",
                    "halves KV bytes per token; FlashAttention-3, the Hopper default, takes only fp8_e4m3",
                ),
            ],
            trtllm=[
                S(
                    "",
                    "serve a checkpoint quantized with NVIDIA ModelOpt, FP8 or NVFP4 on Blackwell: "
                    "trtllm-serve reads the scheme from the checkpoint",
                    kind="none",
                ),
                S(
                    "kv_cache_config: {dtype: fp8}",
                    f"FP8 KV cache, {_TRT_YAML}",
                    kind="config",
                    versions="TensorRT-LLM 1.0+, PyTorch backend",
                ),
            ],
        ),
        _t(
            "parallelism",
            "Tensor / pipeline parallelism",
            "the weights do not fit one device at all",
            f"{Q.WEIGHTS_FRACTION} below 1 per device",
            vllm=[S("--tensor-parallel-size <N>", "within a node"), S("--pipeline-parallel-size <M>", "across nodes")],
            sglang=[S("--tp-size <N>", "within a node"), S("--pp-size <M>", "across nodes")],
            trtllm=[
                S(
                    "--tp_size <N> --pp_size <M>",
                    "options of trtllm-serve; a TensorRT engine is built for "
                    "fixed sizes when its checkpoint is converted",
                )
            ],
        ),
        _t(
            "scale-out",
            "More replicas or admission limits",
            "the model fits, but load fills the KV cache, queues requests or preempts them",
            f"{Q.WAITING_MEAN} and {Q.PREEMPTIONS} down per replica, {Q.KV_USAGE_P95} below saturation",
            vllm=[
                S("", "more replicas behind the load balancer: size them with llm-diagnose plan", kind="none"),
                S("--data-parallel-size <N>", "replicas inside one server, one per device group"),
                S(
                    "--max-num-seqs <N>",
                    "an admission limit: fewer sequences per step, the rest wait instead of preempting",
                ),
                S("--kv-cache-dtype fp8", "a capacity lever: about twice the KV tokens in the same memory"),
            ],
            sglang=[
                S("", "more replicas behind the load balancer: size them with llm-diagnose plan", kind="none"),
                S("--dp-size <N>", "replicas inside one server"),
                S("--max-running-requests <N>", "an admission limit"),
                S("--kv-cache-dtype fp8_e4m3", "a capacity lever: about twice the KV tokens in the same memory"),
            ],
            trtllm=[
                S("", "more replicas behind the load balancer: size them with llm-diagnose plan", kind="none"),
                S("--max_batch_size <N>", "an admission limit, an option of trtllm-serve"),
            ],
        ),
        _t(
            "prefix-caching",
            "Automatic prefix caching",
            "requests re-prefill a prompt prefix the server has already computed",
            f"{Q.PREFIX_HIT_RATE} up, {Q.TTFT_P50} down",
            vllm=[
                S(
                    "--enable-prefix-caching",
                    "exact prefixes only: put static content first",
                    versions="on by default since vLLM 0.8, the V1 engine",
                )
            ],
            sglang=[S("", "the radix cache is on by default: drop --disable-radix-cache if it is set", kind="none")],
            trtllm=[
                S(
                    "kv_cache_config: {enable_block_reuse: true}",
                    f"block reuse is on by default: check it was not turned off {_TRT_YAML}",
                    kind="config",
                )
            ],
        ),
        _t(
            "continuous-batching",
            "Continuous (iteration-level) batching",
            "short requests wait for long ones in a static batch",
            f"{Q.SHORT_WAIT_FOR_LONG} down, {Q.GEN_TOKENS_PER_S} up",
            vllm=[
                S(
                    "",
                    "built in, nothing to turn on: if short requests still wait, the batch is capped: "
                    "raise --max-num-seqs and --max-num-batched-tokens",
                    kind="none",
                )
            ],
            sglang=[S("", "built in, nothing to turn on: the batch is capped by --max-running-requests", kind="none")],
            trtllm=[
                S(
                    "",
                    "built in: trtllm-serve batches in flight; the batch is capped by --max_batch_size and "
                    "--max_num_tokens",
                    kind="none",
                )
            ],
            transformers=[S("transformers serve --continuous-batching", kind="command")],
        ),
        _t(
            "paged-attention",
            "Paged KV cache (PagedAttention)",
            "KV memory reserved per request at max length caps the batch",
            f"{Q.KV_WASTE_FRACTION} down, {Q.RUNNING_MEAN} up",
            vllm=[
                S(
                    "",
                    "built in: the KV cache is always paged; --block-size sets tokens per block "
                    "16 by default on GPUs, 128 on the CPU backend",
                    kind="none",
                )
            ],
            sglang=[
                S(
                    "",
                    "built in: --page-size sets tokens per page; 1 by default, but the attention backend can "
                    "raise it (FlashMLA 64, Cutlass MLA 128, TRT-LLM MHA 64, the default on Blackwell)",
                    kind="none",
                )
            ],
            trtllm=[
                S(
                    "",
                    "built in: the PyTorch backend's KV cache is paged; kv_cache_config.tokens_per_block "
                    "sets the page, 32 by default",
                    kind="none",
                ),
                S(
                    "trtllm-build --kv_cache_type paged",
                    "TensorRT engines only; paged is the default, and replaces the deprecated paged_kv_cache option",
                    kind="command",
                ),
            ],
            transformers=[
                S(
                    "transformers serve --continuous-batching",
                    "continuous batching runs on a paged cache",
                    kind="command",
                )
            ],
        ),
        _t(
            "speculative-decoding",
            "Speculative decoding",
            "per-token decode latency is the complaint and drafts would be accepted",
            f"{Q.ITL_P50} down while {Q.SPEC_ACCEPTANCE_RATE} stays >= 0.5",
            vllm=[
                S(
                    '--speculative-config \'{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}\'',
                    "prompt lookup, no draft model: pays off when outputs repeat the prompt",
                    versions="vLLM 0.9+",
                ),
                S(
                    '--speculative-config \'{"method": "eagle3", "model": "<draft>", "num_speculative_tokens": 3}\'',
                    "an EAGLE-3 draft trained for this model; method eagle takes EAGLE-1/2 drafts, draft_model a "
                    "small model of the same family",
                    versions="vLLM 0.9+",
                ),
                S(
                    '--speculative-config \'{"method": "mtp", "num_speculative_tokens": 1}\'',
                    "models that ship multi-token-prediction heads, e.g. DeepSeek-V3, Qwen3-Next",
                    versions="vLLM 0.12+; per-model names such as deepseek_mtp before",
                ),
            ],
            sglang=[
                S(
                    "--speculative-algorithm EAGLE3 --speculative-draft-model-path <draft> --speculative-num-steps 3 "
                    "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4",
                    "EAGLE for EAGLE-1/2 drafts, STANDALONE for a small draft model, NEXTN for MTP heads",
                ),
                S("--speculative-algorithm NGRAM", "no draft model; CUDA only"),
            ],
            trtllm=[
                S(
                    "speculative_config: {decoding_type: Eagle3, max_draft_len: 3, speculative_model_dir: <draft>}",
                    f"{_TRT_YAML}; decoding_type NGram needs no draft, MTP uses the model's own heads; "
                    "speculative_model is the newer name of speculative_model_dir",
                    kind="config",
                    versions="TensorRT-LLM 1.0+, PyTorch backend",
                )
            ],
        ),
        _t(
            "chunked-prefill",
            "Chunked prefill",
            "long prefills stall the decode steps of running streams",
            f"{Q.ITL_INFLATION} and {Q.ITL_P99} down",
            vllm=[
                S("--enable-chunked-prefill", versions="on by default since vLLM 0.8, the V1 engine"),
                S(
                    "--max-num-batched-tokens 2048",
                    "the token budget of a step, so the chunk: smaller bounds the stall, "
                    "larger favours TTFT; vLLM 0.32 defaults to 2048 on most GPUs, 8192 on H100/H200",
                ),
                S("--long-prefill-token-threshold 512", "caps the tokens one long prompt takes from a step"),
            ],
            sglang=[
                S(
                    "--chunked-prefill-size 2048",
                    "the chunk size; its default depends on GPU memory, -1 turns chunking off",
                ),
                S("--enable-mixed-chunk", "runs decodes in the same batch as a prefill chunk"),
            ],
            trtllm=[
                S("--enable_chunked_prefill", "off by default in trtllm-serve; the chunk follows --max_num_tokens"),
                S("enable_chunked_prefill: true", f"the same, {_TRT_YAML}", kind="config"),
            ],
        ),
        _t(
            "pd-disaggregation",
            "Prefill/decode disaggregation",
            "prefill still stalls decode with chunked prefill on, at a scale that can spare instances",
            f"{Q.ITL_P99} down at equal {Q.TTFT_P50}",
            vllm=[
                S(
                    '--kv-transfer-config \'{"kv_connector": "NixlConnector", "kv_role": "kv_both"}\'',
                    "on separate prefill and decode instances behind a P/D-aware router: llm-d, Dynamo, or vLLM's "
                    "disaggregated proxy example",
                    versions="vLLM 0.10+",
                )
            ],
            sglang=[
                S(
                    "--disaggregation-mode prefill --disaggregation-transfer-backend mooncake",
                    "the prefill instance; the decode instance takes --disaggregation-mode decode; nixl is the other "
                    "transfer backend; the SGLang router routes between them",
                )
            ],
            trtllm=[
                S(
                    "trtllm-serve disaggregated -c disagg_config.yaml",
                    "context and generation servers listed in the YAML, each with a cache_transceiver_config",
                    kind="command",
                )
            ],
        ),
        _t(
            "kv-offload",
            "KV-cache offload (CPU / disk tier)",
            "useful prefix cache is evicted before it is reused",
            f"{Q.PREFIX_HIT_RATE} up towards {Q.PREFIX_POTENTIAL}",
            vllm=[
                S(
                    "--kv-offloading-size <GiB> --kv-offloading-backend native",
                    "a CPU tier for evicted prefix blocks",
                    versions="vLLM 0.14+",
                ),
                S(
                    '--kv-transfer-config \'{"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}\'',
                    "LMCache, installed separately",
                    versions="vLLM 0.10+",
                ),
            ],
            sglang=[
                S(
                    "--enable-hierarchical-cache --hicache-ratio 2",
                    "a host KV pool twice the device pool; --hicache-size sets it in GB instead",
                )
            ],
            trtllm=[
                S(
                    "kv_cache_config: {host_cache_size: <bytes>}",
                    f"a host tier for reusable blocks, {_TRT_YAML}",
                    kind="config",
                )
            ],
        ),
        _t(
            "offline-batch",
            "Offline batch inference",
            "nobody waits for the responses, so latency is wasted on a throughput job",
            f"{Q.GEN_TOKENS_PER_S} up",
            vllm=[
                S("vllm run-batch -i requests.jsonl -o results.jsonl --model <model>", kind="command"),
                S("vllm.LLM(model=<model>).generate(prompts)", "the same in Python", kind="python"),
                S("", "on a server, raise --max-num-seqs and --max-num-batched-tokens: nobody waits", kind="none"),
            ],
            sglang=[S("sglang.Engine(model_path=<model>).generate(prompts)", kind="python")],
            trtllm=[S("tensorrt_llm.LLM(model=<model>).generate(prompts)", kind="python")],
        ),
    ]
}
