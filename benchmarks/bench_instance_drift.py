"""Benchmark: how far apart two fresh server instances of one configuration measure, and what
`verify` concludes from one pair of runs against a pair bracketed by a control (A/B/A).

    .venv/bin/python benchmarks/bench_instance_drift.py [--rounds 3] [--json OUT.json]

Runs the demo's own workload (32 requests with a shared system prompt, a 10 s window, the warm-up
the demo does) on fresh tiny-model vLLM CPU servers, one at a time, in rounds of three:
prefix caching off (A), on (B), off again (A'), each server started fresh. Alternating puts drift
(thermal, page cache, other tenants) on both sides alike. Per round it records, from the run
folders:

- each run's median time per output token (requests.tpot_p50_s), median client TTFT, and vLLM's
  own ITL mean (decode.itl_p50_s's histogram summary);
- the A/A pair (A against A'): the gate's bootstrap interval of the TPOT change, and whether it
  lies beyond the gate's 10% tolerance (what one pair of runs cannot see);
- `verify A B` and `verify A B --control A'`: the overall verdict, each claim's verdict, the
  side effects (harmful or not attributed).

Nothing here is a pass/fail: the figures go to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llm_diagnose.diagnose.commands.demo import _observe  # noqa: E402
from llm_diagnose.diagnose.compare.metric import compare_metric  # noqa: E402
from llm_diagnose.diagnose.compare.request_measurements import REQUEST_TPOT_P50  # noqa: E402
from llm_diagnose.diagnose.compare.rules import MetricRule  # noqa: E402
from llm_diagnose.diagnose.compare.settings import CompareSettings  # noqa: E402
from llm_diagnose.diagnose.demo.tiny_model import make_tiny_model  # noqa: E402
from llm_diagnose.diagnose.demo.workload import DemoWorkload  # noqa: E402
from llm_diagnose.diagnose.runfolder import RunFolder, prepare_out_dir  # noqa: E402
from llm_diagnose.diagnose.verify.bracket import verify_bracketed  # noqa: E402
from llm_diagnose.diagnose.verify.judge import RunSide, verify  # noqa: E402
from llm_diagnose.probes import quantities as Q  # noqa: E402

REQUESTS, DURATION_S = 32, 10.0  # the demo test's figures


def observe(model_dir: Path, work: Path, out: Path, *, prefix_caching: bool) -> RunSide:
    args = argparse.Namespace(requests=REQUESTS, duration=DURATION_S)
    workload = DemoWorkload(requests=REQUESTS, spread_s=max(1.0, DURATION_S - 5.0))
    result = _observe(model_dir, work, prepare_out_dir(out), workload, args, None, prefix_caching=prefix_caching)
    return RunSide.of(RunFolder.load(out), result.diagnosis)


def figures(run: RunSide) -> dict:
    ev = run.evidence
    tpot, ttft = ev.measurement(REQUEST_TPOT_P50), ev.measurement("requests.ttft_p50_s")
    itl = ev.measurement(Q.ITL_P50)
    return {
        "tpot_p50_ms": tpot.value * 1e3 if tpot else None,
        "ttft_p50_ms": ttft.value * 1e3 if ttft else None,
        "engine_itl_mean_ms": itl.summary.mean * 1e3 if itl is not None and itl.summary is not None else None,
    }


def summary(result) -> dict:
    return {
        "verdict": result.verdict,
        "claims": {c.claim.key: c.verdict for c in result.claims},
        "harmful": [s.name for s in result.side_effects if s.harmful],
        "not_attributed": [s.name for s in result.side_effects if not s.attributed],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="instance-drift-"))
    model_dir = make_tiny_model(root / "model")
    rounds = []
    for i in range(args.rounds):
        t0 = time.perf_counter()
        a = observe(model_dir, root, root / f"r{i}-A", prefix_caching=False)
        b = observe(model_dir, root, root / f"r{i}-B", prefix_caching=True)
        a2 = observe(model_dir, root, root / f"r{i}-A2", prefix_caching=False)
        aa = compare_metric(MetricRule(REQUEST_TPOT_P50, "lower"), a.evidence, a2.evidence, CompareSettings())
        row = {
            "A": figures(a),
            "B": figures(b),
            "A2": figures(a2),
            "aa_tpot_change": aa.change,
            "aa_tpot_verdict": aa.verdict,
            "verify_pair": summary(verify(a, b)),
            "verify_bracketed": summary(verify_bracketed(a, b, a2)),
            "wall_s": round(time.perf_counter() - t0, 1),
        }
        rounds.append(row)
        print(json.dumps(row), flush=True)
    aa_changes = [r["aa_tpot_change"] for r in rounds]
    print(f"A/A TPOT changes: {aa_changes}")
    ratios = [r["A2"]["tpot_p50_ms"] / r["A"]["tpot_p50_ms"] for r in rounds]
    print(f"A'/A TPOT ratio: median {statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}")
    if args.json:
        args.json.write_text(json.dumps({"rounds": rounds, "root": str(root)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
