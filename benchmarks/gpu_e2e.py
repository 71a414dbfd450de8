"""End to end on a model of a real shape: served time per token against the measured step, and the diagnosis.

    python3 benchmarks/gpu_e2e.py --out gpu-e2e               # CUDA machine: Llama-3-8B shape, random bf16, < 8 min
    python benchmarks/gpu_e2e.py --device cpu --out cpu-e2e   # the same code on CPU with the tiny model (CI's form)

Nothing is downloaded. The model directory is built from a config: on a GPU the Llama-3-8B shape
(hidden 4096, 32 layers, 32 heads, 8 KV heads, intermediate 14336, vocab 128256) with random
bf16 weights written locally and the tiny model's seeded tokenizer, its vocabulary padded to the
model's so every id decodes to text; on CPU the seeded tiny model
(llm_diagnose.diagnose.demo.tiny_model). Then, each phase bounded by what is left of --deadline:

1. serve it with `transformers serve` (vLLM is not needed) under `llm-diagnose instrument`, the
   in-process PyTorch probe on a side port;
2. `llm-diagnose run --active` against it (small budget; the probe's page as --metrics-url, NVML
   read by `run` where a driver exists), then stop the server;
3. `llm-diagnose microbench --run RUN --config MODEL`: the same shape's decode step at the run's
   batch and context (CUDA-graph replays on a GPU, the host clock on CPU) with its roofline floor;
4. `llm-diagnose decide RUN MICROBENCH --json`.

It prints, and writes to OUT/summary.json, the served ITL, the step it is set against, Q5's
decomposition and answer, and the headline (with every phase's time, exit code and log tail).
Exit 0 when the summary holds the served ITL, the step and a Q5 answer; 1 otherwise (the summary
says which phase failed); 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from llm_diagnose.diagnose.demo.tiny_model import make_tiny_model  # noqa: E402
from llm_diagnose.diagnose.demo.vllm_server import TransformersServer, cpu_dtype  # noqa: E402
from llm_diagnose.diagnose.demo.vllm_server import _free_port as free_port  # noqa: E402

LLAMA3_8B = {
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
}
DEADLINE_S = {"cuda": 480.0, "cpu": 240.0}
MARKER = "gpu-e2e-model.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self, reserve: float = 0.0) -> float:
        return self.end - time.monotonic() - reserve


class InstrumentedServer(TransformersServer):
    """`transformers serve` started through `llm-diagnose instrument` (the probe on `probe_port`)."""

    def __init__(self, *args, probe_port: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.probe_port = probe_port

    def _program(self) -> list[str]:
        probe = [sys.executable, "-m", "llm_diagnose", "instrument", "--port", str(self.probe_port), "--"]
        return probe + super()._program()

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.probe_port}/metrics"


def pad_vocabulary(tokenizer_json: Path, size: int) -> None:
    """Give every id below `size` a token, so a random model's ids all decode to text: the tiny
    tokenizer knows 4096, a Llama-3-shaped head emits any of 128256 (an unknown id decodes to "")."""
    doc = json.loads(tokenizer_json.read_text())
    vocab = doc["model"]["vocab"]
    taken = set(vocab.values()) | {t["id"] for t in doc.get("added_tokens", ())}
    for i in range(size):
        if i not in taken:
            vocab[f"<{i}>"] = i
    tokenizer_json.write_text(json.dumps(doc, ensure_ascii=False))


def build_llama3_8b(out: Path, device: str, layers: int | None) -> Path:
    """The Llama-3-8B shape, random bf16 weights made on `device`, the tiny tokenizer padded to its vocabulary."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    shape = {**LLAMA3_8B, **({"num_hidden_layers": layers} if layers else {})}
    spec = {"shape": shape, "recipe": 1}
    if (out / MARKER).exists() and json.loads((out / MARKER).read_text()) == spec:
        return out
    shutil.rmtree(out, ignore_errors=True)
    tok = make_tiny_model(out.with_name(out.name + "-tokenizer"))
    out.mkdir(parents=True)
    for name in TOKENIZER_FILES:
        if (tok / name).exists():
            shutil.copy(tok / name, out / name)
    pad_vocabulary(out / "tokenizer.json", shape["vocab_size"])
    config = LlamaConfig(pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, **shape)
    torch.manual_seed(1234)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # made in bf16: no fp32 copy of 8 B parameters on the way
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model.save_pretrained(out, max_shard_size="5GB")
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    (out / MARKER).write_text(json.dumps(spec))
    return out


