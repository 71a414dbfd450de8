"""The active budget: a hard bound on what the load driver may send, shared by all experiments.

Active probing puts load on someone's server, so the user's limits are not targets but
walls: no request is sent after `max_requests` have been, none after `max_seconds` have
passed (and streams still open then are cut by the client at that deadline), and requests
never start faster than `max_rps`. Every request that leaves the client goes through
`BudgetGuard.admit()` (a resend after a closed connection or a rejected optional field, and a
followed redirect, each count as one), which reserves its slot synchronously before waiting,
so concurrent experiments cannot overdraw.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ActiveBudget", "BudgetGuard", "RATE_MARGIN", "DEFAULT_MAX_RPS"]

# Starts are spaced this much wider than 1/max_rps, so that a server counting arrivals in any
# one-second window sees at most max_rps of them even when the network or a busy host delays
# one request a few milliseconds more than the next (2% of a second: 20 ms of slack per window).
RATE_MARGIN = 0.02

# The start rate `run --active` keeps to when --max-rps is not given: a guard for a server that
# serves others. The experiments' one-at-a-time phases start at most about 25 requests a second on
# the fastest server (prefix's 4-token answers), so they are not slowed; their bursts start within
# a fraction of their streams' time (heterogeneity's peers 0.06 s, the decode ladder's 8 and 32
# streams 0.16 and 0.65 s; its top on the default budget, about 100 streams, over about 2 s: the
# plan says starts are paced). A server sees at most 50 of these short requests (32-64 prompt
# tokens) in any second: 1,600-3,200 prompt tokens, one or two scheduler steps' worth (vLLM takes
# 2,048 or 8,192 a step), and the default budget of 200 requests lasts at least 4 s at that rate.
# A replay keeps its recorded timing (the recording's rate is what was asked for) unless given one.
DEFAULT_MAX_RPS = 50.0


@dataclass(frozen=True)
class ActiveBudget:
    """What the user allows: at most `max_requests`, within `max_seconds`, at most `max_rps` starts/s."""

    max_requests: int = 200
    max_seconds: float = 60.0
    max_rps: float | None = None

    def __post_init__(self) -> None:
        if self.max_requests < 1:
            raise ValueError("max_requests must be at least 1")
        if not (self.max_seconds > 0 and math.isfinite(self.max_seconds)):
            raise ValueError("max_seconds must be a positive number")
        if self.max_rps is not None and not (self.max_rps > 0 and math.isfinite(self.max_rps)):
            raise ValueError("max_rps must be a positive number")

    def describe(self) -> str:
        rate = f", at most {self.max_rps:g} requests/s" if self.max_rps else ""
        return f"at most {self.max_requests} requests within {self.max_seconds:g} s{rate}"


class BudgetGuard:
    """The running account of an ActiveBudget. One per run; experiments share it."""

    def __init__(self, budget: ActiveBudget, *, clock: Callable[[], float] = time.perf_counter) -> None:
        self.budget = budget
        self._clock = clock
        self.started = clock()
        self.deadline = self.started + budget.max_seconds
        self.sent = 0
        self.refused = 0
        self._last_start = -math.inf
        self._pace = asyncio.Lock()
        self._stopped: str | None = None

    # --- state ----------------------------------------------------------------------------
    @property
    def remaining_requests(self) -> int:
        return max(0, self.budget.max_requests - self.sent)

    @property
    def remaining_s(self) -> float:
        return max(0.0, self.deadline - self._clock())

    def exhausted(self) -> str | None:
        """Why nothing more may be sent, or None while the budget lasts."""
        if self._stopped:
            return self._stopped
        if self.sent >= self.budget.max_requests:
            return f"the budget of {self.budget.max_requests} requests is spent"
        if self._clock() >= self.deadline:
            return f"the budget of {self.budget.max_seconds:g} s is spent"
        return None

    def stop(self, reason: str) -> None:
        """Refuse every further request (the server stopped answering, the user interrupted)."""
        if self._stopped is None:
            self._stopped = reason

    # --- admission ------------------------------------------------------------------------
    async def admit(self) -> bool:
        """Take one request from the budget, waiting for the rate limit; False: do not send.

        Starts are serialised: each waits until (1 + RATE_MARGIN)/max_rps after the previous
        *actual* start, so a late wake-up (a busy host) never lets two requests start closer.
        """
        if self.exhausted():
            self.refused += 1
            return False
        self.sent += 1  # reserved before waiting: concurrent callers cannot overdraw
        if self.budget.max_rps:
            async with self._pace:
                target = self._last_start + (1.0 + RATE_MARGIN) / self.budget.max_rps
                if target >= self.deadline:
                    self.sent -= 1  # it would start after the deadline: give the slot back
                    self.refused += 1
                    return False
                while (wait := target - self._clock()) > 0:
                    await asyncio.sleep(wait)
                self._last_start = self._clock()
        # Stopped while waiting: the slot stays spent, nothing is sent.
        return not self._stopped

    def describe(self) -> str:
        used = self._clock() - self.started
        return f"{self.sent} of {self.budget.max_requests} requests sent in {used:.1f} of {self.budget.max_seconds:g} s"
