"""Whether a predicted goodput is a sustained rate or the goodput of one batch of requests.

The plan's goodput is that of a trial: the workload's requests, sent once at Poisson arrivals.
Where most of a trial's requests are in flight together at its goodput, the trial is one batch
rather than a stream: its time per token is the step at about that many sequences whatever the
rate, so whether it meets the SLO hardly depends on the rate, and the goodput found says little
about a sustained one. Measured on a 23 M model's vLLM CPU server (issue 24): trials of 32
requests read an ITL p50 of 57-65 ms anywhere from 3.6 to 7.2 requests/s, so an objective of
55 ms broke at 3.2/s in one sweep and 65 ms held to 7.2/s in the next; the model fitted there
simulated the trials of 64 requests rising 33 -> 54 -> 72 ms over 3, 4 and 5/s, and trials of
128 rising past 140 ms at 5/s. A plan whose trial is one batch says so, and how long a trace
would make it a stream.
"""

from __future__ import annotations

__all__ = ["ONE_BATCH_FRACTION", "STREAM_FACTOR", "one_batch_note"]

ONE_BATCH_FRACTION = 0.5  # at least this share of the trial's requests in one step: one batch
STREAM_FACTOR = 4  # a trial of this many times the sequences it reaches is a stream


def one_batch_note(sequences: int, requests: int, *, measured: bool = False) -> str | None:
    """The plan's words where a trial of `requests` ran `sequences` in one step at its peak, at its
    goodput; None: a stream. `measured`: the trials were plan --active's, sized by --trial-requests."""
    if requests <= 0 or sequences < ONE_BATCH_FRACTION * requests:
        return None
    longer = STREAM_FACTOR * sequences
    remedy = (
        f"measure with --trial-requests {longer} or more (and a trace that long)"
        if measured
        else f"plan with a trace of at least {longer} requests"
    )
    return (
        f"at this goodput the trial of the workload's {requests} requests runs {sequences} of them in one step "
        "at its peak: it is about one batch, not a stream, so its goodput depends on its size and a sustained "
        f"stream of these requests may meet the SLO only at a lower rate; {remedy}"
    )
