"""`llm-diagnose microbench`: step latencies, machine ceilings and roofline floors of a model, in-process.

The model is one of: `--config` (a config.json or a model folder: random weights of its shapes
and dtype, no weights read), `--model` (a folder whose weights are loaded), `--preset` (a shape
made in-process), or, with `--run` and none of these, the model folder the run's engine reports
(engine.model) where it is a local folder. `--run RUN` also sets what is timed: the run's running
batch and its context, batch 1 where the served gap came from the decode experiment's batch-1
phase, and one device's shard of its tensor parallel size; `decide RUN MICROBENCH` then sets the
served time per token against this step (Q5).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from llm_diagnose.diagnose.commands import argtypes
from llm_diagnose.diagnose.errors import UsageError
from llm_diagnose.diagnose.runfolder import check_out_file, out_path, prepare_out_dir, write_output

EXAMPLE = """example:
  llm-diagnose microbench --preset tiny --batch 1,4 --context 128 --prompt 128
  llm-diagnose microbench --model ./my-model --device cuda --batch 1,8,32,64 --context 512,2048 --out runs/mb
  llm-diagnose microbench --config ./Llama-3.1-70B/config.json --run runs/staging --device cuda --out runs/mb
  llm-diagnose decide runs/staging runs/mb   (Q5: the served time per token against the step)

