"""Automatic prefix caching: serve a shared prompt prefix from the KV cache (decided by Q2)."""

from __future__ import annotations

from llm_diagnose.diagnose.tree.techniques.claim import FRACTION_MIN_EFFECT, down, up
from llm_diagnose.diagnose.tree.techniques.record import Technique
from llm_diagnose.diagnose.tree.techniques.setting import TRT_YAML, Setting, per_engine
from llm_diagnose.probes import quantities as Q

TECHNIQUE = Technique(
    id="prefix-caching",
    name="Automatic prefix caching",
    fixes="requests re-prefill a prompt prefix the server has already computed",
    rank=50,
    claims=(up(Q.PREFIX_HIT_RATE, FRACTION_MIN_EFFECT, relative=False), down(Q.TTFT_P50)),
    on_node="Q2.prefix-caching-on",
    switch=Q.PREFIX_CACHING,
    # Prefix caching that served no more tokens from its cache cannot have cut TTFT (seen on vLLM
    # CPU: hit rate 0% -> 0%, TTFT -82%, the run before being the first traffic of a server started
    # seconds earlier; with both servers warmed up first, the same pair measured +12% [-75%, +52%]).
    mechanism=Q.PREFIX_HIT_RATE,
    # Its work is at admission (a lookup) and when a block fills (one hash per block of tokens,
    # microseconds against a step of milliseconds). A batch that grew because prefills ended
    # sooner decodes more slowly per token, but that is more throughput, shown on its own rows.
    worsens=frozenset({"queue", "prefill", "memory", "cache"}),
    worsens_why="a decode step of the same batch reads the same KV whether its prefix was computed or served "
    "from the cache",
    options=per_engine(
        vllm=[
            Setting(
                "--enable-prefix-caching",
                "exact prefixes only: put static content first",
                versions="on by default since vLLM 0.8, the V1 engine",
            )
        ],
        sglang=[Setting("", "the radix cache is on by default: drop --disable-radix-cache if it is set", kind="none")],
        trtllm=[
            Setting(
                "kv_cache_config: {enable_block_reuse: true}",
                f"block reuse is on by default: check it was not turned off {TRT_YAML}",
                kind="config",
            )
        ],
    ),
)
