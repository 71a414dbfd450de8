"""What a command line costs before it does anything: wall clock, CPU and modules imported.

    git archive fad730f llm_diagnose | tar -x -C /tmp/before      # the tree to compare with
    python benchmarks/bench_cli_startup.py before=/tmp/before after=. [--runs 5]

Each variant is a folder holding an `llm_diagnose/` package, run as `python -m llm_diagnose ...`
from that folder (with it first on PYTHONPATH). For every command line, the variants run in turn,
`--runs` times, so machine noise hits them alike; wall clock and CPU (user + sys, from wait4) are
medians. One more run under `python -X importtime` counts the modules imported and says whether
the HTTP client (aiohttp), the Prometheus parser (prometheus_client) or numpy was loaded.
`decide` reads an evidence file built with tests/evidence_builders.py.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("aiohttp", "prometheus_client", "numpy")
EVIDENCE = "EVIDENCE"
COMMAND_LINES = (("--help",), ("decide", "--help"), ("plan", "--help"), ("run", "--help"), ("decide", EVIDENCE))


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree)}


def timed(tree: Path, argv: list[str]) -> tuple[float, float]:
    """(wall s, CPU s) of one run."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "llm_diagnose", *argv],
        cwd=tree,
        env=_env(tree),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{tree}: llm-diagnose {' '.join(argv)} failed")
    return wall, usage.ru_utime + usage.ru_stime


def imported(tree: Path, argv: list[str]) -> set[str]:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "llm_diagnose", *argv],
        cwd=tree,
        env=_env(tree),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("import time:") and "cumulative" not in ln]
    return {ln.split("|")[2].strip() for ln in lines}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="+", metavar="NAME=TREE")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    variants = {name: Path(tree).resolve() for name, tree in (v.split("=", 1) for v in args.variants)}
    sys.path.insert(0, str(ROOT))
    from tests.evidence_builders import build

    with tempfile.TemporaryDirectory() as tmp:
        evidence = Path(tmp) / "evidence.json"
        evidence.write_text(build({"kv.usage_p95": 0.99, "kv.preemptions": 7, "engine.name": "vllm"}).to_json())
        print("| command line | variant | wall, median | CPU, median | modules | loaded |")
        print("|---|---|---|---|---|---|")
        for line in COMMAND_LINES:
            argv = [str(evidence) if a == EVIDENCE else a for a in line]
            runs: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
            for _ in range(args.runs):
                for name, tree in variants.items():
                    runs[name].append(timed(tree, argv))
            for name, tree in variants.items():
                modules = imported(tree, argv)
                wall = statistics.median(w for w, _ in runs[name])
                cpu = statistics.median(c for _, c in runs[name])
                loaded = ", ".join(h for h in HEAVY if h in modules) or "none of them"
                shown = " ".join(line)
                print(f"| `{shown}` | {name} | {wall:.2f} s | {cpu:.2f} s | {len(modules)} | {loaded} |", flush=True)


if __name__ == "__main__":
    main()