The timer is chosen for the device (CUDA-graph replays on a GPU, the monotonic clock on CPU),
each decode step is also timed eagerly (host clock, dispatch included), and every figure
records which timer and why, and any shard or layer extrapolation."""

DEFAULT_BATCHES = (1, 4, 16)
DEFAULT_CONTEXTS = (128, 512)
DEFAULT_PROMPTS = (128, 512)
DEFAULT_RUN_CONTEXT = 512  # when the run measured no prompt or output lengths


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
    src.add_argument(
        "--config",
        metavar="PATH",
        help="a config.json, or a model folder holding one: random weights of its shapes and dtype (no weights read)",
    )
    src.add_argument("--model", metavar="DIR", help="a transformers causal-LM directory (its weights are loaded)")
    src.add_argument("--preset", help="a model shape created in-process: tiny (the default), gpu-small")
    p.add_argument(
        "--run",
        metavar="RUN",
        help="a run folder or evidence.json: time the step at its running batch and context (and batch 1), as one "
        "device's shard of its tensor parallel size, of the model folder its engine reports unless one is given",
    )
    p.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda, cuda:N")
    p.add_argument(
        "--dtype",
        choices=("auto", "bfloat16", "float16", "float32"),
        default="auto",
        help="weights' dtype (auto: the config's for --config, else bfloat16)",
    )
    p.add_argument(
        "--tp",
        type=argtypes.count(1, 4096, what="a tensor parallel size"),
        help="with --config: time one device's shard of a TP-N deployment (default: the run's, else 1)",
    )
    p.add_argument(
        "--layers",
        type=argtypes.count(1, 100_000, what="a number of layers"),
        help="with --config: build at most N decoder layers and scale each step to the config's count "
        "(default: as many as fit half the device's free memory)",
    )
    batches = argtypes.counts(1, argtypes.MAX_BATCH, what="a batch size")
    lengths = argtypes.counts(1, argtypes.MAX_TOKENS, what="a length in tokens")
    p.add_argument("--batch", type=batches, help="decode batch sizes (default 1,4,16; with --run: 1 and its batch)")
    p.add_argument("--context", type=lengths, help="decode context lengths (default 128,512; with --run: its own)")
    p.add_argument("--prompt", type=lengths, help="prefill prompt lengths (default 128,512; with --run: none)")
    p.add_argument(
        "--budget",
        type=argtypes.seconds(0.001, argtypes.MAX_MICROBENCH_BUDGET_S, what="seconds per measurement"),
        default=0.3,
        help="seconds per measurement (default 0.3)",
    )
    p.add_argument("--out", metavar="PATH", type=out_path, help="write evidence.json here (a .json file or a folder)")
    p.set_defaults(func=run)


def _from_run(path: str) -> tuple[tuple[int, ...], int, int | None, str | None, list[str]]:
    """(batches, context, tensor parallel size, model folder, notes) of the run at `path`."""
    from llm_diagnose.diagnose.commands.common import load_evidence
    from llm_diagnose.probes import quantities as Q

    ev = load_evidence(path)
    notes: list[str] = []

    def num(key: str) -> float | None:
        m = ev.measurement(key)
        if m is not None:
            return m.value
        value = ev.fact(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    running = num(Q.RUNNING_MEAN) or num(Q.CONCURRENCY_MEAN)
    batches = {1}  # the decode experiment's gaps are at batch 1
    if running is not None:
        batches.add(max(1, round(running)))
    else:
        notes.append("the run measured no running batch: batch 1 only")
    prompt, output = num(Q.INPUT_LEN_P50), num(Q.OUTPUT_LEN_P50)
    if prompt is not None:
        context = max(1, round(prompt + (output or 0.0) / 2))  # the mean context over a request's decode
    else:
        context = DEFAULT_RUN_CONTEXT
        notes.append(f"the run measured no prompt lengths: context {context}")
    tp = num(Q.TENSOR_PARALLEL)
    model = ev.fact(Q.ENGINE_MODEL)
    folder = model if isinstance(model, str) and (Path(model) / "config.json").is_file() else None
    return tuple(sorted(batches)), context, int(tp) if tp else None, folder, notes


def _choose_model(args: argparse.Namespace, run_folder: str | None) -> tuple[str, str]:
    """(kind, what): the model to time."""
    if args.config:
        return "config", args.config
    if args.model:
        return "weights", args.model
    if args.preset:
        return "preset", args.preset
    if run_folder:
        return "config", run_folder
    if args.run:
        print(
            "llm-diagnose: the run's engine.model is not a local model folder: timing the preset 'tiny' (give "
            "--config PATH/config.json for the served model's step)",
            file=sys.stderr,
        )
    return "preset", "tiny"


def run(args: argparse.Namespace) -> int:
    from llm_diagnose.diagnose.tree.evidence import Evidence, Target

    if args.out:  # an unusable --out fails now, not after the measurements
        if args.out.suffix == ".json":
            check_out_file(args.out)
        else:
            prepare_out_dir(args.out, files=("evidence.json",))
    batches, contexts, prompts = args.batch, args.context, args.prompt
    tp, run_folder = args.tp, None
    if args.run:
        run_batches, run_context, run_tp, run_folder, notes = _from_run(args.run)
        batches, contexts = batches or run_batches, contexts or (run_context,)
        prompts = prompts or ()
        tp = tp or run_tp
        for note in notes:
            print(f"llm-diagnose: {note}", file=sys.stderr)
    kind, what = _choose_model(args, run_folder)
    if (tp or args.layers) and kind != "config":
        raise UsageError("--tp and --layers shape a model built from its config: give --config PATH")
    prompts = DEFAULT_PROMPTS if prompts is None else prompts
    try:
        import torch

        from llm_diagnose.probes.microbench import Grid, run_microbench
        from llm_diagnose.probes.microbench.config_model import ConfigError, read_config
        from llm_diagnose.probes.microbench.from_config import floors_from_config, measure_config
        from llm_diagnose.probes.microbench.steps import MODEL_PRESETS, build_causal_lm
        from llm_diagnose.probes.timing import TimerUnavailable, device_kind
    except ImportError as exc:
        raise UsageError(
            f"microbench needs torch and transformers ({exc}): pip install 'llm-diagnose[torch]' transformers"
        ) from None
    grid = Grid(
        batches=batches or DEFAULT_BATCHES, contexts=contexts or DEFAULT_CONTEXTS, prompts=prompts, mixed=bool(prompts)
    )
    try:
        dev_kind = device_kind(args.device)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    device = args.device if args.device not in ("auto",) else dev_kind
    dtype = None if args.dtype == "auto" else args.dtype
    items: Any = None
    try:
        if kind == "config":
            read_config(what)  # an unreadable config is bad input: exit 2 before anything is built
            try:
                report = measure_config(
                    what, grid, device=device, dtype=dtype, tp=tp or 1, max_layers=args.layers, budget_s=args.budget
                )
            except TimerUnavailable:
                raise
            except (ConfigError, RuntimeError) as exc:  # unknown model type, out of memory, a kernel it lacks
                why = str(exc).splitlines()[0][:200]
                print(f"llm-diagnose: the step was not timed ({why}): its roofline floor stands in", file=sys.stderr)
                try:
                    items = floors_from_config(
                        what, grid, why, device=device, dtype=dtype, tp=tp or 1, budget_s=args.budget
                    )
                except ValueError as floor_exc:
                    raise UsageError(f"--config {what}: not timed ({why}), and no floor either: {floor_exc}") from None
                report = None
            name = f"config {what}"
        elif kind == "weights":
            from transformers import AutoModelForCausalLM

            if not Path(what).is_dir():
                raise UsageError(f"--model {what}: not a directory")
            loaded: Any = AutoModelForCausalLM.from_pretrained(what, dtype=getattr(torch, dtype or "bfloat16"))
            name = str(what)
            report = run_microbench(loaded.to(device).eval(), grid, budget_s=args.budget, name=name)
        else:
            if what not in MODEL_PRESETS:
                raise UsageError(f"unknown --preset {what!r} (expected one of {', '.join(MODEL_PRESETS)})")
            name = f"preset {what}"
            model = build_causal_lm(what, device=device, dtype=getattr(torch, dtype) if dtype else None)
            report = run_microbench(model, grid, budget_s=args.budget, name=name)
    except ConfigError as exc:
        raise UsageError(f"--config: {exc}") from None
    except TimerUnavailable as exc:
        raise UsageError(str(exc)) from None
    if report is not None:
        sys.stdout.write(report.table())
        items = report.evidence_items()
        if report.memcpy is not None and report.matmul is not None:
            mixed = f"; mixed step {report.mixed_ratio.value:.2f}x the decodes alone" if report.mixed_ratio else ""
            print(
                f"ceilings: copy {report.memcpy.value / 1e9:.3g} GB/s, matmul {report.matmul.value / 1e12:.3g} "
                f"TFLOP/s ({report.memcpy.provenance.method}){mixed}"
            )
    else:
        for key, item in sorted(items.items()):
            if key.startswith("decode.roofline_floor"):
                print(f"{key}: {item.value * 1e3:.4g} ms ({item.note})")
    if args.out:
        out = Path(args.out)
        if out.suffix != ".json":
            out.mkdir(parents=True, exist_ok=True)
            out = out / "evidence.json"
        where = report.device if report is not None else str(device)
        evidence = Evidence(Target(label=f"microbench: {name} on {where}"), items)
        write_output(out, evidence.to_json())
        print(f"evidence: {out}", file=sys.stderr)
    return 0
