"""How punctual a replay was: each request's send time against its recorded offset.

A replay is worth its arrival pattern: a burst recorded as eight requests at once must leave as
eight at once. The driver schedules every send on the absolute clock, so a late send does not
delay the ones after it; but a client that is not scheduled (a busy host: seen in CI, the event
loop stalled 1.8 s while the client used 0.05 cores) sends everything due during the stall at its
end, together. The replay measures that instead of assuming it kept time, and says so when it
did not: a latency measured under other arrivals is not the recorded workload's.

Lateness is taken against the most punctual request (the one sent earliest relative to its offset
counts as on time), since the clock's zero is the replay's first scheduled send.
"""

from __future__ import annotations

from collections.abc import Sequence

from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.load.health import STALL_S, ClientHealth
from llm_diagnose.probes.load.records import RequestRecord
from llm_diagnose.probes.results import Measurement, NotMeasured, Provenance, Result, percentile

__all__ = ["PUNCTUAL_MEDIAN_S", "PUNCTUAL_MAX_S", "send_lateness"]

PUNCTUAL_MEDIAN_S = 0.05  # a median send this late changes how requests overlap at ~10-100 ms latencies
PUNCTUAL_MAX_S = STALL_S  # one send this late is a stall, not jitter


def send_lateness(
    offsets_s: dict[str, float], records: Sequence[RequestRecord], health: ClientHealth | None, source: str
) -> dict[str, Result]:
    """`replay.send_lateness_p50_s` over the first send of each planned request id (resends and
    requests the budget left out do not count), warned when the replay did not keep time."""
    firsts: dict[str, float] = {}
    for r in records:
        if r.request_id in offsets_s and r.request_id not in firsts:
            firsts[r.request_id] = r.t_send - offsets_s[r.request_id]
    prov = Provenance(method="active-probe/replay", source=source)
    if not firsts:
        return {Q.REPLAY_SEND_LATENESS_P50: NotMeasured("no planned request was sent", "", prov)}
    zero = min(firsts.values())
    late = sorted(v - zero for v in firsts.values())
    median, p90, worst = percentile(late, 50), percentile(late, 90), late[-1]
    warnings: tuple[str, ...] = ()
    if median > PUNCTUAL_MEDIAN_S or worst > PUNCTUAL_MAX_S:
        # Why, where the client's health knows: starved against the punctuality the replay needs.
        stall = health.starved(PUNCTUAL_MEDIAN_S) if health is not None else None
        warnings = (
            f"the replay did not keep the recorded times (sends late by a median {median * 1e3:.0f} ms, at most "
            f"{worst * 1e3:.0f} ms): what it measured ran under other arrivals than the recorded ones"
            + (f"; {stall}" if stall else ""),
        )
    return {
        Q.REPLAY_SEND_LATENESS_P50: Measurement(
            median,
            "s",
            prov,
            samples=tuple(late),
            warnings=warnings,
            note=f"{len(late)} requests: p90 {p90 * 1e3:.1f} ms, max {worst * 1e3:.1f} ms after their recorded offsets",
        )
    }
