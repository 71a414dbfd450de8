"""The load driver: a streaming OpenAI-compatible client, workloads, budget and pacing.

    async with StreamingClient(url, model) as client:
        driver = Driver(client, BudgetGuard(ActiveBudget(max_requests=50)), JsonlWriter(run_dir / "requests.jsonl"))
        records = await driver.run(synthetic_workload(PromptMaker(), 20, LengthDist.fixed(64),
                                                      LengthDist.heavy_tailed(100, 1.0), pacing=PoissonArrivals(2.0)))

Every request yields one RequestRecord (send time, TTFT, every gap, tokens, finish reason or
fault kind); llm_diagnose/probes/experiments builds the diagnoser's experiments on top.
"""

from llm_diagnose.probes.load.budget import ActiveBudget, BudgetGuard
from llm_diagnose.probes.load.client import DEFAULT_MAX_STREAMS, StreamingClient, StreamTimeouts, is_local_target
from llm_diagnose.probes.load.faults import SERVER_FAULTS, FaultKind
from llm_diagnose.probes.load.health import ClientHealth, HealthWindow
from llm_diagnose.probes.load.pacing import ClosedLoop, ConstantArrivals, PoissonArrivals, TraceArrivals
from llm_diagnose.probes.load.prompts import PromptMaker, calibrate_prompts
from llm_diagnose.probes.load.records import (
    EVENTS_FILE,
    REQUESTS_FILE,
    JsonlWriter,
    RequestRecord,
    RequestSpec,
    read_records,
)
from llm_diagnose.probes.load.runner import Driver
from llm_diagnose.probes.load.workloads import LengthDist, Workload, shared_prefix_workload, synthetic_workload

__all__ = [
    "ActiveBudget",
    "BudgetGuard",
    "StreamingClient",
    "StreamTimeouts",
    "DEFAULT_MAX_STREAMS",
    "is_local_target",
    "FaultKind",
    "SERVER_FAULTS",
    "ClientHealth",
    "HealthWindow",
    "ClosedLoop",
    "ConstantArrivals",
    "PoissonArrivals",
    "TraceArrivals",
    "PromptMaker",
    "calibrate_prompts",
    "RequestSpec",
    "RequestRecord",
    "JsonlWriter",
    "read_records",
    "REQUESTS_FILE",
    "EVENTS_FILE",
    "load_trace",
    "trace_workload",
    "Driver",
    "LengthDist",
    "Workload",
    "synthetic_workload",
    "shared_prefix_workload",
]


def __getattr__(name: str) -> object:
    # Replay needs the trace readers (and numpy); live probing does not, so load them on use.
    if name in ("load_trace", "trace_workload"):
        from llm_diagnose.probes.load import replay

        return getattr(replay, name)
    raise AttributeError(f"module 'llm_diagnose.probes.load' has no attribute {name!r}")
