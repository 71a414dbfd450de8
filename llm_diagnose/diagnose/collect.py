"""Collecting evidence: `run`'s runner of probes, and the evidence rebuilt offline.

`run_target` runs the passive probes against a target (discovery, the /metrics scrape window,
GPU memory through NVML, the PyTorch probe's page), with the active experiments `run --active`
hands it as `active`, then diagnoses and writes the run folder (`write_run`, which `fleet`
writes each replica's through); `demo` calls it too. The offline builder `trace_items_for` (a
trace, analysed by `llm_diagnose.probes.traces`) serves `decide`, `report` and `fleet`, which never
touch a target (an interrupted run's scrapes are read back by llm_diagnose.diagnose.runfolder):
so the probes that talk to a server (and the HTTP client under them) are imported by the
functions that run them, not by this module.

The other places that run probes, each for its own command:

- `commands/run.py`: plans the active experiments (one GET /v1/models) before `run_target`;
- `llm_diagnose.diagnose.capacity.live`: the live goodput search of `plan --active` (load);
- `commands/fleet.py`: a fleet's metrics read from Prometheus (`probes.metrics.prometheus_api`);
- `commands/microbench.py`: a model timed in-process (`probes.microbench`);
- `commands/instrument.py`: a server started with the PyTorch probe inside it;
- `commands/trace.py`: a trace analysed on its own (`probes.traces`);
- `llm_diagnose.diagnose.demo`: the demo's own load on the local server it starts.

A run folder holds, as they are produced:

- `metrics.jsonl`: every raw scrape, appended and flushed as it is taken (none for a plain server,
  one without engine metrics that `run --active` measures from the client only);
- `requests.jsonl`, `events.jsonl`: per-request records of active experiments (with --active);
- `evidence.json`, `diagnosis.json`, `summary.txt`: written at the end, also after a fault.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from llm_diagnose.diagnose.errors import TargetError, UsageError
from llm_diagnose.diagnose.report import console
from llm_diagnose.diagnose.runfolder import UnsafePathError, write_result
from llm_diagnose.diagnose.text.control_chars import escape_controls
from llm_diagnose.diagnose.tree import diagnose
from llm_diagnose.diagnose.tree.diagnosis import Diagnosis
from llm_diagnose.diagnose.tree.evidence import Evidence, Target
from llm_diagnose.diagnose.tree.slo import SLO
from llm_diagnose.diagnose.tree.thresholds import Thresholds
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.results import Result

if TYPE_CHECKING:
    from llm_diagnose.probes.metrics.window import ScrapeRecord, Window

__all__ = [
    "RunPlan",
    "RunResult",
    "run_target",
    "finish_run",
    "window_restarts",
    "gpu_selection_line",
    "busy_at_start_line",
    "write_run",
]


@dataclass(frozen=True)
class RunPlan:
    url: str
    out_dir: Path
    duration_s: float = 30.0
    interval_s: float = 1.0
    thresholds: Thresholds = field(default_factory=Thresholds)
    extra_items: dict = field(default_factory=dict)  # declared facts
    metrics_url: str | None = None  # default: URL/metrics; the PyTorch probe's side port, for instance
    trace: Path | None = None  # a trace of the workload, analysed with the server's block size
    trace_format: str = "auto"
    block_size: int | None = None
    kv_capacity_tokens: int | None = None
    slo: SLO = field(default_factory=SLO)  # the service-level objectives the diagnosis is judged against
    gpus: tuple[int | str, ...] | None = None  # the server's GPUs (--gpus: indices or UUIDs); None: chosen by NVML
    # run --active: a server without engine metrics is attached as a plain one (its `active` hook
    # checks that it serves completions first); otherwise it is refused.
    attach_plain: bool = False


@dataclass(frozen=True)
class RunResult:
    evidence: Evidence
    diagnosis: Diagnosis
    out_dir: Path
    partial: str = ""  # why the run ended early, "" when it did not
    restarts: tuple[float, ...] = ()  # unix times of the pages where the server had restarted


def window_restarts(window: Window) -> tuple[float, ...]:
    """The unix times of the pages at which the server had restarted since the page before:
    a counter series went down, or its `_created` timestamp changed (found as the pages arrived:
    Window.restarts)."""
    return window.restarts


def _restart_line(restarts: tuple[float, ...]) -> str:
    if not restarts:
        return ""
    when = ", ".join(time.strftime("%H:%M:%S UTC", time.gmtime(t)) for t in restarts[:5])
    more = f" and {len(restarts) - 5} more" if len(restarts) > 5 else ""
    return (
        f"SERVER RESTARTED in the window ({len(restarts)} time(s): first seen at {when}{more}): counters went "
        "back to zero; increases are counted from zero after each restart (as Prometheus rate() does), and "
        "gauges and configuration are those of the server after it. Rerun on a server that stays up "
        "for a clean window."
    )


async def _collect(
    plan: RunPlan, on_sample: Callable[[ScrapeRecord, int], None] | None, active: Callable | None
) -> tuple[dict[str, Result], str, tuple[float, ...]]:
    from llm_diagnose.probes import discovery, nvml
    from llm_diagnose.probes.http import make_session, normalize_base_url, redact_url
    from llm_diagnose.probes.metrics.passive import PASSIVE_KEYS, passive_evidence
    from llm_diagnose.probes.metrics.scraper import scrape_window
    from llm_diagnose.probes.metrics.window import Window
    from llm_diagnose.probes.torch_probe.evidence import evidence_from_window as torch_probe_evidence

    base = normalize_base_url(plan.url)
    async with make_session() as session:
        found = await discovery.discover(
            base, metrics_url=plan.metrics_url, session=session, attach_plain=plan.attach_plain and active is not None
        )
        active_items: dict[str, Result] = {}
        if found.plain and active is not None:
            # No engine metrics to watch: no window (an empty one, of no scrape planned). The active
            # hook checks POST /v1/completions before its experiments; the engine's figures say why
            # they are missing and what would measure them.
            window = Window(redact_url(found.metrics_url))
            active_items = await active(base, found, plan.out_dir)
        else:
            scrape = scrape_window(
                found.metrics_url,
                plan.duration_s,
                interval_s=plan.interval_s,
                run_dir=plan.out_dir,
                on_sample=on_sample,
                session=session,
                min_coverage=plan.thresholds["evidence.min_window_coverage"],
            )
            if active is None:
                window = await scrape
            else:
                window, active_items = await asyncio.gather(scrape, active(base, found, plan.out_dir))
    items: dict[str, Result] = dict(found.facts)
    items.update(
        discovery.engine_side_not_measured(found, PASSIVE_KEYS) if found.plain else passive_evidence(window, found)
    )
    items.update(torch_probe_evidence(window))  # {} unless the page is the PyTorch probe's side port
    items.update(nvml.memory_evidence(engine=items, gpus=plan.gpus, server_pids=_server_pids(base, plan.gpus)))
    items.update(kept_apart(items, active_items))
    items.update(
        trace_items_for(
            items, plan.trace, plan.trace_format, block_size=plan.block_size, kv_capacity_tokens=plan.kv_capacity_tokens
        )
    )
    return items, window.incomplete or "", window_restarts(window)


def kept_apart(items: Mapping[str, Result], active_items: Mapping[str, Result]) -> dict[str, Result]:
    """The active results to add: every one, except a hole where the server's own figure stands.

    The experiments publish under names of their own (decode.batch1_*, spec.active_*), so what the
    server served over all traffic and what a controlled experiment measured sit side by side. Where
    a name is shared all the same, a figure the experiment did not measure never erases one the
    engine did (issue 26, item 1: a timed-out decode experiment erased the engine's ITL)."""
    from llm_diagnose.probes.results import Fact, Measurement

    measured = (Measurement, Fact)
    return {
        k: v
        for k, v in active_items.items()
        if not (isinstance(items.get(k), measured) and not isinstance(v, measured))
    }


def _server_pids(base_url: str, gpus: tuple[int | str, ...] | None) -> frozenset[int]:
    """The server's processes where this host shows them (its port's listeners and their children),
    to pick its GPUs from NVML's process lists; none needed when --gpus names them."""
    if gpus:
        return frozenset()
    from llm_diagnose.probes.load.health import TargetHost

    return TargetHost.of(base_url).server_pids()


def gpu_selection_line(items: Mapping[str, Result]) -> str:
    """A line for the summary where GPU memory was read on every GPU of a node of several (no
    process visible to tell the server's), so its figures may be other tenants'; "" otherwise."""
    from llm_diagnose.probes.results import Fact

    selection = items.get(Q.GPU_SELECTION)
    if not isinstance(selection, Fact) or selection.value != "node":
        return ""
    return f"GPU MEMORY READ ON {selection.note}"


def busy_at_start_line(items: Mapping[str, Result]) -> str:
    """A line for the summary where the server was already serving others before the run sent
    anything; "" otherwise."""
    from llm_diagnose.probes.results import Measurement

    load = items.get(Q.SERVER_REQUESTS_AT_START)
    if not isinstance(load, Measurement) or load.value <= 0:
        return ""
    if load.provenance.method.endswith("+counter"):  # no request in flight at a read, but tokens generated between
        said = f"at least {load.value:.0f} request(s) of other clients ran just before the run sent anything"
    else:
        said = f"{load.value:.0f} request(s) of other clients were in flight before the run sent anything"
    return f"SERVER ALREADY BUSY AT START: {said} ({load.note}); every active figure is shared with them"


def trace_items_for(
    items: Mapping[str, Result],
    trace: Path | None,
    fmt: str = "auto",
    *,
    block_size: int | None = None,
    kv_capacity_tokens: int | None = None,
) -> dict[str, Result]:
    """Evidence from a trace, simulated with the server's own block size and KV capacity where
    the evidence knows them and the caller did not say. A bad trace is a usage error naming
    the file and line."""
    if trace is None:
        return {}
    from llm_diagnose.probes.traces import TraceError, analyze_trace, trace_evidence

    block_size = block_size or _positive_int(items.get(Q.BLOCK_SIZE))
    kv_capacity_tokens = kv_capacity_tokens or _positive_int(items.get(Q.KV_CAPACITY_TOKENS))
    try:
        analysis = analyze_trace(trace, fmt=fmt, block_size=block_size, kv_capacity_tokens=kv_capacity_tokens)
    except TraceError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot read the trace {trace}: {exc.strerror or exc}") from None
    return trace_evidence(analysis)


def _positive_int(result: Result | None) -> int | None:
    value = getattr(result, "value", None)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    return int(value)


def finish_run(
    plan: RunPlan, items: dict[str, Result], partial: str = "", restarts: tuple[float, ...] = ()
) -> RunResult:
    """Diagnose what was collected and write evidence, diagnosis and summary."""
    from llm_diagnose.probes.http import redact_url

    evidence = Evidence(Target(url=redact_url(plan.url), label=plan.out_dir.name), items)
    evidence = evidence.with_items(plan.extra_items)
    return write_run(plan.out_dir, evidence, plan.thresholds, plan.slo, partial, restarts)


def write_run(
    out_dir: Path,
    evidence: Evidence,
    thresholds: Thresholds,
    slo: SLO | None = None,
    partial: str = "",
    restarts: tuple[float, ...] = (),
) -> RunResult:
    """Diagnose `evidence` and write the run's result files (runfolder.write_result): how every run
    ends, `run`'s and `demo`'s (finish_run) and each replica's of `fleet`."""
    diagnosis = diagnose(evidence, thresholds, slo=slo)
    summary = console.render(diagnosis, evidence)
    for line in (gpu_selection_line(evidence.items), busy_at_start_line(evidence.items)):
        if line:
            summary = line + "\n\n" + summary
    if restarts:
        summary = _restart_line(restarts) + "\n\n" + summary
    if partial:
        summary = f"PARTIAL RUN: {partial}\n\n" + summary
    # escaped: the partial reason may quote the server, a replica's name is a Prometheus label
    write_result(out_dir, evidence, diagnosis, escape_controls(summary))
    return RunResult(evidence, diagnosis, out_dir, partial, restarts)


def run_target(
    plan: RunPlan, *, on_sample: Callable[[ScrapeRecord, int], None] | None = None, active: Callable | None = None
) -> RunResult:
    """Attach to `plan.url`, collect, diagnose, write the run folder.

    Raises TargetError when nothing can be measured (unreachable, not an LLM server, no
    metrics). With `plan.attach_plain` and `active`, a server without engine metrics is attached as a
    plain one (no window; `active` checks that it serves completions, discovery.check_completions). A
    target that failed mid-run still gives a result, with `partial` saying why.
    """
    from llm_diagnose.probes.http import InvalidTargetURL, ProbeHTTPError

    plan.out_dir.mkdir(parents=True, exist_ok=True)
    try:
        items, partial, restarts = asyncio.run(_collect(plan, on_sample, active))
    except InvalidTargetURL as exc:
        raise UsageError(str(exc)) from None
    except UnsafePathError as exc:  # a link planted in the run folder while it ran
        raise UsageError(f"run folder: {exc}") from None
    except ProbeHTTPError as exc:
        raise TargetError(str(exc)) from None
    return finish_run(plan, items, partial, restarts)
