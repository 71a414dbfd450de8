"""Sample runs for the report tests: evidence with every figure's data, and a hostile one.

Not tests themselves: builders the report and gate tests import. Values are seeded, so a
report made from them is the same on every machine.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from llm_diagnose.diagnose.tree.evidence import Evidence, Target
from llm_diagnose.probes.load.records import EVENTS_FILE, REQUESTS_FILE, JsonlWriter, RequestRecord
from llm_diagnose.probes.results import Fact, Measurement, NotMeasured, Provenance

PROV = Provenance(method="hand-built", source="test", taken_at="2026-12-02T00:00:00.000+00:00", window_s=60.0)
GIB = float(1 << 30)
XSS = "<script>alert(1)</script>"
FAKE_PROMPT = f"SYSTEM: you are a helpful bot {XSS} | answer `briefly` & kindly"


def _m(value: float, unit: str, samples=(), note: str = "") -> Measurement:
    return Measurement(float(value), unit, PROV, samples=tuple(samples), note=note)


def _sampled(values, unit: str) -> Measurement:
    s = sorted(values)
    return _m(s[len(s) // 2], unit, values)


def rich_evidence(seed: int = 7) -> Evidence:
    """A vLLM run with data for all five figures, and a diagnosis that recommends something."""
    rng = random.Random(seed)
    lengths = [max(1, int(rng.lognormvariate(4.5, 0.9))) for _ in range(300)]
    items = {
        "engine.name": Fact("vllm", PROV),
        "engine.version": Fact("0.32.0", PROV),
        "engine.model": Fact("tiny-llama", PROV),
        "config.prefix_caching": Fact(False, PROV),
        "config.chunked_prefill": Fact(False, PROV),
        "config.paged_kv": Fact(True, PROV),
        "config.continuous_batching": Fact(True, PROV),
        "memory.device_total_bytes": Measurement(80 * GIB, "bytes", Provenance("nvml", "GPU0 NVIDIA H100 80GB HBM3")),
        "memory.device_used_bytes": _m(72 * GIB, "bytes"),
        "memory.weights_bytes": _m(16 * GIB, "bytes"),
        "memory.kv_cache_bytes": _m(52 * GIB, "bytes"),
        "memory.weights_fraction": _m(0.2, "fraction"),
        "memory.device_free_fraction": _m(0.1, "fraction"),
        "kv.capacity_tokens": _m(400_000, "tokens"),
        "kv.usage_p95": _sampled([rng.uniform(0.5, 0.8) for _ in range(60)], "fraction"),
        "queue.waiting_mean": _m(0.2, "count"),
        "prefix.potential_fraction": _m(0.62, "fraction"),
        "prefix.lru_fraction_at_capacity": _m(0.48, "fraction"),
        "prefix.hit_rate": _m(0.0, "fraction"),
        "outputs.length_p50": _sampled(lengths, "tokens"),
        "outputs.length_cv": _m(0.95, "ratio"),
        "load.concurrency_mean": _m(6.0, "count"),
        "decode.itl_p50_s": _sampled([rng.gauss(0.03, 0.004) for _ in range(200)], "s"),
        "latency.ttft_p50_s": _sampled([rng.gauss(0.2, 0.02) for _ in range(200)], "s"),
        "throughput.generation_tokens_per_s": _sampled([rng.gauss(900, 40) for _ in range(60)], "1/s"),
        # a live ratio carries its interval (the tree judges live keys by it)
        "interference.itl_inflation": _m(2.4, "ratio", [2.1, 2.2, 2.3, 2.4, 2.4, 2.5, 2.6, 2.7, 2.8]),
        "live.window_s": _m(60.0, "s"),
    }
    for cap, frac in ((50_000, 0.12), (100_000, 0.25), (200_000, 0.38), (800_000, 0.58), (1_600_000, 0.61)):
        items[f"prefix.lru_fraction_c{cap}"] = _m(frac, "fraction")
    for b in (1, 2, 4, 8, 16, 32, 64):
        floor = 0.008 + 0.00002 * b
        items[f"decode.roofline_floor_b{b}_s"] = _m(floor, "s")
        items[f"decode.step_latency_b{b}_s"] = _sampled(
            [floor * (1.3 + 0.004 * b) * rng.uniform(0.92, 1.1) for _ in range(30)], "s"
        )
    return Evidence(
        Target(url="http://127.0.0.1:8000", label="rich"),
        items,
        created_at="2026-12-02T00:01:00.000+00:00",
        tool="0.1.0",
        host="ci-runner",
    )


def hostile_evidence() -> Evidence:
    """Strings with markup, pipes and a prompt, everywhere a report may show a string."""
    base = rich_evidence()
    items = dict(base.items)
    items["engine.model"] = Fact(f"evil|model{XSS}", PROV, note=f"note {XSS}")
    items["prompts.example_text"] = Fact(FAKE_PROMPT, PROV)
    items["prompts.dynamic_prefix_fraction"] = _m(0.4, "fraction", note=f"varying lead: {FAKE_PROMPT}")
    items["kv.preemptions"] = NotMeasured(f"reason {XSS} | pipe", hint=f"hint `tick` {XSS}")
    return Evidence(
        Target(url=f"http://127.0.0.1:8000/{XSS}", label=XSS),
        items,
        created_at=base.created_at,
        tool=base.tool,
        host=f"host{XSS}",
    )


def write_requests(run_dir: Path, seed: int = 3, n: int = 40) -> None:
    """requests.jsonl and events.jsonl through the driver's own writer (seeded, with prefill stalls)."""
    rng = random.Random(seed)
    prefills = [2.0 + 3.0 * k for k in range(4)]
    t0 = 1000.0
    with JsonlWriter(run_dir / REQUESTS_FILE) as out:
        for i in range(n):
            t_send = t0 + 0.3 * i
            times = [rng.uniform(0.05, 0.15)]
            for _ in range(rng.randint(10, 60)):
                stalled = any(p <= t_send - t0 + times[-1] < p + 0.4 for p in prefills)
                times.append(times[-1] + abs(rng.gauss(0.03, 0.003)) * (3.0 if stalled else 1.0))
            out.write(
                RequestRecord(
                    request_id=f"r{i}",
                    experiment="interference",
                    phase="steady",
                    tag="stream",
                    endpoint="completions",
                    t_send=t_send,
                    t_send_wall=1.7e9 + i,
                    event_times=tuple(times),
                    t_end=times[-1],
                    http_status=200,
                    prompt_tokens=128,
                    completion_tokens=len(times),
                    finish_reason="length",
                ).to_dict()
            )
    with open(run_dir / REQUESTS_FILE, "a", encoding="utf-8") as fh:
        fh.write('{"request_id": "cut-short", "t_se')  # a run killed mid-write
    lines = [{"event": "prefill_injected", "t": t0 + p, "prompt_tokens": 1500} for p in prefills]
    (run_dir / EVENTS_FILE).write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"event": "pre', "utf-8")


def write_run(run_dir: Path, evidence: Evidence, *, with_requests: bool = True) -> Path:
    """A run folder as `llm-diagnose run` leaves it: evidence.json, diagnosis.json (+ requests)."""
    from llm_diagnose.diagnose.tree import diagnose

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "evidence.json").write_text(evidence.to_json(), "utf-8")
    (run_dir / "diagnosis.json").write_text(diagnose(evidence).to_json(), "utf-8")
    if with_requests:
        write_requests(run_dir)
    return run_dir
