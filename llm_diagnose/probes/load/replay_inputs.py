"""Replay an earlier active run (`run --active --replay BEFORE`): the same requests, in the same pattern.

The source is read and planned here, before anything is sent, so the run can say what it will send:

- `inputs.jsonl` (every body as it left, llm_diagnose.probes.experiments): the exact bodies at their
  recorded offsets, the first send of each request id only (a resend was the client's answer to
  that server; this run's client answers its own server). The model name is the target's served
  model where the target says one (the plan says when that differs from the recorded one).
  The optional extensions (`ignore_eos`, `stream_options`) are negotiated with the target as in any
  run: a body the target rejects for one is sent again without it.
- `requests.jsonl` (records, no bodies): requests of the same prompt length (the planned one, else
  the server's count) and `max_tokens` = the completion tokens recorded (with `ignore_eos`), at the
  recorded send times relative to the first; prompts come from a PromptMaker calibrated by POST /tokenize.
- a run folder: its inputs.jsonl, else its requests.jsonl;
- any trace the trace readers know: replay.trace_workload at the trace's own times.

Every request counts against the budget; a source larger than the budget is cut to it here (the
plan says how many are left out) and the Driver refuses whatever the budget still cannot hold.
Replayed records carry experiment "replay" and phase "<experiment>/<phase>" of the original.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from llm_diagnose.probes.bounded_lines import bounded_lines
from llm_diagnose.probes.load.budget import ActiveBudget
from llm_diagnose.probes.load.pacing import TraceArrivals
from llm_diagnose.probes.load.prompts import PromptMaker
from llm_diagnose.probes.load.records import (
    ENDPOINT_PATHS,
    INPUTS_FILE,
    REQUESTS_FILE,
    Endpoint,
    RecordSchemaError,
    RequestSpec,
    record_from_object,
)
from llm_diagnose.probes.load.replay import DEFAULT_OUTPUT_TOKENS, load_trace, trace_workload
from llm_diagnose.probes.load.workloads import Workload
from llm_diagnose.probes.runfiles import UnsafePathError, read_objects
from llm_diagnose.probes.traces.errors import EmptyTraceError, TraceFormatError
from llm_diagnose.probes.traces.readers import detect_format
from llm_diagnose.probes.traces.records import TraceRequest

__all__ = [
    "REPLAY_EXPERIMENT",
    "ReplayError",
    "ReplayRequest",
    "ReplaySource",
    "ReplayPlan",
    "read_replay_source",
    "plan_replay",
    "replay_workload",
    "run_replay",
]

REPLAY_EXPERIMENT = "replay"  # the experiment name on every replayed record
SourceKind = Literal["inputs", "requests", "trace"]
_PATH_ENDPOINTS: dict[str, Endpoint] = {path: ep for ep, path in ENDPOINT_PATHS.items()}  # type: ignore[misc]
_NEGOTIATED = ("ignore_eos", "stream_options")  # set through the spec, so the client may drop them


class ReplayError(ValueError):
    """The source cannot be replayed: missing, unknown format, nothing in it. One line."""


@dataclass(frozen=True)
class ReplayRequest:
    """One request of an earlier run, as recorded: its body (inputs.jsonl) or its lengths (requests.jsonl)."""

    request_id: str
    offset_s: float  # after the source's first request
    experiment: str
    phase: str
    endpoint: Endpoint
    body: Mapping | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None

    @property
    def phase_label(self) -> str:
        """The original experiment and phase: the replayed record's phase."""
        return f"{self.experiment}/{self.phase}" if self.phase else self.experiment


@dataclass(frozen=True)
class ReplaySource:
    """What a replay source holds: requests in send order (or a trace's), and what was skipped."""

    path: Path
    kind: SourceKind
    requests: tuple[ReplayRequest, ...] = ()
    trace: tuple[TraceRequest, ...] = ()
    trace_format: str = ""
    trace_more: int = 0  # trace requests after the ones read (beyond what any budget could send)
    resends_skipped: int = 0
    skipped: tuple[str, ...] = ()  # why lines were not used, one entry per line

    @property
    def count(self) -> int:
        return len(self.requests) if self.kind != "trace" else len(self.trace) + self.trace_more


