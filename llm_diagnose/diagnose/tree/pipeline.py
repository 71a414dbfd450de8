"""Pipeline parallelism where tensor parallelism fits the latency goal.

Pipeline parallelism splits the layers into stages: every token still crosses every stage in
turn, so one stream's gap between tokens is the whole model's step plus a hop per stage, and
stages idle unless enough micro-batches are in flight. It adds throughput, not speed per token
(TensorRT-LLM maintainer, NVIDIA/TensorRT-LLM#1144: "PP cannot bring benefit on latency, it only
increases the throughput"). Tensor parallelism splits every layer, so each device reads 1/N of
the weights per token: a memory-bound decode step gets up to N times shorter. Within one node
TP is the layout for latency (vLLM maintainer, vllm-project/vllm#6826: "if you use a single
node, the recommended way is to use TP only, not PP"); PP is for spanning nodes.

`pipeline_for_latency` says True where PP > 1 over no more devices than one node holds
(parallel.max_tp_devices) while the latency goal breaks: Q5 finds the median gap between tokens
too slow, or a declared TTFT or end-to-end objective breaks (PP stretches both: every prefill
crosses the stages in turn too). False where PP spans more than a node, or the goal holds; None
where PP is not on, the goal could not be judged, or only the tail of the gaps is slow (stalls,
which no layout fixes).
"""

from __future__ import annotations

from llm_diagnose.diagnose.tree.controlled import preferred
from llm_diagnose.diagnose.tree.declared import objective_labels
from llm_diagnose.diagnose.tree.diagnosis import Answer
from llm_diagnose.diagnose.tree.reading import Reading
from llm_diagnose.diagnose.tree.slo import SLO
from llm_diagnose.probes import quantities as Q

__all__ = ["pipeline_for_latency"]


def _tail_only(r: Reading) -> bool:
    """The median gap is within q5.max_itl_p50_s and the p99 is stalls above it."""
    p50, p99 = r.num(preferred(r.evidence, Q.ITL_P50)), r.num(preferred(r.evidence, Q.ITL_P99))
    th = r.thresholds
    return (
        p50 is not None and p99 is not None and p50 <= th["q5.max_itl_p50_s"] and p99 >= th["q5.stall_tail_ratio"] * p50
    )


def pipeline_for_latency(r: Reading, q5: Answer, slo: SLO) -> tuple[bool | None, str, str]:
    """(verdict, why, question): True where PP was chosen and TP over the same devices would serve
    the latency goal; `question` is the answer the goal was read from (Q5, or Q1 for a TTFT or
    end-to-end objective)."""
    pp = r.num(Q.PIPELINE_PARALLEL)
    if pp is None or pp <= 1:
        return None, "", "Q1"
    tp = max(1.0, r.num(Q.TENSOR_PARALLEL) or 1.0)
    n = tp * pp
    layout = f"PP {pp:.0f} x TP {tp:.0f} on {n:.0f} devices"
    if not r.compare("config.tensor_parallel_size*pipeline_parallel_size", n, "<=", "parallel.max_tp_devices"):
        limit = r.thresholds["parallel.max_tp_devices"]
        return (
            False,
            f"{layout}: more than one node's {limit:.0f}, where pipeline stages across nodes are the layout",
            "Q1",
        )
    broken = [c for c in slo.check_evidence(r.evidence, ("ttft", "e2e")) if c.met is False]
    if q5.answer == "yes" and not _tail_only(r):
        goal, question = q5.rationale, "Q5"
    elif broken:
        goal, question = f"the SLO breaks ({objective_labels(broken)})", "Q1"
    elif q5.answer == "yes":
        return None, f"{layout}; only the tail of the gaps is slow (stalls, not the step): the layout is not it", "Q5"
    elif q5.answer == "no":
        return False, f"{layout}, and tokens come fast enough ({q5.rationale})", "Q5"
    else:
        return None, f"{layout}; whether it meets the latency goal is open ({q5.rationale})", "Q5"
    p50 = r.num(preferred(r.evidence, Q.ITL_P50))
    gap = f" (median gap {p50 * 1e3:.1f} ms, at best about {p50 / pp * 1e3:.1f} ms split {n:.0f} ways)" if p50 else ""
    return (
        True,
        f"{goal}; pipeline parallelism ({layout}) sends every token through its {pp:.0f} stages one "
        f"after another, so each stream's gap is the whole model's step plus the hops: tensor parallelism over "
        f"the same {n:.0f} devices splits every layer instead, each device reading 1/{n:.0f} of the weights per "
        f"token{gap}; serve with TP {n:.0f} and PP 1 (vLLM --tensor-parallel-size {n:.0f} "
        "--pipeline-parallel-size 1, where the attention heads divide by it) and keep pipeline stages for "
        "spanning nodes",
        question,
    )