def run_cli(args: list[str], timeout: float, log: Path, stdout: Path | None = None) -> tuple[int, float, str]:
    """`python -m llm_diagnose ARGS` with its output in `log` (stdout in `stdout` when given):
    (exit code, seconds, the log's last lines); 124 when it ran past `timeout`."""
    t0 = time.monotonic()
    with log.open("wb") as sink, (stdout or log).open("ab") as out:
        try:
            code = subprocess.run(
                [sys.executable, "-m", "llm_diagnose", *args],
                stdout=out if stdout else sink,
                stderr=sink if stdout else subprocess.STDOUT,
                timeout=max(1.0, timeout),
                cwd=ROOT,
            ).returncode
        except subprocess.TimeoutExpired:
            code = 124
    tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-6:])
    return code, round(time.monotonic() - t0, 1), tail


def summarise(run_dir: Path, bench_dir: Path, decided: dict) -> dict:
    """The served gap against the step (Q5's decomposition), the probe's and NVML's figures, Q5 and the headline."""
    from llm_diagnose.diagnose.commands.common import join_evidence, load_evidence
    from llm_diagnose.diagnose.tree.reading import Reading
    from llm_diagnose.diagnose.tree.thresholds import Thresholds
    from llm_diagnose.diagnose.tree.time_per_token import decompose
    from llm_diagnose.probes import quantities as Q

    run = load_evidence(run_dir)
    d = decompose(Reading(join_evidence(run, load_evidence(bench_dir)), Thresholds()))
    q5 = next(a for a in decided["answers"] if a["question"] == "Q5")

    def value(key: str) -> float | None:
        m = run.measurement(key)
        return None if m is None else m.value

    return {
        "served_itl_s": d.served_s,
        "served_basis": d.served_basis,
        "served_batch": d.served_batch,
        "step_s": d.step_s,
        "step_kind": d.step_kind,
        "step_basis": d.step_basis,
        "eager_step_s": d.eager_s,
        "served_over_step": d.over_step,
        "mismatch": d.mismatch,
        "decomposition": d.text(),
        "parts": [{"name": p.name, "seconds": p.seconds, "share": p.share, "basis": p.basis} for p in d.parts],
        "probe_decode_forward_p50_s": value(Q.FORWARD_DECODE_P50),
        "nvml": {k: value(k) for k in (Q.DEVICE_TOTAL_BYTES, Q.DEVICE_USED_BYTES, Q.WEIGHTS_BYTES, Q.DEVICE_COUNT)},
        "q5": {k: q5[k] for k in ("answer", "verdict", "confidence", "rationale")},
        "headline": {
            "kind": decided["headline_kind"],
            "subject": decided["headline_subject"],
            "line": decided["bottleneck"],
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path, help="folder for the model, the run, the microbenchmark, logs")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--model-dir", type=Path, help="serve this transformers model folder instead of building one")
    p.add_argument(
        "--layers", type=int, help="GPU shape: build this many decoder layers instead of 32 (a quicker check)"
    )
    p.add_argument("--deadline", type=float, help="seconds for everything (default 480 on a GPU, 240 on CPU)")
    p.add_argument("--budget-requests", type=int, default=120)
    p.add_argument("--budget-seconds", type=float, default=90.0)
    p.add_argument("--duration", type=float, default=10.0, help="passive window of `run` (seconds)")
    p.add_argument("--experiments", help="subset for `run --active` (default: all on a GPU, decode on CPU)")
    p.add_argument("--continuous-batching", action="store_true", help="serve with transformers' continuous batching")
    args = p.parse_args(argv)
    if args.layers is not None and args.layers < 1:
        p.error("--layers must be at least 1")

    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    deadline = Deadline(args.deadline or DEADLINE_S[device])
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    dtype = "bfloat16" if device == "cuda" else cpu_dtype()
    summary: dict = {"device": device, "dtype": dtype, "phases": {}}
    phases = summary["phases"]

    def finish(code: int, why: str = "") -> int:
        if why:
            summary["failed"] = why
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(json.dumps(summary, indent=2))
        return code

    t0 = time.monotonic()
    if args.model_dir:
        model = args.model_dir.resolve()
        summary["model"] = {"dir": str(model), "shape": "given"}
    elif device == "cuda":
        model = build_llama3_8b(out / "model-llama3-8b", device, args.layers)
        summary["model"] = {"dir": str(model), "shape": "llama3-8b", "layers": args.layers or 32}
    else:
        model = make_tiny_model(out / "model-tiny")
        summary["model"] = {"dir": str(model), "shape": "tiny"}
    phases["model"] = {"seconds": round(time.monotonic() - t0, 1)}

    run_dir, bench_dir = out / "run", out / "mb"
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.rmtree(bench_dir, ignore_errors=True)
    serve_flags = ["--device", device, "--dtype", dtype]
    if args.continuous_batching:
        serve_flags += ["--continuous-batching"]
    server = InstrumentedServer(
        model,
        out / "server",
        extra_args=serve_flags,
        probe_port=free_port(),
        ready_timeout=max(5.0, min(300.0, deadline.left(reserve=60.0))),
    )
    t0 = time.monotonic()
    try:
        server.start()
        server.wait_ready()
    except (RuntimeError, OSError) as exc:
        phases["serve"] = {"seconds": round(time.monotonic() - t0, 1), "error": str(exc)[-600:]}
        server.stop()
        return finish(1, "serve")
    phases["serve"] = {"seconds": round(time.monotonic() - t0, 1), "url": server.url, "probe": server.metrics_url}
    experiments = args.experiments or ("decode" if device == "cpu" else "")
    try:
        run_args = ["run", "--url", server.url, "--metrics-url", server.metrics_url, "--out", str(run_dir), "--active"]
        run_args += ["--budget-requests", str(args.budget_requests), "--budget-seconds", str(args.budget_seconds)]
        run_args += ["--duration", str(args.duration), "--quiet"]
        run_args += ["--experiments", experiments] if experiments else []
        code, secs, tail = run_cli(run_args, deadline.left(reserve=45.0), out / "run.log")
        phases["run"] = {"exit": code, "seconds": secs, "log_tail": tail}
    finally:
        server.stop()  # the step is timed on a quiet device
    if code not in (0, 4):  # 4: partial, what was measured is kept
        return finish(1, "run")

    bench_args = ["microbench", "--run", str(run_dir), "--config", str(model), "--device", device]
    bench_args += ["--dtype", dtype, "--budget", "0.3", "--out", str(bench_dir)]
    code, secs, tail = run_cli(bench_args, deadline.left(reserve=10.0), out / "microbench.log")
    phases["microbench"] = {"exit": code, "seconds": secs, "log_tail": tail}
    if code != 0:
        return finish(1, "microbench")

    decision = out / "decision.json"
    decision.unlink(missing_ok=True)
    decide_args = ["decide", str(run_dir), str(bench_dir), "--json"]
    code, secs, tail = run_cli(decide_args, deadline.left(), out / "decide.log", stdout=decision)
    phases["decide"] = {"exit": code, "seconds": secs}
    if code != 0:
        phases["decide"]["log_tail"] = tail
        return finish(1, "decide")
    decided = json.loads(decision.read_text())
    summary.update(summarise(run_dir, bench_dir, decided))
    complete = summary["served_itl_s"] is not None and summary["step_s"] is not None and summary["q5"]["answer"]
    return finish(0 if complete else 1, "" if complete else "the summary lacks the served ITL, the step or Q5")


if __name__ == "__main__":
    sys.exit(main())
