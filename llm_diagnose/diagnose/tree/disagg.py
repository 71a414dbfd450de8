"""Whether a deployment is large enough, and prefill-heavy enough, for separate prefill and decode pools.

Below q6.disagg_min_devices devices, or below a q6.disagg_min_prompt_ratio prompt:output load,
separate pools cost more in KV transfer and routing than the prefill interference they remove:
a prefill pool and a decode pool of one instance each sit idle in turn unless the prefill:decode
work matches the prefill:decode device ratio (vLLM's disaggregation author, vllm-project/vllm#11345:
roughly 1:1 in runtime for 1P1D). Q6 reads this before recommending disaggregation; the
disaggregation-overhead pitfall reads it where disaggregation is on and the transfer time was
not measured, so the shape alone still gives its verdict.
"""

from __future__ import annotations

from llm_diagnose.diagnose.tree.reading import Reading
from llm_diagnose.diagnose.tree.signals import devices
from llm_diagnose.probes import quantities as Q

__all__ = ["disagg_scale"]


def disagg_scale(r: Reading) -> tuple[bool | None, str]:
    """(True, why) when the deployment is large and prefill-heavy enough for separate pools,
    (False, why) when its device count or its prompt:output load is below the line, (None, why)
    when neither was measured far enough to say."""
    n_dev, _ = devices(r)
    count = r.num(Q.DEVICE_COUNT)
    n = max(v for v in (n_dev, count, 0.0) if v is not None)
    prompt_rate, gen_rate = r.num(Q.PROMPT_TOKENS_PER_S), r.num(Q.GEN_TOKENS_PER_S)
    ratio: float | None
    if prompt_rate is not None and gen_rate:
        ratio, what = prompt_rate / gen_rate, "prompt:output tokens per second"
    else:
        isl, osl = r.num(Q.INPUT_LEN_P50), r.num(Q.OUTPUT_LEN_P50)
        ratio, what = (isl / osl, "median prompt:output length") if isl is not None and osl else (None, "")
    min_dev, min_ratio = r.thresholds["q6.disagg_min_devices"], r.thresholds["q6.disagg_min_prompt_ratio"]
    seen = []
    if n:
        seen.append(f"{n:.0f} devices")
    if ratio is not None:
        seen.append(f"{what} {ratio:.1f}:1")
    below = (
        f"below {min_dev:.0f} devices and a {min_ratio:.0f}:1 prompt:output load, separate prefill and decode "
        f"pools cost more in KV transfer and routing than they save"
    )
    short = []
    if n and r.compare("deployment.devices", n, "<", "q6.disagg_min_devices"):
        short.append(f"{n:.0f} devices, fewer than the {min_dev:.0f} (q6.disagg_min_devices)")
    if ratio is not None and r.compare("workload.prompt_output_ratio", ratio, "<", "q6.disagg_min_prompt_ratio"):
        short.append(f"{what} {ratio:.1f}:1, under {min_ratio:.0f}:1 (q6.disagg_min_prompt_ratio)")
    if short:
        return False, (
            f"{' and '.join(short)}: below that, separate prefill and decode pools cost more in KV transfer and "
            "routing than they save"
        )
    if not n or ratio is None:
        return None, f"{below}; the deployment's size or prefill load was not measured" + (
            f" (seen: {', '.join(seen)})" if seen else ""
        )
    return True, f"{', '.join(seen)}: large enough, and prefill-heavy enough, for separate pools"