# --- reading ------------------------------------------------------------------------------------
def read_replay_source(path: str | Path, *, trace_limit: int | None = None) -> ReplaySource:
    """Read a replay source: a run folder, inputs.jsonl, requests.jsonl, or a trace.

    `trace_limit`: keep at most this many trace requests (the rest are counted, not held).

    Raises:
        ReplayError: missing file, unknown format, or nothing replayable in it.
    """
    path = Path(path)
    if path.is_dir():
        for name in (INPUTS_FILE, REQUESTS_FILE):
            candidate = path / name
            if candidate.is_file() and candidate.stat().st_size > 0:
                return read_replay_source(candidate, trace_limit=trace_limit)
        raise ReplayError(f"--replay {path}: the folder has no {INPUTS_FILE} or {REQUESTS_FILE} to replay")
    if not path.is_file():
        raise ReplayError(f"--replay {path}: no such file or folder")
    first = _first_object(path)
    try:
        if first is not None and {"request_id", "t_offset_s", "body"} <= first.keys():
            source = _read_inputs(path)
        elif first is not None and {"request_id", "t_send", "ttft_s"} <= first.keys():
            source = _read_requests(path)
        else:
            source = _read_trace(path, trace_limit)
    except UnsafePathError as exc:  # a run's file is read as a plain file only (runfiles.read_objects)
        raise ReplayError(f"--replay {exc}") from None
    if source.count == 0:
        why = f" ({len(source.skipped)} lines unusable: {source.skipped[0]})" if source.skipped else ""
        raise ReplayError(f"--replay {path}: no request to replay{why}")
    return source


def _first_object(path: Path) -> dict | None:
    """The first non-blank line as a JSON object, or None (not JSON lines: maybe a CSV trace).

    A peek at what the file is, through a link too (a trace may be one); the line cap applies."""
    if path.suffix == ".gz":
        return None
    try:
        with path.open("rb") as f:
            for _, raw in bounded_lines(f):
                if raw is None:  # over the line cap: no run file of this tool's begins so
                    return None
                if raw.strip():
                    obj = json.loads(raw.decode("utf-8-sig"))
                    return obj if isinstance(obj, dict) else None
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return None


def _read_inputs(path: Path) -> ReplaySource:
    read = read_objects(path)  # as every run-folder file is read: unreadable lines skipped, each with why
    skipped = list(read.skipped_why)
    seen: set[str] = set()
    firsts: list[tuple[float, ReplayRequest]] = []
    resends = 0
    for n, obj in read.objects:
        rid, body, offset = obj.get("request_id"), obj.get("body"), obj.get("t_offset_s")
        endpoint = _PATH_ENDPOINTS.get(str(obj.get("path", "")))
        if not isinstance(rid, str) or not isinstance(body, dict) or not isinstance(offset, (int, float)):
            skipped.append(f"line {n}: no request_id, body or t_offset_s")
            continue
        if endpoint is None:
            skipped.append(f"line {n}: path {obj.get('path')!r} is not an inference endpoint")
            continue
        if rid in seen or (isinstance(obj.get("send"), int) and obj["send"] > 1):
            resends += 1  # a resend: this run's client decides its own
            continue
        seen.add(rid)
        request = ReplayRequest(
            rid, float(offset), str(obj.get("experiment", "")), str(obj.get("phase", "")), endpoint, body=body
        )
        firsts.append((float(offset), request))
    return ReplaySource(path, "inputs", _relative(firsts), resends_skipped=resends, skipped=tuple(skipped))


def _read_requests(path: Path) -> ReplaySource:
    read = read_objects(path)
    skipped = list(read.skipped_why)
    rows: list[tuple[float, ReplayRequest]] = []
    for n, obj in read.objects:
        try:
            record = record_from_object(obj)
        except RecordSchemaError as exc:
            skipped.append(f"line {n}: not a request record ({exc})")
            continue
        prompt_tokens = record.planned_prompt_tokens or record.prompt_tokens
        if not prompt_tokens:
            skipped.append(f"line {n}: {record.request_id} has no prompt length")
            continue
        output = record.completion_tokens or sum(record.event_tokens) or len(record.event_times) or None
        endpoint: Endpoint = "chat" if record.endpoint == "chat" else "completions"
        request = ReplayRequest(
            record.request_id,
            record.t_send,
            record.experiment,
            record.phase,
            endpoint,
            prompt_tokens=prompt_tokens,
            output_tokens=output,
        )
        rows.append((record.t_send, request))
    return ReplaySource(path, "requests", _relative(rows), skipped=tuple(skipped))


