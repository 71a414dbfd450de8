"""benchmarks/gpu_e2e.py in its CPU form: the tiny model served by `transformers serve` under the
in-process probe, `run --active` (decode only, a small budget), `microbench` on the same shape at
the run's batch, `decide`; the summary sets the served gap against the step and carries Q5.

The GPU form (the Llama-3-8B shape) runs the same code on a lent GPU (benchmarks/RESULTS.md); CI
runs this one. It starts a real server, so it is marked real_engine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from llm_diagnose.diagnose.tree.diagnosis import HEADLINE_KINDS
from tests.conftest import load_benchmark

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_e2e.py"


def _script():
    return load_benchmark("gpu_e2e")


def test_the_padded_vocabulary_decodes_every_id_a_bigger_head_can_emit(tmp_path: Path) -> None:
    # A Llama-3-shaped head emits any of 128256 ids; an id the tokenizer does not know decodes to "",
    # which would stream as no token at all.
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["the quick brown fox"] * 20, trainer=trainers.BpeTrainer(vocab_size=300))
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    before = PreTrainedTokenizerFast(tokenizer_file=str(path))
    assert len(before) < 1000 and before.decode([999]) == ""
    _script().pad_vocabulary(path, 1000)
    after = PreTrainedTokenizerFast(tokenizer_file=str(path))
    assert len(after) == 1000 and after.decode([999]) == "<999>"
    assert after("the quick").input_ids == before("the quick").input_ids  # known text encodes as before


def test_a_request_for_an_unlisted_model_leaves_the_name_to_the_server() -> None:
    # `transformers serve MODEL` lists only its hub cache in /v1/models and refuses any name but MODEL's:
    # with no model discovered, the body names none (the pinned server then serves its own).
    from llm_diagnose.probes.load.records import RequestSpec

    spec = RequestSpec("r", "hello", 4)
    assert "model" not in spec.payload("")
    assert spec.payload("tiny")["model"] == "tiny"


@pytest.mark.real_engine
def test_cpu_form_sets_the_served_gap_against_the_step_and_answers_q5(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "e2e"
    argv = [sys.executable, str(SCRIPT), "--device", "cpu", "--model-dir", str(tiny_model_dir), "--out", str(out)]
    argv += ["--deadline", "110", "--budget-requests", "24", "--budget-seconds", "20", "--duration", "3"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=150)
    summary = json.loads((out / "summary.json").read_text())
    assert done.returncode == 0, (summary.get("failed"), summary["phases"], done.stderr[-2000:])
    assert summary["device"] == "cpu" and summary["phases"]["run"]["exit"] in (0, 4), summary["phases"]
    # The served gap: the decode experiment's batch-1 streams against the tiny model's step on this CPU.
    assert summary["served_itl_s"] > 0 and summary["served_batch"] == 1.0, summary["decomposition"]
    assert summary["step_s"] > 0 and summary["step_kind"] == "roofline floor", summary["decomposition"]
    assert any(p["name"] == "hardware step" for p in summary["parts"]), summary["decomposition"]
    # The in-process probe timed the server's own decode forwards.
    assert summary["probe_decode_forward_p50_s"] > 0, summary
    assert summary["q5"]["answer"] in ("yes", "no", "unknown") and summary["q5"]["rationale"], summary["q5"]
    assert summary["headline"]["kind"] in HEADLINE_KINDS and summary["headline"]["line"], summary["headline"]
    assert (out / "decision.json").exists() and (out / "mb" / "evidence.json").exists()
