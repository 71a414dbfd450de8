"""Client against server, the rule alone: when a client's mean latency and the engine's own
histogram mean over the same requests agree.

Pure (no HTTP, no event loop), so the gate and verify can apply it to two stored runs; the
live side (`llm_diagnose.probes.experiments.agreement`) applies it to each experiment's window.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TOLERANCE", "SLACK_S", "OTHER_TRAFFIC_FACTOR", "SideBySide", "others_counted"]

TOLERANCE = 0.25  # of the server's mean
SLACK_S = {"ttft": 0.020, "itl": 0.002, "e2e": 0.030}  # what loopback HTTP and the API server add
OTHER_TRAFFIC_FACTOR = 1.5  # server observations beyond this many times ours: someone else's requests


@dataclass(frozen=True)
class SideBySide:
    """One latency concept over one window: the client's mean beside the engine's."""

    concept: str  # "ttft", "itl", "e2e"
    client_mean_s: float
    client_n: int
    server_mean_s: float
    server_n: float

    @property
    def ratio(self) -> float:
        return self.client_mean_s / self.server_mean_s

    @property
    def agree(self) -> bool:
        return abs(self.client_mean_s - self.server_mean_s) <= (TOLERANCE * self.server_mean_s + SLACK_S[self.concept])

    def describe(self) -> str:
        return (
            f"{self.concept}: client mean {self.client_mean_s * 1e3:.1f} ms ({self.client_n}) vs server "
            f"{self.server_mean_s * 1e3:.1f} ms ({self.server_n:.0f}), "
            + ("agree" if self.agree else f"disagree beyond {TOLERANCE:.0%} + {SLACK_S[self.concept] * 1e3:g} ms")
        )


def others_counted(server_n: float, ours: int) -> bool:
    """Whether the engine's histogram counted far more requests than the client sent: other
    traffic shares it, so its mean is not of our requests and the two cannot be compared."""
    return server_n > OTHER_TRAFFIC_FACTOR * ours + 2
