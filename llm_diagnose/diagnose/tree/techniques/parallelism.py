"""Tensor / pipeline parallelism: split weights that do not fit one device (decided by Q1)."""

from __future__ import annotations

from llm_diagnose.diagnose.tree.techniques.claim import FRACTION_MIN_EFFECT, down
from llm_diagnose.diagnose.tree.techniques.record import Technique
from llm_diagnose.diagnose.tree.techniques.setting import Setting, per_engine
from llm_diagnose.probes import quantities as Q

TECHNIQUE = Technique(
    id="parallelism",
    name="Tensor / pipeline parallelism",
    fixes="the weights do not fit one device at all",
    rank=10,
    claims=(down(Q.WEIGHTS_FRACTION, FRACTION_MIN_EFFECT, relative=False, said="below 1 per device"),),
    tuned_by=(Q.TENSOR_PARALLEL, Q.PIPELINE_PARALLEL),
    options=per_engine(
        vllm=[
            Setting("--tensor-parallel-size <N>", "within a node"),
            Setting("--pipeline-parallel-size <M>", "across nodes"),
        ],
        sglang=[Setting("--tp-size <N>", "within a node"), Setting("--pp-size <M>", "across nodes")],
        trtllm=[
            Setting(
                "--tp_size <N> --pp_size <M>",
                "options of trtllm-serve; a TensorRT engine is built for fixed sizes when its checkpoint is converted",
            )
        ],
    ),
)