def _relative(rows: list[tuple[float, ReplayRequest]]) -> tuple[ReplayRequest, ...]:
    """In send order (ties keep file order), offsets from the first."""
    rows = sorted(rows, key=lambda r: r[0])
    if not rows:
        return ()
    t0 = rows[0][0]
    return tuple(replace(r, offset_s=round(t - t0, 6)) for t, r in rows)


def _read_trace(path: Path, limit: int | None) -> ReplaySource:
    try:
        fmt = detect_format(str(path))
        trace = load_trace(path, fmt, limit=None if limit is None else limit + 1)
    except EmptyTraceError:
        raise ReplayError(
            f"--replay {path}: no request to replay (empty, or no JSON object in its first lines)"
        ) from None
    except TraceFormatError as exc:
        raise ReplayError(
            f"--replay {path}: neither inputs.jsonl, requests.jsonl nor a known trace format ({exc})"
        ) from None
    if any(r.timestamp_s is None for r in trace):
        raise ReplayError(f"--replay {path}: the trace has no arrival time on every request; nothing to replay it at")
    more = 0
    if limit is not None and len(trace) > limit:
        trace, more = trace[:limit], len(trace) - limit  # at least one more: the rest is not read
    return ReplaySource(path, "trace", trace=trace, trace_format=fmt, trace_more=more)


# --- planning -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReplayPlan:
    """What the replay will send, decided before sending; `describe()` is what the run announces."""

    source: ReplaySource
    requests: tuple[ReplayRequest, ...]  # kept, within the budget (inputs/requests sources)
    trace: tuple[TraceRequest, ...]  # kept, within the budget (trace sources)
    cut: int  # left out by the budget before sending
    cut_reason: str
    model: str  # the model every body names
    notes: tuple[str, ...] = ()

    @property
    def count(self) -> int:
        return len(self.requests) if self.source.kind != "trace" else len(self.trace)

    @property
    def needs_prompts(self) -> bool:
        """Whether prompts must be made (and POST /tokenize asked): everything but exact bodies."""
        return self.source.kind != "inputs"

    @property
    def span_s(self) -> float:
        if self.source.kind != "trace":
            return self.requests[-1].offset_s if self.requests else 0.0
        times = [r.timestamp_s for r in self.trace if r.timestamp_s is not None]
        return max(times) - min(times) if times else 0.0

    def describe(self) -> str:
        what = {
            "inputs": "the recorded request bodies",
            "requests": "requests of the recorded prompt and output lengths (prompts made here)",
            "trace": f"the {self.source.trace_format or 'trace'} requests",
        }[self.source.kind]
        lines = [
            f"replay: {self.count} requests over {self.span_s:.1f} s, {what}, at their recorded times, "
            f"from {self.source.path}"
        ]
        if self.cut:
            at_least = " or more" if self.source.trace_more else ""  # a trace is read only as far as the budget
            lines.append(f"  {self.cut}{at_least} requests of the source will not be sent: {self.cut_reason}")
        lines.extend(f"  {n}" for n in self.notes)
        return "\n".join(lines)


def plan_replay(source: ReplaySource, budget: ActiveBudget, served_model: str | None) -> ReplayPlan:
    """Cut the source to the budget (requests and seconds) and choose the model name.

    Requests from requests.jsonl or a trace need one budget slot for POST /tokenize first.
    Requests recorded at or after the budget's seconds are cut too (they could never start).
    """
    room = budget.max_requests - (1 if source.kind != "inputs" else 0)
    notes: list[str] = []
    if source.resends_skipped:
        notes.append(f"{source.resends_skipped} recorded resends are not replayed (the client resends as it needs)")
    if source.skipped:
        notes.append(f"{len(source.skipped)} unusable lines skipped (first: {source.skipped[0]})")
    if budget.max_rps:
        notes.append(f"--max-rps {budget.max_rps:g} may start requests later than recorded")
    if source.kind == "trace":
        times = [r.timestamp_s for r in source.trace if r.timestamp_s is not None]
        t0 = min(times) if len(times) == len(source.trace) and times else None
        trace_in_time = [r for r in source.trace if t0 is None or (r.timestamp_s or 0.0) - t0 < budget.max_seconds]
        kept_trace = tuple(trace_in_time[: max(0, room)])
        cut = source.count - len(kept_trace)
        reason = _cut_reason(budget, len(trace_in_time) < len(source.trace), len(trace_in_time) > room)
        return ReplayPlan(source, (), kept_trace, cut, reason, served_model or "", tuple(notes))
    in_time = [r for r in source.requests if r.offset_s < budget.max_seconds]
    kept = tuple(in_time[: max(0, room)])
    cut = len(source.requests) - len(kept)
    reason = _cut_reason(budget, len(in_time) < len(source.requests), len(in_time) > room)
    recorded = sorted({str(r.body.get("model")) for r in kept if r.body is not None and "model" in r.body})
    model = served_model or (recorded[0] if len(recorded) == 1 else "")
    if served_model and any(m != served_model for m in recorded):
        notes.append(
            f"the recorded bodies name model {', '.join(recorded)}; the target serves {served_model}: "
            f"sent as {served_model}"
        )
    elif not served_model and len(recorded) > 1:
        notes.append(f"the target names no model: each body keeps its own ({', '.join(recorded)})")
    return ReplayPlan(source, kept, (), cut, reason, model, tuple(notes))


