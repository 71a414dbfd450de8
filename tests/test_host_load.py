"""Other processes on the server's host: measured from /proc, and judged by the gate and verify.

The /proc readers run against this machine's real /proc (a real listening socket, a real child
process) and against a hand-made /proc tree for what a real one cannot give on demand (a process
whose name holds spaces and parentheses, a PID namespace that hides the server)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from llm_diagnose.diagnose.compare.metric import compare_metric
from llm_diagnose.diagnose.compare.rules import MetricRule
from llm_diagnose.diagnose.compare.settings import CompareSettings
from llm_diagnose.diagnose.host_load import OTHER_LOAD_CHANGE_CORES, host_load_change
from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.host_cpu import (
    CLOCK_TICKS_PER_S,
    cpu_ticks_between,
    host_cpu_times,
    local_server_pids,
    processes_cpu,
    processes_cpu_ticks,
)
from llm_diagnose.probes.load.health import HOST_BUSY_FRACTION, MIN_SERVER_CORES, ClientHealth
from llm_diagnose.probes.results import Measurement
from tests.evidence_builders import PROV, build, sampled

linux_only = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")


# --- measured: /proc -------------------------------------------------------------------------------
@linux_only
def test_the_process_listening_on_a_port_and_its_children_are_the_server():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            pids = local_server_pids(port)
            assert os.getpid() in pids and child.pid in pids, pids
            assert os.getppid() not in pids  # the listener's parent is not part of the server
        finally:
            child.kill()
            child.wait(10)
    assert local_server_pids(port) == frozenset()  # nobody listens any more


def _burner(seconds: float) -> subprocess.Popen:
    code = f"import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass"
    return subprocess.Popen([sys.executable, "-c", code])


@linux_only
def test_cpu_ticks_of_a_busy_process_grow_with_its_work():
    burner = _burner(5)
    try:
        time.sleep(0.3)
        t0 = processes_cpu_ticks([burner.pid])
        time.sleep(0.5)
        t1 = processes_cpu_ticks([burner.pid])
    finally:
        burner.kill()
        burner.wait(10)
    # Spinning, it gets a core of its own on a quiet host and some share on a loaded one: its
    # ticks grow (how much depends on the host, which this test does not control).
    assert t1 > t0, (t0, t1)
    assert processes_cpu_ticks([burner.pid]) == 0.0  # reaped: gone from /proc, counts nothing


@linux_only
def test_the_host_counts_at_least_what_one_of_its_processes_used():
    burner = _burner(5)
    try:
        time.sleep(0.3)
        host0, ticks0 = host_cpu_times(), processes_cpu_ticks([burner.pid])
        time.sleep(0.5)
        ticks1, host1 = processes_cpu_ticks([burner.pid]), host_cpu_times()
    finally:
        burner.kill()
        burner.wait(10)
    assert host0 is not None and host1 is not None
    assert host1[0] - host0[0] >= (ticks1 - ticks0) - 2, (host0, host1, ticks0, ticks1)  # two ticks of rounding
    assert host1[1] - host0[1] >= 2 * 0.5 * CLOCK_TICKS_PER_S * 0.9  # all CPUs' ticks, not one's


def _fake_proc(root: Path, port: int, processes: dict[int, tuple[str, int, int, int]], sockets: dict[int, str]) -> Path:
    """A /proc with net/tcp listening on `port` (inode 4242) and `processes` {pid: (comm, ppid, utime, stime)};
    `sockets` {pid: link} are each process's fd 3."""
    (root / "net").mkdir(parents=True)
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    listen = f"   0: 0100007F:{port:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242\n"
    other = f"   1: 0100007F:{port + 1:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 77\n"
    (root / "net" / "tcp").write_text(header + listen + other)
    for pid, (comm, ppid, utime, stime) in processes.items():
        (root / str(pid) / "fd").mkdir(parents=True)
        fields = ["S", str(ppid)] + ["0"] * 9 + [str(utime), str(stime)] + ["0"] * 10
        (root / str(pid) / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")
        if pid in sockets:
            os.symlink(sockets[pid], root / str(pid) / "fd" / "3")
    return root


def test_the_server_tree_and_its_cpu_from_a_hand_made_proc(tmp_path):
    proc = _fake_proc(
        tmp_path / "proc",
        8000,
        {
            1: ("init", 0, 5, 5),
            100: ("python3 -m vllm (api) )", 1, 300, 50),  # a name with spaces and parentheses
            101: ("VLLM::EngineCore", 100, 900, 100),
            102: ("worker", 101, 40, 10),
            200: ("burner", 1, 1000, 0),  # another process on the host
            300: ("other server", 1, 7, 7),
        },
        {100: "socket:[4242]", 300: "socket:[77]", 200: "pipe:[4242]"},
    )
    pids = local_server_pids(8000, proc)
    assert pids == {100, 101, 102}
    assert processes_cpu_ticks(pids, proc) == 300 + 50 + 900 + 100 + 40 + 10
    assert local_server_pids(9999, proc) == frozenset()  # nobody listens there


def test_a_server_in_another_pid_namespace_is_not_visible(tmp_path):
    # Listening (the socket is in this network namespace) but no process here holds it: a container.
    proc = _fake_proc(tmp_path / "proc", 8000, {1: ("init", 0, 1, 1)}, {})
    assert local_server_pids(8000, proc) == frozenset()
    assert local_server_pids(8000, tmp_path / "nothing") == frozenset()  # no /proc at all


def test_ticks_between_snapshots_survive_processes_that_start_end_or_reuse_a_pid():
    start = {10: (500, 1000.0), 11: (501, 200.0), 12: (502, 50.0)}
    end = {
        10: (500, 1100.0),  # alive throughout: its growth, 100
        11: (900, 30.0),  # the pid now belongs to a process started later: all of its 30
        13: (950, 20.0),  # started in between: all of its 20
    }  # 12 ended in between: its last ticks left with it
    assert cpu_ticks_between(start, end) == 150.0
    assert cpu_ticks_between({10: (500, 1000.0)}, {10: (500, 990.0)}) == 0.0  # never below zero


def test_the_client_reports_other_processes_only_where_it_saw_the_server():
    seen = ClientHealth(10.0, (0.001,) * 10, 3.0, 0, 0.0, 0.99, 2, True, server_cores=1.2, other_cores=0.5)
    ms = seen.measurements("test")
    assert ms[Q.CLIENT_HOST_OTHER_CORES].value == 0.5 and "and its children: 1.20 cores" in (
        ms[Q.CLIENT_HOST_OTHER_CORES].note or ""
    )
    assert "0.50 cores used by other processes" in seen.describe()
    unseen = ClientHealth(10.0, (0.001,) * 10, 3.0, 0, 0.0, 0.99, 2, True)
    assert Q.CLIENT_HOST_OTHER_CORES not in unseen.measurements("test")


# --- judged: the gate and verify ---------------------------------------------------------------------
def _run(median: float, other_cores: float | None, busy: float = 1.0, seed: int = 0):
    items = {"requests.tpot_p50_s": sampled(list(np.random.default_rng(seed).lognormal(np.log(median), 0.1, 32)), "s")}
    if other_cores is not None:
        items[Q.CLIENT_HOST_OTHER_CORES] = Measurement(other_cores, "cores", PROV)
        items[Q.CLIENT_HOST_BUSY] = Measurement(busy, "fraction", PROV)
    return build(items)


TPOT = MetricRule("requests.tpot_p50_s", "lower", 0.10)


def test_a_slowdown_while_other_processes_took_the_cpu_is_not_the_change():
    # Seen in CI: the demo's second server decoded 29% slower per token, with its cache working.
    o = compare_metric(TPOT, _run(0.0032, 0.02, 0.93, 1), _run(0.0041, 0.95, 1.0, 2), CompareSettings())
    assert o.verdict == "inconclusive", o
    assert "other processes on the server's host used 0.02 cores during the baseline and 0.95" in o.detail
    assert "rerun both on a quiet host" in o.detail and o.interval is not None and o.interval[0] > 0.1


def test_an_improvement_because_the_others_stopped_is_not_the_change_either():
    o = compare_metric(TPOT, _run(0.0041, 0.95, 1.0, 1), _run(0.0032, 0.02, 0.93, 2), CompareSettings())
    assert o.verdict == "inconclusive" and "busy in the baseline" in o.detail, o


@pytest.mark.parametrize(
    "base, cur, why",
    [
        ((0.02, 0.93), (0.02 + OTHER_LOAD_CHANGE_CORES * 0.9, 1.0), "too small a change"),
        ((0.02, 0.5), (1.5, HOST_BUSY_FRACTION - 0.01), "spare cores left: others took nothing from the server"),
        ((None, 1.0), (0.95, 1.0), "not measured in one run: nothing is known"),
    ],
)
def test_the_verdict_stands_where_the_host_did_not_change_under_the_server(base, cur, why):
    o = compare_metric(TPOT, _run(0.0032, base[0], base[1], 1), _run(0.0041, cur[0], cur[1], 2), CompareSettings())
    assert o.verdict == "regression", (why, o)


def test_a_metric_that_is_not_a_time_ignores_the_host():
    rule = MetricRule(Q.PREFIX_HIT_RATE, "higher", tolerance_abs=0.05)

    def run(hit_rate: float, other: float):
        return build(
            {
                Q.PREFIX_HIT_RATE: Measurement(hit_rate, "fraction", PROV),
                Q.CLIENT_HOST_OTHER_CORES: Measurement(other, "cores", PROV),
                Q.CLIENT_HOST_BUSY: Measurement(1.0, "fraction", PROV),
            }
        )

    base, cur = run(0.9, 0.0), run(0.1, 1.0)
    assert host_load_change(base, cur) is not None
    assert compare_metric(rule, base, cur, CompareSettings()).verdict == "regression"


def _window(target, seconds: float = 1.0):
    import asyncio

    from llm_diagnose.probes.load.health import HealthWindow

    async def run():
        async with HealthWindow(lambda: (0, 0.0), target) as w:
            await asyncio.sleep(seconds)
        return w.health

    return asyncio.run(run())


@linux_only
def test_a_window_tells_the_servers_cpu_from_another_process():
    # Two real spinning processes: one plays the server (its pid as the port's listener), the other
    # is someone else on the host.
    from llm_diagnose.probes.load.health import TargetHost

    server, other = _burner(5), _burner(5)
    try:
        time.sleep(0.2)
        # What each really got, read independently around the window (a busy host gives them less;
        # the attribution must follow whatever they got).
        t0, before = time.perf_counter(), processes_cpu([server.pid, other.pid])
        health = _window(TargetHost(True, frozenset({server.pid}), "burner"))
        after, elapsed = processes_cpu([server.pid, other.pid]), time.perf_counter() - t0
    finally:
        for p in (server, other):
            p.kill()
            p.wait(10)

    def cores(pid: int) -> float:
        return (after[pid][1] - before[pid][1]) / CLOCK_TICKS_PER_S / elapsed

    assert health is not None and health.server_cores is not None and health.other_cores is not None
    # Ticks are 10 ms: 0.05 cores of rounding over about a second, and the window is a little shorter.
    tolerance = 0.05 + 0.1 * cores(server.pid)
    assert abs(health.server_cores - cores(server.pid)) <= tolerance, (health.describe(), cores(server.pid))
    assert health.other_cores >= cores(other.pid) - 0.05 - 0.1 * cores(other.pid), (
        health.describe(),
        cores(other.pid),
    )  # other processes: this one, and whatever else ran on the host


@linux_only
def test_a_listener_that_does_no_work_is_no_server_to_subtract():
    # A port forwarder or proxy on the port uses next to no CPU: then "other processes" would hold
    # the engine itself, so the figure is not given (the server's own CPU still is).
    from llm_diagnose.probes.load.health import TargetHost

    idle, busy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]), _burner(5)
    try:
        time.sleep(0.3)
        health = _window(TargetHost(True, frozenset({idle.pid}), "sleep"), 0.6)
    finally:
        for p in (idle, busy):
            p.kill()
            p.wait(10)
    assert health is not None and health.server_cores is not None and health.server_cores < MIN_SERVER_CORES
    assert health.other_cores is None and Q.CLIENT_HOST_OTHER_CORES not in health.measurements("test")


