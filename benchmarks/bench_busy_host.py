"""Benchmark: live verdicts on a busy host and a quiet one (issue 14), on a real vLLM CPU server.

    .venv/bin/python benchmarks/bench_busy_host.py [--runs 10] [--burners 3] [--json OUT.json]

Starts the tiny model on a DEFAULT vLLM server (continuous batching and chunked prefill on, as
vLLM V1 ships), then alternates busy and quiet runs of

    llm-diagnose run --url URL --active --experiments heterogeneity,decode ...

(in-process, as tests/test_busy_host_live.py does): a busy run has `--burners` CPU-bound
processes beside it on the host (started before, killed after), a quiet one nothing. Alternating
puts drift (thermal, page cache, the server's own warm-up) on both sides alike.

Per run it records: false verdicts (what would be false about this server: Q3 "short requests
wait for long ones", continuous batching or chunked prefill "recommended"/"not-working"), whether
Q3 was inconclusive, the client's loop lag and host busy fraction, whether an experiment was
repeated because the client was starved, and the client/server latency ratios
(client.server_{ttft,itl,e2e}_ratio: 1 means the client's timings agree with vLLM's histograms).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llm_diagnose.diagnose.cli import main as cli_main  # noqa: E402
from llm_diagnose.diagnose.demo.tiny_model import RECIPE_VERSION, make_tiny_model  # noqa: E402
from llm_diagnose.diagnose.demo.vllm_server import VllmServer  # noqa: E402
from llm_diagnose.probes import quantities as Q  # noqa: E402
from tests.test_busy_host_live import false_verdicts  # noqa: E402  (the test's rule, one copy)

RATIO_KEYS = {"ttft": Q.CLIENT_SERVER_TTFT_RATIO, "itl": Q.CLIENT_SERVER_ITL_RATIO, "e2e": Q.CLIENT_SERVER_E2E_RATIO}


def burners(n: int, seconds: float) -> list[subprocess.Popen]:
    code = f"import time\nend = time.time() + {seconds}\nwhile time.time() < end:\n    pass\n"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]


def one_run(url: str, out: Path, budget_s: float) -> dict:
    argv = ["run", "--url", url, "--out", str(out), "--duration", "4", "--interval", "0.5", "--active",
            "--experiments", "heterogeneity,decode", "--budget-requests", "150", "--budget-seconds",
            str(budget_s), "--quiet"]  # fmt: skip
    t0 = time.perf_counter()
    code = cli_main(argv)
    wall = time.perf_counter() - t0
    d = json.loads((out / "diagnosis.json").read_text())
    items = json.loads((out / "evidence.json").read_text())["items"]
    events = (out / "events.jsonl").read_text()
    q3 = next(a for a in d["answers"] if a["question"] == "Q3")

    def value(key: str) -> float | None:
        v = items.get(key, {})
        return v.get("value") if v.get("kind", "measurement") == "measurement" else None

    return {
        "exit": code,
        "wall_s": round(wall, 1),
        "false": false_verdicts(d),
        "q3": q3["verdict"] or q3["answer"],
        "inconclusive": q3["verdict"] == "inconclusive",
        "repeated": events.count('"experiment-repeated"'),
        "loop_lag_p99_ms": None
        if value(Q.CLIENT_LOOP_LAG_P99) is None
        else round(value(Q.CLIENT_LOOP_LAG_P99) * 1e3, 2),
        "host_busy": value(Q.CLIENT_HOST_BUSY),
        "ratios": {k: value(key) for k, key in RATIO_KEYS.items()},
    }


def summarise(runs: list[dict]) -> dict:
    def med(xs: list[float]) -> float | None:
        xs = [x for x in xs if x is not None]
        return round(statistics.median(xs), 3) if xs else None

    return {
        "runs": len(runs),
        "false_verdicts": sum(1 for r in runs if r["false"]),
        "inconclusive_q3": sum(r["inconclusive"] for r in runs),
        "repeated_experiments": sum(r["repeated"] for r in runs),
        "median_loop_lag_p99_ms": med([r["loop_lag_p99_ms"] for r in runs]),
        "median_host_busy": med([r["host_busy"] for r in runs]),
        "median_client_server_ratio": {k: med([r["ratios"][k] for r in runs]) for k in RATIO_KEYS},
        "max_client_server_ratio": {
            k: max((r["ratios"][k] for r in runs if r["ratios"][k] is not None), default=None) for k in RATIO_KEYS
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10, help="busy runs and quiet runs, each (default 10)")
    ap.add_argument("--burners", type=int, default=3)
    ap.add_argument("--budget-seconds", type=float, default=30.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="llmd-busy-") as tmp:
        root = Path(tmp)
        model = make_tiny_model(root / f"tiny-llama-r{RECIPE_VERSION}")
        with VllmServer(model, root / "server") as server:
            results: dict[str, list[dict]] = {"busy": [], "quiet": []}
            for i in range(args.runs):
                for kind in ("busy", "quiet"):
                    procs = burners(args.burners, args.budget_seconds * 3) if kind == "busy" else []
                    try:
                        time.sleep(0.5 if procs else 0.0)
                        r = one_run(server.url, root / f"{kind}-{i}", args.budget_seconds)
                    finally:
                        for p in procs:
                            p.kill()
                            p.wait(10)
                    results[kind].append(r)
                    print(f"{kind} {i}: {json.dumps(r)}", flush=True)
    summary = {kind: summarise(runs) for kind, runs in results.items()}
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "runs": results}, indent=2))


if __name__ == "__main__":
    main()