def _cut_reason(budget: ActiveBudget, by_time: bool, by_count: bool) -> str:
    parts = []
    if by_count:
        parts.append(f"the budget of {budget.max_requests} requests")
    if by_time:
        parts.append(f"recorded after the budget's {budget.max_seconds:g} s")
    return "; ".join(parts) or "budget"


def replay_workload(
    plan: ReplayPlan, prompts: PromptMaker | None = None, *, max_model_len: int | None = None
) -> Workload:
    """The RequestSpecs and their times; `prompts` is needed unless the plan replays exact bodies."""
    if plan.source.kind == "trace":
        if prompts is None:
            raise ValueError("a trace replay needs a PromptMaker")
        # Salted as the request bodies below are drawn fresh: an earlier replay's cache cannot serve it.
        return trace_workload(
            plan.trace, prompts, max_model_len=max_model_len, experiment=REPLAY_EXPERIMENT, fresh_cache=True
        )
    rng = random.Random()  # fresh bodies each replay: an earlier run's cache cannot serve them
    specs = []
    for r in plan.requests:
        if r.body is not None:
            specs.append(_spec_from_body(r, plan.model))
            continue
        if prompts is None:
            raise ValueError("replaying requests.jsonl needs a PromptMaker")
        n_in, n_out = r.prompt_tokens or 1, max(1, r.output_tokens or DEFAULT_OUTPUT_TOKENS)
        tag = "" if r.output_tokens else "output length unknown"
        if max_model_len is not None and n_in + n_out > max_model_len:
            n_out, tag = max(1, max_model_len - n_in), "clipped"
        specs.append(
            RequestSpec(
                r.request_id,
                prompts.body(n_in, rng, r.endpoint),
                n_out,
                r.endpoint,
                REPLAY_EXPERIMENT,
                r.phase_label,
                tag,
                planned_prompt_tokens=n_in,
            )
        )
    times = tuple(r.offset_s for r in plan.requests)
    return Workload(
        REPLAY_EXPERIMENT,
        tuple(specs),
        TraceArrivals(times),
        f"replay of {len(specs)} requests from {plan.source.path}",
    )


def _spec_from_body(r: ReplayRequest, model: str) -> RequestSpec:
    """A spec whose payload is the recorded body (the model name aside, where `model` is set).

    Every recorded key travels in extra_body, which overrides the payload's own, except the
    optional extensions: those the spec carries, so the client can drop one the target rejects.
    """
    body = dict(r.body or {})
    if model:
        body["model"] = model
    prompt = body.get("prompt")
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt) and r.endpoint == "completions":
        spec_prompt: str | tuple[int, ...] = tuple(prompt)
    else:
        spec_prompt = prompt if isinstance(prompt, str) else ""
    max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
    options = body.get("stream_options")
    continuous = isinstance(options, dict) and options.get("continuous_usage_stats") is True
    standard_options = {"include_usage": True, **({"continuous_usage_stats": True} if continuous else {})}
    extra = {k: v for k, v in body.items() if k not in _NEGOTIATED}
    if "stream_options" in body and options != standard_options:
        extra["stream_options"] = options
    if "ignore_eos" in body and body["ignore_eos"] is not True:
        extra["ignore_eos"] = body["ignore_eos"]
    return RequestSpec(
        r.request_id,
        spec_prompt,
        max_tokens if isinstance(max_tokens, int) and max_tokens >= 1 else DEFAULT_OUTPUT_TOKENS,
        r.endpoint,
        REPLAY_EXPERIMENT,
        r.phase_label,
        ignore_eos=body.get("ignore_eos") is True,
        continuous_usage=continuous,
        planned_prompt_tokens=len(spec_prompt) if isinstance(spec_prompt, tuple) else None,
        extra_body=tuple(extra.items()),
    )


