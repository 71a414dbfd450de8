"""`llm-diagnose microbench`: step latencies, machine ceilings and roofline floors of a model, in-process."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from llm_diagnose.diagnose.errors import UsageError
from llm_diagnose.diagnose.runfolder import check_out_file, out_path, prepare_out_dir, write_output

EXAMPLE = """example:
  llm-diagnose microbench --preset tiny --batch 1,4 --context 128 --prompt 128
  llm-diagnose microbench --model ./my-model --device cuda --batch 1,8,32,64 --context 512,2048 --out runs/mb
  llm-diagnose decide runs/mb        (the decode.*, prefill.* and machine.* keys travel in the evidence)

The timer is chosen for the device (CUDA-graph replays on a GPU, the monotonic clock on CPU)
and every figure records which one and why."""


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def register(sub) -> None:
    p = sub.add_parser(
        "microbench",
        help="time a model's decode/prefill steps against the machine's ceilings",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Measure decode-step latency over batch sizes and context lengths, prefill "
        "latency over prompt lengths and a mixed step, with the copy bandwidth and "
        "matmul rate of the device and each step's roofline floor.",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", metavar="DIR", help="a transformers causal-LM directory (loaded in bf16)")
    src.add_argument("--preset", default="tiny", help="a model shape created in-process: tiny (default), gpu-small")
    p.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda, cuda:N")
    p.add_argument("--batch", type=_ints, default=(1, 4, 16), help="decode batch sizes (default 1,4,16)")
    p.add_argument("--context", type=_ints, default=(128, 512), help="decode context lengths (default 128,512)")
    p.add_argument("--prompt", type=_ints, default=(128, 512), help="prefill prompt lengths (default 128,512)")
    p.add_argument("--budget", type=float, default=0.3, help="seconds per measurement (default 0.3)")
    p.add_argument("--out", metavar="PATH", type=out_path, help="write evidence.json here (a .json file or a folder)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from llm_diagnose.diagnose.tree.evidence import Evidence, Target

    if args.out:  # an unusable --out fails now, not after the measurements
        if args.out.suffix == ".json":
            check_out_file(args.out)
        else:
            prepare_out_dir(args.out, files=("evidence.json",))
    try:
        import torch

        from llm_diagnose.probes.microbench import Grid, run_microbench
        from llm_diagnose.probes.microbench.steps import MODEL_PRESETS, build_causal_lm
        from llm_diagnose.probes.timing import TimerUnavailable, device_kind
    except ImportError as exc:
        raise UsageError(
            f"microbench needs torch and transformers ({exc}): pip install 'llm-diagnose[torch]' transformers"
        ) from None
    try:
        kind = device_kind(args.device)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    device = args.device if args.device not in ("auto",) else kind
    try:
        if args.model:
            from transformers import AutoModelForCausalLM

            if not Path(args.model).is_dir():
                raise UsageError(f"--model {args.model}: not a directory")
            loaded: Any = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16)
            model = loaded.to(device).eval()
            name = str(args.model)
        else:
            if args.preset not in MODEL_PRESETS:
                raise UsageError(f"unknown --preset {args.preset!r} (expected one of {', '.join(MODEL_PRESETS)})")
            model = build_causal_lm(args.preset, device=device)
            name = f"preset {args.preset}"
        report = run_microbench(
            model, Grid(batches=args.batch, contexts=args.context, prompts=args.prompt), budget_s=args.budget, name=name
        )
    except TimerUnavailable as exc:
        raise UsageError(str(exc)) from None
    sys.stdout.write(report.table())
    if report.memcpy is not None and report.matmul is not None:
        print(
            f"ceilings: copy {report.memcpy.value / 1e9:.3g} GB/s, matmul {report.matmul.value / 1e12:.3g} TFLOP/s "
            f"({report.memcpy.provenance.method}); mixed step {report.mixed_ratio.value:.2f}x the decodes alone"
            if report.mixed_ratio
            else ""
        )
    if args.out:
        out = Path(args.out)
        if out.suffix != ".json":
            out.mkdir(parents=True, exist_ok=True)
            out = out / "evidence.json"
        evidence = Evidence(Target(label=f"microbench: {name} on {report.device}"), report.evidence_items())
        write_output(out, evidence.to_json())
        print(f"evidence: {out}", file=sys.stderr)
    return 0
