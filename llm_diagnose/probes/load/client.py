"""The streaming client: send one OpenAI-compatible request, record every token's arrival.

Built on llm_diagnose/probes/http.py's session (API key from the environment, no proxies, redacted
errors). The hot path is kept short because the client must not be what it measures:

- the body is serialised once, before the clock starts;
- each socket read is timestamped *before* it is parsed, and every event in that read gets
  that timestamp (they did arrive together; parsing later must not stretch the gaps);
- SSE is split on bytes (llm_diagnose/probes/load/sse.py), and the JSON of each event is decoded once;
- nothing is printed or logged per token; the per-event parsing time is summed so the client
  can report its own overhead (`handling_s`), and HealthWindow watches the event loop.

Every request produces exactly one RequestRecord, whether it completed, failed, timed out or
was cancelled by the driver; `on_record` sees it as soon as it exists (requests.jsonl), and
`on_send` sees the moment each attempt is handed to the connection (the record's `t_send`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import math
import resource
import socket
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

import aiohttp

from llm_diagnose.probes.http import (
    REDACTED,
    REDIRECT_STATUSES,
    RedirectRefused,
    api_key_from_env,
    follow_redirect,
    make_session,
    normalize_base_url,
    redact_url,
)
from llm_diagnose.probes.load.faults import FaultKind, classify_exception, classify_status
from llm_diagnose.probes.load.http_phases import PhaseClock, phase_trace_config
from llm_diagnose.probes.load.records import ENDPOINT_PATHS, OPTIONAL_EXTENSIONS, RequestRecord, RequestSpec
from llm_diagnose.probes.load.sse import DONE, SSEDecoder, plain_token_text, read_chunk

__all__ = [
    "StreamTimeouts",
    "StreamingClient",
    "is_local_target",
    "DEFAULT_MAX_STREAMS",
    "STALL_S",
    "STALL_GAP_FACTOR",
    "NO_PROGRESS_S",
    "NO_PROGRESS_TTFT_FACTOR",
]

DEFAULT_MAX_STREAMS = 1024  # the client holds at least 1,000 concurrent streams
_FD_HEADROOM = 128  # descriptors beyond the streams: the event loop, files, the scraper
_ERROR_BODY_BYTES = 2048
_JSON_HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream"}
_WATCHDOG_CANCEL = "llm-diagnose: no token in time"  # the watchdog's cancel message, told apart from the driver's
# Progress is tokens. SSE comments (`: ping`), keep-alive bytes and chunks that carry no token
# (a role announcement, `{"choices":[]}`) reset none of the clocks below: a hung engine behind
# a live HTTP layer that pings every few seconds must not pass for a slow one.
#
# A stream the client stops (its phase is over, the budget's deadline came) that had delivered
# tokens and then no token this long, and for STALL_GAP_FACTOR times its own median gap, is
# recorded as stalled (a server fault), not as stopped by the client. The experiments end
# streams after 5-12 s, long before the 60 s idle timeout, so without this a hung engine read
# as "faults: none". 5 s is far past a healthy decode gap (5-100 ms) and past the decode stall a
# long prefill causes (up to a few seconds), which the interference experiment measures and must
# keep.
STALL_S = 5.0
STALL_GAP_FACTOR = 50.0
# Before its first token a stream is queueing or prefilling. Before the response headers that
# is all it can be: the idle timeout ends a hung one. vLLM and SGLang send the headers when they
# accept a request, so a stream whose headers came and then no token is queued or prefilling on
# a live engine, or held by a hung one. It is recorded as no-progress (a server fault) when it
# has had no token for StreamingClient.no_progress_bound_s since its headers AND the server sent
# no token on any other stream of this client for as long: a request queued behind streams that
# flow (a one-at-a-time server: the heterogeneity experiment reads such waits as lower bounds)
# is not the server's fault. The bound is the larger of
# - NO_PROGRESS_S (StreamTimeouts.no_progress_s): 5 s. A prefill of a few seconds, on a slow
#   server with nothing else decoding, stays under it; the experiments' time caps (5-15 s) are
#   over it, so a hung engine shows as no-progress in their streams instead of "faults: none";
# - NO_PROGRESS_TTFT_FACTOR (4) times the slowest first token this client has received (from
#   send, whatever became of the stream): what the run has learnt of this server's queueing and
#   prefill, including queueing behind other clients' traffic, which the client cannot see.
# The watchdog ends such a stream when the bound is hit; one the client ends first is judged
# the same way.
NO_PROGRESS_S = 5.0
NO_PROGRESS_TTFT_FACTOR = 4.0


@dataclass(frozen=True)
class StreamTimeouts:
    """Per-request limits. `idle_s` covers the wait for the first token as well as the gaps;
    every limit counts tokens, not bytes (comments and keep-alives are not progress)."""

    connect_s: float = 5.0
    idle_s: float = 60.0  # a long prefill on a loaded server can take tens of seconds
    total_s: float = 600.0
    stall_s: float = STALL_S  # mid-stream silence that makes a stream the client stops a stalled one
    no_progress_s: float = NO_PROGRESS_S  # the floor of the no-progress bound (see NO_PROGRESS_S)


def is_local_target(base_url: str) -> bool:
    """Whether the server runs on this host (then client and server share its CPUs)."""
    host = urlsplit(base_url).hostname or ""
    if host in ("localhost", socket.gethostname()):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _raise_fd_limit(wanted: int) -> None:
    # 1,000 streams need 1,000 sockets; many systems start processes at a soft limit of 1024.
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < wanted:
            target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        pass  # not permitted: the streams beyond the limit will fail as client errors, visibly


_allocator_ready = False


def _raise_mmap_threshold() -> None:
    """Make glibc serve asyncio's 256 KiB receive buffers from the heap instead of mmap.

    asyncio's socket transport receives into a fresh 256 KiB bytes object on every read
    (selector_events max_size). glibc hands out blocks of 128 KiB and more with mmap, and
    gives them back with munmap, until a freed mmapped block raises its dynamic threshold
    (mallopt(3), M_MMAP_THRESHOLD). Until then every socket read pays an mmap/munmap pair
    and fresh page faults: measured at 64 paced streams, 24 us of client CPU per token
    against 15 us once the threshold is raised. Freeing one 1 MiB block raises it. (A
    process that imported torch has done so already, which is why vLLM's benchmark client
    never pays it.) Harmless elsewhere: it is one allocation.
    """
    global _allocator_ready
    if not _allocator_ready:
        block = bytearray(1 << 20)
        del block
        _allocator_ready = True


def _error_summary(body: bytes, secret: str | None) -> str:
    """One line from an error body, with our API key scrubbed if the server echoed it back."""
    text = body.decode("utf-8", errors="replace").strip()
    if secret:
        text = text.replace(secret, REDACTED)
    try:
        obj = json.loads(text)
        if isinstance(obj, dict):
            err = obj.get("error", obj)
            msg = err.get("message") if isinstance(err, dict) else None
            text = str(msg or obj.get("message") or obj.get("detail") or text)
    except ValueError:
        pass
    text = " ".join(text.split())[:200]
    return text.replace(secret, REDACTED) if secret else text


class StreamingClient:
    """An async streaming client for one server: `async with StreamingClient(url, model) as c`.

    `send(spec)` never raises for a failed request (the record says what failed); it raises
    only CancelledError, after recording the request as stopped by the client.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        max_streams: int = DEFAULT_MAX_STREAMS,
        timeouts: StreamTimeouts = StreamTimeouts(),
        api_key: str | None = "env",
        on_record: Callable[[RequestRecord], None] | None = None,
        keep_text: bool = False,
        on_send: Callable[[RequestSpec, float], None] | None = None,
    ) -> None:
        self.base_url = normalize_base_url(base_url)
        self.source = redact_url(self.base_url)
        self.model = model
        self.max_streams = max_streams
        self.timeouts = timeouts
        self.on_record = on_record
        self.on_send = on_send
        # on_body(spec, url, body): each request body as it leaves, every attempt (inputs.jsonl)
        self.on_body: Callable[[RequestSpec, str, bytes], None] | None = None
        self.keep_text = keep_text  # benchmarks only: the text is never written to requests.jsonl
        self._api_key = api_key
        self._secret: str | None = None  # the key itself, only to scrub it from text a server sends back
        self._session: aiohttp.ClientSession | None = None
        self._urls = {kind: self.base_url + path for kind, path in ENDPOINT_PATHS.items()}
        # No sock_read: aiohttp re-arms that timer on every socket read, which at 1,000 streams
        # delays every read (measured: p99 timing error 500-800 ms against 60-85 ms without).
        # One watchdog task checks all streams' last read instead (`_watch_idle`).
        self._timeout = aiohttp.ClientTimeout(total=timeouts.total_s, sock_connect=timeouts.connect_s)
        self._streams: dict[asyncio.Task, _Stream] = {}
        self._watchdog: asyncio.Task | None = None
        self.events_parsed = 0
        self.handling_s = 0.0
        self.in_flight = 0
        self.peak_in_flight = 0
        self.sent = 0
        self.texts: dict[str, str] = {}
        self.unsupported: set[str] = set()  # optional extensions this server rejected
        self.negotiated: list[str] = []  # what was dropped, and why
        self.resent_stale = 0  # requests sent again after a kept-alive connection closed under them
        self.attempts = 0  # POSTs that left this client: first sends, resends and followed redirects
        self.redirects_followed = 0
        # What the no-progress rule knows of this server (see NO_PROGRESS_S): the slowest first
        # token any stream received (seconds from its send), and when the last token of a
        # finished stream arrived (perf_counter; live streams are read where they are).
        self.slowest_first_token_s = 0.0
        self._last_token_at = -math.inf
        # The budget's say on every POST beyond a request's first (a resend, a followed redirect):
        # None when it may leave, else why not. The Driver sets it to its BudgetGuard, so that
        # every request that leaves counts against --budget-requests and --max-rps. Unset (a
        # client used on its own, a demo), nothing limits it.
        self.admit_again: Callable[[], Awaitable[str | None]] | None = None

    async def __aenter__(self) -> StreamingClient:
        _raise_fd_limit(self.max_streams + _FD_HEADROOM)
        _raise_mmap_threshold()
        self._secret = api_key_from_env() if self._api_key == "env" else self._api_key
        self._session = make_session(
            timeout_s=self.timeouts.total_s,
            connect_timeout_s=self.timeouts.connect_s,
            connection_limit=self.max_streams,
            api_key=self._api_key,
            trace_configs=[phase_trace_config()],
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("StreamingClient is not open: use `async with StreamingClient(...)`")
        return self._session

    def counters(self) -> tuple[int, float]:
        """Running totals (token events parsed, seconds spent parsing) for HealthWindow."""
        return self.events_parsed, self.handling_s

    def _timeout_until(self, deadline: float | None) -> aiohttp.ClientTimeout:
        if deadline is None:
            return self._timeout
        left = max(0.001, deadline - time.perf_counter())
        if left >= self.timeouts.total_s:
            return self._timeout
        return aiohttp.ClientTimeout(total=left, sock_connect=min(self.timeouts.connect_s, left))

    @contextmanager
    def no_progress_floor(self, seconds: float) -> Iterator[None]:
        """A higher floor for the no-progress bound inside the block: for the first request of a run,
        when nothing is known of the server yet and its own deadline bounds the wait (the
        calibration: on a fresh CPU vLLM serving four other streams, its first token took over
        NO_PROGRESS_S while every token flowed to the other client, which this client cannot see)."""
        before = self.timeouts
        self.timeouts = replace(before, no_progress_s=max(before.no_progress_s, seconds))
        try:
            yield
        finally:
            self.timeouts = before

    @property
    def no_progress_bound_s(self) -> float:
        """How long a stream may go from its response headers to its first token (see NO_PROGRESS_S)."""
        return max(self.timeouts.no_progress_s, NO_PROGRESS_TTFT_FACTOR * self.slowest_first_token_s)

    def _last_token(self) -> float:
        """When this server last delivered a token on any stream of this client (perf_counter)."""
        live = (s.t0 + s.times[-1] for s in self._streams.values() if s.times)
        return max(max(live, default=-math.inf), self._last_token_at)

    async def _watch_progress(self) -> None:
        """End streams that received no token for `idle_s` (the first token's wait included), and
        streams that made no progress after their headers (`_no_progress`)."""
        idle = self.timeouts.idle_s
        interval = max(0.01, min(1.0, idle / 4, self.timeouts.no_progress_s / 4))
        skipped = False
        while True:
            due = time.perf_counter() + interval
            await asyncio.sleep(interval)
            now = time.perf_counter()
            if now - due > interval and not skipped:
                # The event loop was held up: reads that came meanwhile may not be parsed yet,
                # so a stream would look silent that is not. Judge at the next tick.
                skipped = True
                continue
            skipped = False
            last_token: float | None = None  # computed once, and only when a stream needs it
            for task, stream in list(self._streams.items()):
                if stream.expired is not None:
                    continue
                quiet = now - (stream.t0 + stream.times[-1] if stream.times else stream.t0)
                if quiet > idle:
                    where = "between two tokens" if stream.times else "before the first token"
                    stream.expired = (
                        FaultKind.TIMEOUT_IDLE,
                        f"{self.source} sent no token {where} for {idle:g} s (idle timeout; comments and "
                        "keep-alives do not count)",
                    )
                elif not stream.times and stream.headers_at is not None:
                    if last_token is None:
                        last_token = self._last_token()
                    why = self._no_progress(stream, now, last_token)
                    if why is None:
                        continue
                    stream.expired = (FaultKind.NO_PROGRESS, why)
                else:
                    continue
                task.cancel(_WATCHDOG_CANCEL)

    def _no_progress(self, stream: _Stream, now: float, last_token: float | None = None) -> str | None:
        """Why a stream counts as no-progress (see NO_PROGRESS_S), or None. `last_token`: the
        client's `_last_token()`, when the caller has it already."""
        if stream.times or stream.headers_at is None:
            return None  # it had a token (a later silence is a stall), or no headers yet: queueing
        waited = now - stream.headers_at
        bound = self.no_progress_bound_s
        if waited < bound:
            return None
        if last_token is None:
            last_token = self._last_token()
        if now - last_token < bound:
            return None  # other streams got tokens meanwhile: this one is queued behind them
        elsewhere = (
            "nor on any other stream"
            if last_token == -math.inf
            else f"nor on any other stream for {now - last_token:.1f} s"
        )
        return (
            f"{self.source} sent its response headers and then no token for {waited:.1f} s, {elsewhere} "
            f"(no-progress bound {bound:.1f} s; comments and keep-alives do not count)"
        )

    def _silence(self, stream: _Stream, now: float) -> tuple[FaultKind, str] | None:
        """The server's fault in a stream the client is ending: a stall or no progress, or None."""
        stall = self._stall(stream, now)
        if stall is not None:
            return FaultKind.STALLED, stall
        why = self._no_progress(stream, now)
        return None if why is None else (FaultKind.NO_PROGRESS, f"{why}, when the client ended the stream")

    async def send(self, spec: RequestSpec, *, deadline: float | None = None) -> RequestRecord:
        """Send `spec`, stream the answer, return its record. `deadline` (perf_counter) caps it.

        The request may leave more than once, each time only if `admit_again` allows it: once
        more when a kept-alive connection was closed before any answer; again without an
        optional extension (`ignore_eos`, usage in the stream) that the server rejected by name
        (once per extension and client, noted in `negotiated`); and along a redirect within the
        target's origin (at most MAX_REDIRECTS; one off the origin is never followed, and is the
        record's fault). The record is the last attempt's.
        """
        self.sent += 1
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            url = self._urls[spec.endpoint]
            resent = False
            hops = 0
            while True:
                record, stream, cancelled = await self._attempt(spec, deadline, url, hops)
                if cancelled:
                    break
                if stream.redirect_to is not None:
                    again = "redirect"
                    if record.http_status in (301, 308) and self._urls[spec.endpoint] != stream.redirect_to:
                        self._urls[spec.endpoint] = stream.redirect_to  # moved for good: later requests go there
                        self.negotiated.append(
                            f"{self.source} moved {spec.endpoint} permanently to "
                            f"{redact_url(stream.redirect_to)} (same origin); sending there "
                            "from now on"
                        )
                elif not resent and stream.closed_unanswered:
                    # A kept-alive connection the server closed as we reused it: it never read the
                    # request. Sent once more, on a fresh connection; a server that is really gone
                    # fails that too, and the record says so.
                    again = "stale"
                else:
                    dropped = _rejected_extension(record, self.unsupported)
                    if dropped is None:
                        break
                    again = "extension"
                    self.unsupported.add(dropped)
                    self.negotiated.append(
                        f"{self.source} rejected {dropped!r} ({record.fault_detail}); sending without it from now on"
                    )
                try:
                    refused = None if self.admit_again is None else await self.admit_again()
                except asyncio.CancelledError as exc:  # stopped while waiting for the budget's rate
                    why = str(exc.args[0]) if exc.args else "cancelled by the load driver"
                    record = replace(
                        record,
                        fault=FaultKind.STOPPED_BY_CLIENT,
                        fault_detail=(f"{why} (while waiting to send it again after: {record.fault_detail})"),
                    )
                    cancelled = True
                    break
                if refused is not None:
                    record = replace(record, fault_detail=f"{record.fault_detail}; not sent again: {refused}")
                    break
                if again == "redirect" and stream.redirect_to is not None:
                    url, hops = stream.redirect_to, hops + 1
                    self.redirects_followed += 1
                elif again == "stale":
                    resent = True
                    self.resent_stale += 1
        finally:
            self.in_flight -= 1
        self.events_parsed += len(record.event_times)
        self.handling_s += record.handling_s
        if self.keep_text:
            escaped = b"".join(stream.texts)
            try:
                self.texts[spec.request_id] = json.loads(b'"' + escaped + b'"')
            except ValueError:  # a token with a broken escape: the text as it came
                self.texts[spec.request_id] = escaped.decode("utf-8", errors="replace")
        if self.on_record is not None:
            self.on_record(record)
        if cancelled:
            raise asyncio.CancelledError(record.fault_detail)
        return record

    def _stall(self, stream: _Stream, now: float) -> str | None:
        """Why a stream the client is stopping counts as stalled (see STALL_S), or None."""
        if not stream.times:
            return None
        silent = now - (stream.t0 + stream.times[-1])
        gaps = [b - a for a, b in zip(stream.times, stream.times[1:])]
        typical = statistics.median(gaps) if gaps else 0.0
        if silent < self.timeouts.stall_s or silent < STALL_GAP_FACTOR * typical:
            return None
        cadence = f", after gaps of {typical * 1000:.0f} ms (median)" if gaps else ""
        return (
            f"{self.source} stopped sending: nothing for {silent:.1f} s after {len(stream.times)} token "
            f"events{cadence}, when the client ended the stream"
        )

    async def _attempt(
        self, spec: RequestSpec, deadline: float | None, url: str, hops: int
    ) -> tuple[RequestRecord, _Stream, bool]:
        """One HTTP request to `url` (`hops` redirects followed so far): (its record, its stream
        state, whether it was cancelled)."""
        self.attempts += 1
        body = json.dumps(spec.payload(self.model, drop=self.unsupported), separators=(",", ":")).encode()
        if self.on_body is not None:
            self.on_body(spec, url, body)
        timeout = self._timeout_until(deadline)
        stream = _Stream(spec.endpoint == "chat", spec.continuous_usage, self.keep_text)
        clock = time.perf_counter
        status: int | None = None
        handling = 0.0
        started = cancelled = False
        task = asyncio.current_task()
        if task is None:  # asyncio runs every coroutine in a task; the idle watchdog cancels that task
            raise RuntimeError("a request must be sent from inside an asyncio task")
        if self._watchdog is None:
            self._watchdog = asyncio.get_running_loop().create_task(self._watch_progress())
        t_wall = time.time()
        t0 = stream.t0 = clock()
        phases = PhaseClock(t0)
        self._streams[task] = stream
        if self.on_send is not None:
            self.on_send(spec, t0)
        try:
            # Redirects are not left to aiohttp: it follows them to any host, turns the POST into
            # a GET on a 301/302, and every hop would leave uncounted by the budget.
            async with self.session.post(
                url, data=body, headers=_JSON_HEADERS, timeout=timeout, allow_redirects=False, trace_request_ctx=phases
            ) as resp:
                status = resp.status
                started = True
                stream.headers_at = clock()
                if status in REDIRECT_STATUSES:
                    self._redirect(stream, url, status, resp.headers.get("Location"), hops)
                elif status != 200:
                    snippet = _error_summary(await resp.content.read(_ERROR_BODY_BYTES), self._secret)
                    retry = resp.headers.get("Retry-After")
                    stream.fail(
                        classify_status(status),
                        f"HTTP {status}"
                        + (f" (Retry-After: {retry})" if retry else "")
                        + (f": {snippet}" if snippet else ""),
                    )
                else:
                    decoder = SSEDecoder()
                    consume = stream.consume
                    async for chunk in resp.content.iter_any():
                        t = clock()  # before parsing: every event in this read arrived by now
                        going = consume(decoder.feed(chunk), t - t0)
                        handling += clock() - t
                        if not going:
                            break
                    if stream.fault is None:
                        consume(decoder.flush(), clock() - t0)  # a last event without its blank line
                        stream.check_complete()
        except asyncio.CancelledError as exc:
            if stream.expired is not None and exc.args and exc.args[0] == _WATCHDOG_CANCEL:
                task.uncancel()  # our own timeout, not a cancellation of the caller
                stream.fail(*stream.expired)
            else:
                cancelled = True
                why = str(exc.args[0]) if exc.args else "cancelled by the load driver"
                silence = self._silence(stream, clock())
                if silence is not None:
                    stream.fail(silence[0], f"{silence[1]} ({why})")
                stream.fail(FaultKind.STOPPED_BY_CLIENT, why)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a recorded fault
            kind, detail = classify_exception(exc, url, started_streaming=started)
            stream.closed_unanswered = isinstance(exc, aiohttp.ServerDisconnectedError) and not started
            if kind is FaultKind.TIMEOUT_TOTAL and deadline is not None and clock() >= deadline - 1e-3:
                silence = self._silence(stream, clock())
                kind, detail = (
                    (silence[0], f"{silence[1]} (the budget's deadline)")
                    if silence is not None
                    else (FaultKind.STOPPED_BY_CLIENT, "stopped at the budget's deadline")
                )
            stream.fail(kind, detail)
        finally:
            self._streams.pop(task, None)
        if stream.times:  # what the no-progress rule learns of this server
            self._last_token_at = max(self._last_token_at, t0 + stream.times[-1])
            self.slowest_first_token_s = max(self.slowest_first_token_s, stream.times[0])
        t_end = clock() - t0
        usage = stream.usage or {}
        details = usage.get("prompt_tokens_details") or {}
        record = RequestRecord(
            request_id=spec.request_id,
            experiment=spec.experiment,
            phase=spec.phase,
            tag=spec.tag,
            endpoint=spec.endpoint,
            t_send=t0,
            t_send_wall=t_wall,
            event_times=tuple(stream.times),
            event_tokens=tuple(stream.event_tokens),
            t_end=t_end,
            http_status=status,
            prompt_tokens=_int_or_none(usage.get("prompt_tokens")),
            planned_prompt_tokens=spec.planned_prompt_tokens,
            completion_tokens=_int_or_none(usage.get("completion_tokens")),
            cached_tokens=_int_or_none(details.get("cached_tokens")) if isinstance(details, dict) else None,
            finish_reason=None if stream.fault is not None else stream.finish,
            fault=stream.fault,
            fault_detail=stream.detail,
            handling_s=handling,
            http=phases.phases() if phases.marks else None,
        )
        return record, stream, cancelled

    def _redirect(self, stream: _Stream, url: str, status: int, location: str | None, hops: int) -> None:
        """A 3xx answer: the attempt's fault, and where `send` may follow it (same origin only)."""
        try:
            target = follow_redirect(self.base_url, url, status, location, hops)
        except RedirectRefused as exc:
            stream.fail(FaultKind.REDIRECTED, str(exc))
            return
        if target is None:
            stream.fail(FaultKind.REDIRECTED, f"HTTP {status} without a Location header")
        elif status == 303:  # "see other": fetch a result with GET; a completion cannot follow it
            stream.fail(FaultKind.REDIRECTED, f"HTTP 303 to {redact_url(target)} asks for a GET: not followed")
        else:
            stream.fail(FaultKind.REDIRECTED, f"HTTP {status} to {redact_url(target)} (same origin)")
            stream.redirect_to = target


def _rejected_extension(record: RequestRecord, already: set[str]) -> str | None:
    """The optional extension a 400/422 answer names, if it names one we can do without."""
    if record.fault is not FaultKind.REJECTED:
        return None
    for name in OPTIONAL_EXTENSIONS:
        if name not in already and name in record.fault_detail:
            return name
    return None


class _Stream:
    """The state of one response while it streams (mutable, private to `send`)."""

    __slots__ = (
        "chat",
        "continuous",
        "keep_text",
        "times",
        "event_tokens",
        "texts",
        "finish",
        "usage",
        "seen_done",
        "used_tokens",
        "fault",
        "detail",
        "t0",
        "headers_at",
        "expired",
        "closed_unanswered",
        "redirect_to",
    )

    def __init__(self, chat: bool, continuous: bool, keep_text: bool) -> None:
        self.chat, self.continuous, self.keep_text = chat, continuous, keep_text
        self.times: list[float] = []
        self.event_tokens: list[int] = []
        self.texts: list[bytes] = []  # JSON-escaped pieces (keep_text only)
        self.finish: str | None = None
        self.usage: dict | None = None
        self.seen_done = False
        self.used_tokens = 0
        self.fault: FaultKind | None = None
        self.detail = ""
        self.t0 = 0.0  # perf_counter of the send; `times` count from it
        self.headers_at: float | None = None  # perf_counter when the response headers came
        # The server closed the connection before any answer (a kept-alive one, closed as reused).
        self.closed_unanswered = False
        self.expired: tuple[FaultKind, str] | None = None  # the watchdog ended it, and why
        self.redirect_to: str | None = None  # a same-origin Location that `send` may follow

    def fail(self, kind: FaultKind, detail: str) -> None:
        if self.fault is None:  # the first fault is the cause; later ones are its consequences
            self.fault, self.detail = kind, detail

    def consume(self, events: list[bytes], t_rel: float) -> bool:
        """Apply the events of one read, all arrived at `t_rel`; False: stop reading."""
        for data in events:
            if not self.chat:
                text = plain_token_text(data)
                if text is not None:  # the fast path: a plain token, no JSON parse needed
                    self.times.append(t_rel)
                    if self.keep_text:
                        self.texts.append(text)  # still JSON-escaped: decoded once, at the end
                    continue
            if data == DONE:
                self.seen_done = True
                continue
            try:
                obj = json.loads(data)
            except ValueError:  # JSONDecodeError, bytes that are not UTF-8, an integer of 5,000 digits
                self.fail(FaultKind.MALFORMED, f"event after {len(self.times)} tokens is not JSON: {data[:60]!r}")
                return False
            except RecursionError:  # json.loads stops past the interpreter's recursion limit (~1,000 deep)
                self.fail(
                    FaultKind.MALFORMED,
                    f"event after {len(self.times)} tokens nests JSON too deeply to read ({len(data)} bytes: "
                    f"{data[:20]!r}...)",
                )
                return False
            info = read_chunk(obj, self.chat)
            if info.malformed is not None:
                self.fail(
                    FaultKind.MALFORMED, f"event after {len(self.times)} tokens is not a stream chunk: {info.malformed}"
                )
                return False
            if info.error is not None:
                self.fail(FaultKind.STREAM_ERROR, f"error event in the stream: {info.error}")
                return False
            if info.usage:
                self.usage = info.usage
            if info.is_token:
                self.times.append(t_rel)
                if self.continuous and info.usage:
                    used = _int_or_none(info.usage.get("completion_tokens")) or 0
                    self.event_tokens.append(max(1, used - self.used_tokens))
                    self.used_tokens = used
                if self.keep_text:
                    self.texts.append(json.dumps(info.text)[1:-1].encode())
            if info.finish_reason is not None:
                self.finish = info.finish_reason
        return True

    def check_complete(self) -> None:
        """The body ended: without a finish reason or [DONE] the stream was cut off."""
        if self.finish is None and self.seen_done:
            self.finish = "unspecified"  # [DONE] without a reason: complete, reason unknown
        elif self.finish is None:
            self.fail(
                FaultKind.CUT_OFF,
                f"the stream ended after {len(self.times)} token events without a finish reason or [DONE]",
            )


def _int_or_none(value: object) -> int | None:
    """A count a server sent, or None where it sent something else (a string, inf, NaN: json.loads takes both)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value) if math.isfinite(value) else None
