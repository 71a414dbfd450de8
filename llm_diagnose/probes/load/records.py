"""What one request is (`RequestSpec`) and what happened to it (`RequestRecord`), and the
append-only JSONL files they go to.

Times are `time.perf_counter()` seconds (CLOCK_MONOTONIC on Linux, the clock the metrics
scraper's `time.monotonic()` also reads there): immune to NTP steps, comparable between
processes on one host. A record keeps the arrival time of every token event relative to its
own send time, so TTFT and every inter-token gap can be recomputed from the file.

`requests.jsonl` gets one line per request *as it completes*, flushed at once, so a run that
is interrupted or whose server dies loses nothing that was measured.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal

from llm_diagnose.probes.load.faults import SERVER_FAULTS, FaultKind
from llm_diagnose.probes.runfiles import LinesRead, open_append, read_parsed
from llm_diagnose.probes.runfolder_names import EVENTS as EVENTS_FILE
from llm_diagnose.probes.runfolder_names import INPUTS as INPUTS_FILE
from llm_diagnose.probes.runfolder_names import REQUESTS as REQUESTS_FILE

__all__ = [
    "Endpoint",
    "ENDPOINT_PATHS",
    "OPTIONAL_EXTENSIONS",
    "RequestSpec",
    "RequestRecord",
    "HttpPhases",
    "JsonlWriter",
    "read_records",
    "RecordsRead",
    "parse_record_line",
    "record_from_object",
    "RecordSchemaError",
    "REQUESTS_FILE",
    "EVENTS_FILE",
    "INPUTS_FILE",
]

Endpoint = Literal["completions", "chat"]
ENDPOINT_PATHS: dict[str, str] = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
# Fields beyond the OpenAI API that a server may reject by name (transformers serve: HTTP 422
# "Unexpected fields"); the client then sends without them. Inner keys first: dropping
# continuous_usage_stats keeps the usage chunk that dropping stream_options would lose.
OPTIONAL_EXTENSIONS = ("ignore_eos", "continuous_usage_stats", "stream_options")
_ROUND = 7  # decimals kept in the files: 0.1 us, far below any gap worth measuring


@dataclass(frozen=True)
class RequestSpec:
    """One request to send: what to ask for, and where it belongs in an experiment.

    `prompt` is text, or token ids (completions only: exact lengths, no tokenizer guesswork).
    `ignore_eos` asks the server to produce exactly `max_tokens` (a vLLM/SGLang extension;
    random-weight models may otherwise stop at any step). `continuous_usage` asks vLLM for
    usage in every chunk, which tells how many tokens each event carried (spec decoding).
    """

    request_id: str
    prompt: str | tuple[int, ...]
    max_tokens: int
    endpoint: Endpoint = "completions"
    experiment: str = ""
    phase: str = ""
    tag: str = ""  # free text for the analysis: a prefix group, "probe"/"peer", a prompt length
    ignore_eos: bool = True
    continuous_usage: bool = False
    planned_prompt_tokens: int | None = None
    extra_body: tuple[tuple[str, object], ...] = ()

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if self.endpoint == "chat" and not isinstance(self.prompt, str):
            raise ValueError("chat requests need a text prompt")
        if isinstance(self.prompt, list):
            object.__setattr__(self, "prompt", tuple(self.prompt))

    def payload(self, model: str, drop: set[str] | frozenset[str] = frozenset()) -> dict:
        """The JSON body for the OpenAI-compatible endpoint, without the extensions in `drop`. An unknown
        model ("": /v1/models listed none) is left out, so the server serves its own: `transformers serve
        MODEL` lists only its hub cache and refuses any other name than the one it was pinned to."""
        body: dict = {"max_tokens": self.max_tokens, "stream": True}
        if model:
            body = {"model": model, **body}
        if "stream_options" not in drop:
            body["stream_options"] = {"include_usage": True}
            if self.continuous_usage and "continuous_usage_stats" not in drop:
                body["stream_options"]["continuous_usage_stats"] = True
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": self.prompt}]
        else:
            body["prompt"] = list(self.prompt) if isinstance(self.prompt, tuple) else self.prompt
        if self.ignore_eos and "ignore_eos" not in drop:
            body["ignore_eos"] = True
        body.update(dict(self.extra_body))
        return body


@dataclass(frozen=True)
class HttpPhases:
    """When the HTTP client reached each step of one request (aiohttp's request tracing), in
    seconds after `RequestRecord.t_send`; None where the step did not happen or was not reported.

    They say where time before the first token went on the client's side: waiting for a free
    connection of the client's own pool (then TTFT includes the client's queue, not the
    server's), opening a connection, writing the request, and the server's answer headers
    (vLLM and SGLang send them when they accept a streamed request, before its first token).
    """

    pool_wait_s: float | None = None  # waited for a free connection of the client's pool
    connect_s: float | None = None  # opened a new connection (None: a kept-alive one was reused)
    reused: bool | None = None  # a kept-alive connection carried it
    headers_sent_s: float | None = None  # request headers written
    body_sent_s: float | None = None  # request body written
    response_headers_s: float | None = None  # status line and headers of the answer received

    def to_dict(self) -> dict:
        return {k: (round(v, _ROUND) if isinstance(v, float) else v) for k, v in self.__dict__.items() if v is not None}

    @classmethod
    def from_dict(cls, d: Mapping) -> HttpPhases:
        def seconds(key: str) -> float | None:
            return None if d.get(key) is None else float(d[key])

        reused = d.get("reused")
        return cls(
            pool_wait_s=seconds("pool_wait_s"),
            connect_s=seconds("connect_s"),
            reused=None if reused is None else bool(reused),
            headers_sent_s=seconds("headers_sent_s"),
            body_sent_s=seconds("body_sent_s"),
            response_headers_s=seconds("response_headers_s"),
        )


@dataclass(frozen=True)
class RequestRecord:
    """What happened to one request. Immutable; written to requests.jsonl when it ends."""

    request_id: str
    experiment: str
    phase: str
    tag: str
    endpoint: str
    t_send: float  # perf_counter at the moment the request was handed to the connection
    t_send_wall: float  # unix time of the same moment (for joining with other logs)
    event_times: tuple[float, ...] = ()  # token-event arrivals, seconds after t_send
    event_tokens: tuple[int, ...] = ()  # tokens per event, when the server said (continuous usage)
    t_end: float | None = None  # seconds after t_send when the request ended, however it ended
    http_status: int | None = None
    prompt_tokens: int | None = None  # as the server counted them (usage)
    planned_prompt_tokens: int | None = None
    completion_tokens: int | None = None  # as the server counted them (usage)
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, when sent
    finish_reason: str | None = None
    fault: FaultKind | None = None
    fault_detail: str = ""
    handling_s: float = 0.0  # client CPU time spent parsing this stream (its own overhead)
    http: HttpPhases | None = None  # the HTTP client's phases, where it reported them

    # --- derived ------------------------------------------------------------------------
    @property
    def completed(self) -> bool:
        """Ended normally: no fault, and the server said why it stopped."""
        return self.fault is None and self.finish_reason is not None

    @property
    def server_fault(self) -> bool:
        return self.fault in SERVER_FAULTS

    @property
    def ttft_s(self) -> float | None:
        return self.event_times[0] if self.event_times else None

    @property
    def gaps_s(self) -> tuple[float, ...]:
        t = self.event_times
        return tuple(b - a for a, b in zip(t, t[1:]))

    @property
    def e2e_s(self) -> float | None:
        """End-to-end latency of a completed request (None otherwise: a fault is not a latency)."""
        return self.t_end if self.completed else None

    @property
    def tokens_out(self) -> int:
        if self.completion_tokens is not None:
            return self.completion_tokens
        return sum(self.event_tokens) if self.event_tokens else len(self.event_times)

    def absolute_event_times(self) -> tuple[float, ...]:
        return tuple(self.t_send + t for t in self.event_times)

    # --- files ----------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d: dict = {
            "experiment": self.experiment,
            "phase": self.phase,
            "request_id": self.request_id,
            "tag": self.tag,
            "endpoint": self.endpoint,
            "t_send": round(self.t_send, _ROUND),
            "t_send_wall": round(self.t_send_wall, 6),
            "status": self.http_status,
            "ttft_s": None if self.ttft_s is None else round(self.ttft_s, _ROUND),
            "gaps_s": [round(g, _ROUND) for g in self.gaps_s],
            "tokens_in": self.prompt_tokens,
            "planned_tokens_in": self.planned_prompt_tokens,
            "tokens_out": self.tokens_out,
            "tokens_out_from": "usage" if self.completion_tokens is not None else "events",
            "cached_tokens": self.cached_tokens,
            "finish_reason": self.finish_reason,
            "fault": None if self.fault is None else self.fault.value,
            "t_end_s": None if self.t_end is None else round(self.t_end, _ROUND),
            "handling_s": round(self.handling_s, _ROUND),
        }
        if self.event_tokens:
            d["event_tokens"] = list(self.event_tokens)
        if self.fault_detail:
            d["fault_detail"] = self.fault_detail
        if self.http is not None:
            d["http"] = self.http.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> RequestRecord:
        ttft = d.get("ttft_s")
        times: list[float] = []
        if ttft is not None:
            times.append(float(ttft))
            for g in d.get("gaps_s", ()):
                times.append(times[-1] + float(g))
        fault = d.get("fault")
        return cls(
            request_id=str(d["request_id"]),
            experiment=str(d.get("experiment", "")),
            phase=str(d.get("phase", "")),
            tag=str(d.get("tag", "")),
            endpoint=str(d.get("endpoint", "completions")),
            t_send=float(d["t_send"]),
            t_send_wall=float(d.get("t_send_wall", 0.0)),
            event_times=tuple(times),
            event_tokens=tuple(int(x) for x in d.get("event_tokens", ())),
            t_end=None if d.get("t_end_s") is None else float(d["t_end_s"]),
            http_status=d.get("status"),
            prompt_tokens=d.get("tokens_in"),
            planned_prompt_tokens=d.get("planned_tokens_in"),
            # tokens_out is the server's count only where the server sent usage
            completion_tokens=d.get("tokens_out") if d.get("tokens_out_from") == "usage" else None,
            cached_tokens=d.get("cached_tokens"),
            finish_reason=d.get("finish_reason"),
            fault=None if fault is None else FaultKind(fault),
            fault_detail=str(d.get("fault_detail", "")),
            handling_s=float(d.get("handling_s", 0.0)),
            http=None if d.get("http") is None else HttpPhases.from_dict(d["http"]),  # not an object: AttributeError
        )


@dataclass
class JsonlWriter:
    """Append-only JSON lines, each flushed as it is written (nothing lost on interruption).

    `path=None` writes nothing, so code paths are the same with and without a run folder.
    """

    path: Path | None
    _fh: IO[str] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.path is not None:
            self.path = Path(self.path)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open_append(self.path)  # never through a link (llm_diagnose.probes.runfiles)

    def write(self, obj: Mapping) -> None:
        if self._fh is not None:
            self._fh.write(json.dumps(obj, allow_nan=False, separators=(",", ":")) + "\n")
            self._fh.flush()

    def event(self, name: str, **fields: object) -> None:
        """An experiment event (a prefill injected, a phase started), stamped on both clocks."""
        self.write({"event": name, "t": round(time.perf_counter(), _ROUND), "t_wall": round(time.time(), 6), **fields})

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RecordSchemaError(ValueError):
    """A line of requests.jsonl that is JSON but not a request record this version reads
    (a missing field, a value of another type, an unknown fault kind): written by another
    version of the tool, or by another tool. Readers refuse the file rather than skip it."""


def parse_record_line(line: str) -> RequestRecord | None:
    """One line of requests.jsonl -> its record; None for a line that is not a JSON object
    (cut short by a kill mid-write, nested too deeply).

    Raises RecordSchemaError for a JSON object that is not a record: unlike a damaged line,
    that is a file of another schema, and skipping it would quietly empty what is read.
    """
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):  # ValueError covers JSONDecodeError
        return None
    return record_from_object(obj) if isinstance(obj, dict) else None


def record_from_object(obj: Mapping) -> RequestRecord:
    """A requests.jsonl line read as a JSON object -> its record; RecordSchemaError where it is not one."""
    try:
        return RequestRecord.from_dict(obj)
    except KeyError as exc:
        raise RecordSchemaError(f"no field {exc.args[0]!r}") from None
    except (ValueError, TypeError, AttributeError, OverflowError, RecursionError) as exc:
        raise RecordSchemaError(f"{type(exc).__name__}: {exc}") from None


@dataclass(frozen=True)
class RecordsRead:
    """The records of a requests.jsonl, and how its lines were read (`lines.skipped`: unreadable
    lines, counted, never dropped silently). Iterates over the records."""

    records: tuple[RequestRecord, ...]
    lines: LinesRead

    def __iter__(self) -> Iterator[RequestRecord]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)


def read_records(path: str | Path) -> RecordsRead:
    """The records of a requests.jsonl (or a run folder's), with the count of lines skipped.

    Read through `runfiles.read_parsed` (a plain file, never a link; a line cap; a line not wholly
    UTF-8 is unreadable): a line that cannot be read (cut short by a kill mid-write, say) is
    skipped and counted in `lines`; a line that is JSON but not a record of this version raises
    LineSchemaError naming it (a file of another schema is refused, not emptied);
    UnsafePathError (an OSError) for a link or a file that is not plain. The commands read a run
    folder through `llm_diagnose.diagnose.runfolder`, which calls this.
    """
    p = Path(path)
    if p.is_dir():
        p = p / REQUESTS_FILE
    records, lines = read_parsed(p, record_from_object)
    return RecordsRead(records, lines)
