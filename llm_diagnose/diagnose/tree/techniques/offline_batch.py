"""Offline batch inference: nobody waits, so run for throughput (decided by the OB question)."""

from __future__ import annotations

from llm_diagnose.diagnose.tree.techniques.claim import up
from llm_diagnose.diagnose.tree.techniques.record import Technique
from llm_diagnose.diagnose.tree.techniques.setting import Setting, per_engine
from llm_diagnose.probes import quantities as Q

TECHNIQUE = Technique(
    id="offline-batch",
    name="Offline batch inference",
    fixes="nobody waits for the responses, so latency is wasted on a throughput job",
    rank=90,
    claims=(up(Q.GEN_TOKENS_PER_S),),
    options=per_engine(
        vllm=[
            Setting("vllm run-batch -i requests.jsonl -o results.jsonl --model <model>", kind="command"),
            Setting("vllm.LLM(model=<model>).generate(prompts)", "the same in Python", kind="python"),
            Setting("", "on a server, raise --max-num-seqs and --max-num-batched-tokens: nobody waits", kind="none"),
        ],
        sglang=[Setting("sglang.Engine(model_path=<model>).generate(prompts)", kind="python")],
        trtllm=[Setting("tensorrt_llm.LLM(model=<model>).generate(prompts)", kind="python")],
    ),
)
