"""One scrape attempt, as the scrape loop, the window and its tally all hold it."""

from __future__ import annotations

from dataclasses import dataclass

from llm_diagnose.probes.metrics.exposition import Scrape

__all__ = ["ScrapeRecord"]


@dataclass(frozen=True)
class ScrapeRecord:
    """One scrape attempt: when, and either the parsed page or why there is none."""

    t_wall: float  # unix time (for reports and joining with other logs)
    t_mono: float  # monotonic clock (for rates: immune to NTP steps)
    scrape: Scrape | None = None
    error: str | None = None
    elapsed_s: float | None = None  # how long the GET took

    @property
    def ok(self) -> bool:
        return self.scrape is not None