def test_timed_keys_are_the_servers_times_rates_and_queues():
    from llm_diagnose.diagnose.compare.request_measurements import REQUEST_FAILED_FRACTION
    from llm_diagnose.diagnose.compare.rules import DEFAULT_METRICS
    from llm_diagnose.diagnose.host_load import host_timed

    # Of the gate's defaults, everything but memory, capacity, hit rate and acceptance moves with the
    # CPU the server gets (preemptions too: a slower server holds more requests at once).
    untimed = {r.key for r in DEFAULT_METRICS if not host_timed(r.key)}
    # Failed requests are not a time: a server that fails what it is sent fails it on a quiet host too.
    assert untimed == {
        Q.DEVICE_FREE_FRACTION,
        Q.KV_CAPACITY_TOKENS,
        Q.PREFIX_HIT_RATE,
        Q.SPEC_ACCEPTANCE_RATE,
        Q.SPEC_ACTIVE_ACCEPTANCE_RATE,  # the speculative-decoding experiment's, beside the window's
        REQUEST_FAILED_FRACTION,
    }
    for key in (Q.WAITING_MEAN, Q.RUNNING_MEAN, "forward.decode_step_p50_s", Q.SPEC_TOKENS_PER_S):
        assert host_timed(key), key
    for key in (Q.PREFIX_HIT_RATE, Q.KV_CAPACITY_TOKENS, Q.DECODE_TIME_SHARE, "requests.decode_tokens",
                Q.CLIENT_LOOP_LAG_P99, Q.CLIENT_SERVER_ITL_RATIO):  # fmt: skip
        assert not host_timed(key), key
