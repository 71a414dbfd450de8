"""The driver: sends requests through the budget, at their times, and keeps every record.

`Driver` is what experiments talk to. It owns the bookkeeping that must be the same for
all of them: every request that leaves passes the BudgetGuard (a resend or a followed
redirect too: the client asks `admit_again`); every record (completed, faulted or
cancelled) is appended to requests.jsonl the moment it exists; a server that stops answering
(several refused or dropped connections in a row), or that redirects them instead of
answering, stops the whole run instead of burning the budget on it; and `stop_all` cancels
what is still in flight, which the client records as stopped-by-client rather than dropping.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import replace
from typing import Any, TypeVar

from llm_diagnose.probes.load.budget import BudgetGuard
from llm_diagnose.probes.load.client import StreamingClient
from llm_diagnose.probes.load.faults import FaultKind
from llm_diagnose.probes.load.pacing import ClosedLoop, arrival_offsets
from llm_diagnose.probes.load.records import JsonlWriter, RequestRecord, RequestSpec
from llm_diagnose.probes.load.workloads import Workload

__all__ = ["Driver", "SERVER_GONE_AFTER"]

SERVER_GONE_AFTER = 3  # refused/dropped connections in a row before the server counts as gone
_GONE_FAULTS = frozenset({FaultKind.UNREACHABLE, FaultKind.CONNECTION_LOST, FaultKind.TIMEOUT_CONNECT})
_T = TypeVar("_T")  # what a tracked coroutine returns


class Driver:
    """Sends RequestSpecs through one client under one budget; collects their records."""

    def __init__(self, client: StreamingClient, guard: BudgetGuard, requests_out: JsonlWriter | None = None) -> None:
        self.client = client
        self.guard = guard
        self.requests_out = requests_out
        self.records: list[RequestRecord] = []
        self._attempt_start = 0  # records before this index belong to an abandoned attempt
        self.attempt = 1
        self.not_sent = 0
        self.server_gone: str | None = None
        self._streak = 0
        self._tasks: set[asyncio.Task] = set()
        self._on_sent: dict[str, Callable[[float], None]] = {}
        client.on_record = self._on_record
        client.on_send = self._on_send
        client.admit_again = self._admit_again

    async def _admit_again(self) -> str | None:
        """The budget's word on a request leaving once more: None, or why it may not."""
        if await self.guard.admit():
            return None
        return self.guard.exhausted() or "it would start after the budget's deadline"

    def _on_send(self, spec: RequestSpec, t_send: float) -> None:
        hook = self._on_sent.get(spec.request_id)
        if hook is not None:
            hook(t_send)

    def _on_record(self, record: RequestRecord) -> None:
        self.records.append(record)
        if self.requests_out is not None:
            self.requests_out.write(record.to_dict())
        if record.fault in _GONE_FAULTS or record.fault is FaultKind.REDIRECTED:
            self._streak += 1
            if self._streak >= SERVER_GONE_AFTER and self.server_gone is None:
                what = (
                    "the server redirects requests instead of answering them"
                    if record.fault is FaultKind.REDIRECTED
                    else "the server stopped answering"
                )
                self.server_gone = (
                    f"{what}: {self._streak} requests in a row failed ({record.fault.value}: {record.fault_detail})"
                )
                self.guard.stop(self.server_gone)
        elif record.http_status is not None:
            self._streak = 0

    # --- sending ----------------------------------------------------------------------------
    async def send(
        self, spec: RequestSpec, *, at: float | None = None, on_sent: Callable[[float], None] | None = None
    ) -> RequestRecord | None:
        """Send `spec` at perf_counter time `at` (now if None); None when the budget refuses it.

        `on_sent(t_send)` runs when the request is handed to the connection, after any wait for
        the budget's rate or concurrency, so an event written there carries the real send time.
        """
        if at is not None:
            if at >= self.guard.deadline:
                self.not_sent += 1
                return None
            delay = at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        if not await self.guard.admit():
            self.not_sent += 1
            return None
        if self.attempt > 1:
            spec = replace(spec, request_id=self.attempt_id(spec.request_id))
        if on_sent is None:
            return await self.client.send(spec, deadline=self.guard.deadline)
        self._on_sent[spec.request_id] = on_sent
        try:
            return await self.client.send(spec, deadline=self.guard.deadline)
        finally:
            self._on_sent.pop(spec.request_id, None)

    def start(self, spec: RequestSpec, *, at: float | None = None) -> asyncio.Task:
        """`send` as a task the driver tracks (stop_all cancels it)."""
        return self.start_coroutine(self.send(spec, at=at))

    async def stop_all(self, reason: str) -> None:
        """Cancel every request still in flight; each is recorded as stopped by the client."""
        tasks = [t for t in self._tasks if not t.done()]
        for t in tasks:
            t.cancel(reason)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def gather(self, tasks: Iterable[asyncio.Task]) -> list[RequestRecord]:
        """Wait for `tasks`; the records of those that completed sending (cancelled ones are in
        `records_of`, which is where analyses should look)."""
        results = await asyncio.gather(*tasks, return_exceptions=True)
        return [r for r in results if isinstance(r, RequestRecord)]

    def begin_attempt(self) -> int:
        """Start a fresh attempt: `records_of` forgets what came before (an experiment repeated
        because its first try ran while the client was starved). Returns how many records the
        earlier attempts left behind; they stay in `records` and in requests.jsonl."""
        self._attempt_start = len(self.records)
        self.attempt += 1
        return self._attempt_start

    def first_attempt(self) -> None:
        """A new experiment starts at attempt 1: its ids carry no suffix (a repeat of the one
        before does not rename the ones after it)."""
        self.attempt = 1

    def attempt_id(self, request_id: str) -> str:
        """The id a request goes out under: unique across attempts (`-try2` on a repeat's)."""
        suffix = f"-try{self.attempt}"
        return request_id if self.attempt == 1 or request_id.endswith(suffix) else request_id + suffix

    def records_of(self, experiment: str, phase: str | None = None) -> list[RequestRecord]:
        """Every record of an experiment (or one phase of it) in the current attempt, cancelled ones included."""
        return [
            r
            for r in self.records[self._attempt_start :]
            if r.experiment == experiment and (phase is None or r.phase == phase)
        ]

    # --- whole workloads ----------------------------------------------------------------------
    async def run(self, workload: Workload, *, until: float | None = None) -> list[RequestRecord]:
        """Run a workload at its pacing; stop launching at `until` (perf_counter), then wait."""
        if isinstance(workload.pacing, ClosedLoop):
            return await self._closed_loop(workload.specs, workload.pacing.concurrency, until)
        t0 = time.perf_counter()
        offsets = arrival_offsets(workload.pacing, len(workload.specs))
        tasks = [
            self.start(spec, at=t0 + off)
            for spec, off in zip(workload.specs, offsets)
            if until is None or t0 + off < until
        ]
        self.not_sent += len(workload.specs) - len(tasks)
        return await self.gather(tasks)

    async def _closed_loop(
        self, specs: tuple[RequestSpec, ...], concurrency: int, until: float | None
    ) -> list[RequestRecord]:
        queue = list(reversed(specs))
        out: list[RequestRecord] = []

        async def worker() -> None:
            while queue and (until is None or time.perf_counter() < until):
                record = await self.send(queue.pop())
                if record is None:
                    return  # budget spent: the other workers will find it spent too
                out.append(record)

        workers = [self.start_coroutine(worker()) for _ in range(min(concurrency, len(specs)))]
        await asyncio.gather(*workers, return_exceptions=True)
        self.not_sent += len(queue)
        return out

    def start_coroutine(self, coro: Coroutine[Any, Any, _T]) -> asyncio.Task[_T]:
        """Track an arbitrary coroutine that sends (a closed-loop worker, a steady stream)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task
