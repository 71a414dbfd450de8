"""Did the host change under the server between two runs? (pure; the gate's and verify's rule)

A server that shares its host with other processes gets less CPU when they run. The client's
latencies and the engine's own histograms then move together, so the client-against-engine
cross-check cannot see it; two runs compared across such a change read the host, not the
server's configuration. Seen in CI: the demo's second vLLM CPU server decoded 29% slower per
token ([+14%, +42%]) while its prefix cache did what it promised, and verify called the change
harmful.

The figure is `client.host_other_cores` (probes/load/health.py): the host's busy CPU minus the
server's processes and the client, steal included, measured where the server runs on the
client's host and its processes are visible. Where either run lacks it, this rule says nothing.

Rule: the runs differ when other processes used at least `OTHER_LOAD_CHANGE_CORES` more cores
in one run than in the other *and* that run's host was at least `HOST_BUSY_FRACTION` busy (with
spare cores left, other processes took nothing from the server). Then a timed metric's
regression or improvement is not the change's: inconclusive, rerun both on a quiet host.
"""

from __future__ import annotations

from llm_diagnose.diagnose.tree.evidence import Evidence
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.load.health import HOST_BUSY_FRACTION

__all__ = ["OTHER_LOAD_CHANGE_CORES", "SPEED_DEPENDENT", "host_load_change", "host_timed"]

# A fifth of a core taken from (or given back to) the server: on the 2-core hosts where a CPU
# engine uses every core, about a tenth of its CPU, the size of the gate's default tolerance.
# Measured beside the demo's vLLM CPU (1.7-1.8 cores of its own): quiet runs read 0.03 cores of
# other load; one process spinning through the run got 0.24 (vLLM's OpenMP threads spin too).
OTHER_LOAD_CHANGE_CORES = 0.2
# Counts that grow when the server slows at the same offered load (Little's law): verify judges
# claims on them (quantization's and scale-out's queue, paged attention's batch).
SPEED_DEPENDENT = frozenset({Q.WAITING_MEAN, Q.RUNNING_MEAN})


def host_timed(key: str) -> bool:
    """Whether `key` is a time or a rate of the server's work (or grows when the server slows):
    it moves with the CPU the server gets. The client's own figures are not the server's."""
    if key.startswith("client."):
        return False
    if key in SPEED_DEPENDENT:
        return True
    quantity = Q.describe(key)
    if quantity is not None:
        return quantity.unit in ("s", "1/s")
    return key.endswith(("_s", "_per_s"))  # the client's per-request latencies (requests.*_s), derived keys


def host_load_change(base: Evidence, cur: Evidence) -> str | None:
    """Why the two runs' hosts were not the same for the server (None: the same, or not known)."""
    b, c = base.measurement(Q.CLIENT_HOST_OTHER_CORES), cur.measurement(Q.CLIENT_HOST_OTHER_CORES)
    if b is None or c is None or abs(c.value - b.value) < OTHER_LOAD_CHANGE_CORES:
        return None
    busier, which = (cur, "the current run") if c.value > b.value else (base, "the baseline")
    busy = busier.measurement(Q.CLIENT_HOST_BUSY)
    if busy is None or busy.value < HOST_BUSY_FRACTION:
        return None
    return (
        f"other processes on the server's host used {b.value:.2f} cores during the baseline and {c.value:.2f} "
        f"during the current run, with the host's CPUs {busy.value:.0%} busy in {which}: the server got less "
        f"CPU in {which}, and its timings moved with the host, not only with its configuration"
    )
