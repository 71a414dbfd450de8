"""A virtual clock for the scrape loop, shared by the tests that count pages."""

from __future__ import annotations

import asyncio


class VirtualClock:
    """Scrape cadence on virtual time: it moves only when the scraper sleeps until its next tick.

    A scrape on a busy host can take longer than the interval, and the scraper skips the ticks
    that passed (by design); tests that count pages must not depend on how loaded the host is.
    """

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)