# --- running ------------------------------------------------------------------------------------
async def run_replay(base_url: str, plan: ReplayPlan, budget: ActiveBudget, run_dir: str | Path | None) -> dict:
    """Send the plan within `budget`; requests.jsonl, events.jsonl and inputs.jsonl go to `run_dir`.

    Returns evidence items (the run summary, the client's health), as run_experiments does.
    """
    # The recorder and the summary are the experiments' own, so a replay's files read like any run's.
    from llm_diagnose.probes import quantities as Q
    from llm_diagnose.probes.http import normalize_base_url, redact_url
    from llm_diagnose.probes.load.active_run import input_recorder, run_summary, run_writers
    from llm_diagnose.probes.load.budget import BudgetGuard
    from llm_diagnose.probes.load.client import StreamingClient
    from llm_diagnose.probes.load.health import HealthWindow, TargetHost
    from llm_diagnose.probes.load.prompts import calibrate_prompts
    from llm_diagnose.probes.load.replay_punctuality import send_lateness
    from llm_diagnose.probes.load.runner import Driver
    from llm_diagnose.probes.results import Fact, Measurement, Provenance

    guard = BudgetGuard(budget)
    base = normalize_base_url(base_url)
    source = redact_url(base)
    requests_out, events_out, inputs_out = run_writers(run_dir)
    results: dict = {}
    try:
        async with StreamingClient(base, plan.model) as client:
            client.on_body = input_recorder(inputs_out, time.perf_counter())
            prompts, max_len = None, None
            if plan.needs_prompts:
                if await guard.admit():  # POST /tokenize takes a budget slot, as in every active run
                    prompts, max_len = await calibrate_prompts(client.session, base, plan.model)
                else:
                    prompts = PromptMaker(source="uncalibrated: no budget slot left for POST /tokenize")
            workload = replay_workload(plan, prompts, max_model_len=max_len)
            driver = Driver(client, guard, requests_out)
            events_out.event(
                "run-start",
                target=source,
                model=plan.model,
                budget=budget.describe(),
                prompts=prompts.describe() if prompts is not None else "the recorded bodies",
                plan=plan.describe(),
            )
            events_out.event("experiment-start", experiment=REPLAY_EXPERIMENT, time_cap_s=round(guard.remaining_s, 3))
            async with HealthWindow(client.counters, TargetHost.of(base)) as window:
                try:
                    await driver.run(workload, until=guard.deadline)
                finally:
                    await driver.stop_all("replay over")
            assert window.health is not None
            events_out.event(
                "experiment-end", experiment=REPLAY_EXPERIMENT, sent=guard.sent, health=window.health.describe()
            )
            driver.not_sent += plan.cut  # the run summary counts those the plan left out too
            not_sent = driver.not_sent
            results.update(window.health.measurements(source))
            results.update(run_summary(driver, source, window.health.window_s))
            offsets = {r.request_id: r.offset_s for r in plan.requests}
            lateness = send_lateness(offsets, driver.records, window.health, source)
            results.update(lateness)
            notes = [plan.describe().replace("\n  ", "; "), *client.negotiated]
            notes += [w for m in lateness.values() if isinstance(m, Measurement) for w in m.warnings]
            if not_sent:
                notes.append(f"{not_sent} requests of the source were not sent (budget)")
            results[Q.ACTIVE_NOTES] = Fact("; ".join(notes), Provenance(method="active-probe/replay", source=source))
            events_out.event(
                "run-end",
                sent=guard.sent,
                not_sent=not_sent,
                budget=guard.describe(),
                server_gone=driver.server_gone,
                resent_on_closed_connection=client.resent_stale,
                notes=notes,
            )
    finally:
        requests_out.close()
        events_out.close()
        inputs_out.close()
    return results
