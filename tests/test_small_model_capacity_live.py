"""Capacity plans on a real server of tens of milliseconds per token (issue 24): `plan` from the
default `run --active` evidence, and `plan --active`, each checked by trials of its own on the same
server, in one test.

The server is the session's small-model vLLM CPU server (the recipe's 23 M "small" model, shared
with test_slow_server_live.py before and test_small_model_live.py after; file names sort so): about
20-30 ms per token at batch 1 on this 2-core host, where the tiny model's 2 ms batched nearly for
free. The procedure is benchmarks/bench_capacity_slow.py's `check_plans` (RESULTS.md, "Capacity
plans on a server of tens of ms per token"): a warm-up, `run --active` with its defaults, an SLO set
from that run's batch-1 gap (itl p50 at most 2.5x it, ttft p90 at most 40x it: the issue's objective
over its server's time per token), `plan`, `plan --active`, then the check.

The check is two trials per answer, not the benchmark's sweep: one at the answer / its bound must
hold the SLO, one at the answer x its bound must break it. Both hold exactly when the goodput a
sweep would find lies within the bound of the answer, in four trials instead of nine, and the trials
alternate low and high, so a slow spell of the host falls on both sides (a rising sweep puts it on
its highest rates: seen, the same rate and draws read 47 ms in plan --active and 76 ms a minute
later in the sweep). The bounds are the issue's: `plan` within 2x, `plan --active` within 1.5x,
neither above the engine's own ceiling.

The trace has 64 requests, not 32: a trial of 32 is about one batch on this server at its goodput,
and its ITL p50 stayed at 57-65 ms from 3.6 to 7.2 requests/s, so an objective near that plateau
held or broke by chance (the sweep's goodput moved 2.9 -> 7.2/s between two runs, and `plan` was
0.45x of it in one). Every trial's prompts carry a salt of their own (trace_workload's fresh_cache):
without it the server's prefix cache served 63% of the prompt tokens from the second trial on. The
run folders stay under the test's tmp_path.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import load_benchmark, small_server_flags
from tests.test_cli_run_demo import wait_idle

pytestmark = pytest.mark.real_engine

REQUESTS = 64  # per trial: the trace's requests, 200 prompt and 64 output tokens each (see the docstring)


def test_plans_hold_within_their_bounds_on_a_server_of_tens_of_ms(
    vllm_server_factory, small_model_dir, tmp_path, capsys
):
    server = vllm_server_factory(**small_server_flags(small_model_dir))
    bench = load_benchmark("bench_capacity_slow")
    results = bench.check_plans(server.url, small_model_dir, tmp_path / "capacity", requests=REQUESTS, verify="bracket")
    wait_idle(server.url)  # a trial cut at its deadline leaves aborted streams: the next module finds it idle
    (tmp_path / "results.json").write_text(json.dumps(results, indent=2, default=str))
    with capsys.disabled():
        bench.print_results(results, "small")
    said = json.dumps({k: results[k] for k in ("slo", "brackets", "checks")}, default=str)
    itl = json.loads((tmp_path / "capacity" / "run" / "evidence.json").read_text())["items"]
    batch1 = itl["decode.batch1_itl_p50_s"]["value"]
    # The regime the test is about: 18-29 ms measured here, the tiny model 2 ms. A CPU three times as
    # fast still passes; one where the small model decodes like the tiny one no longer tests a slow server.
    assert batch1 >= 0.005, batch1
    for name in ("plan", "plan --active"):
        check = results["checks"][name]
        assert results[name]["goodput_rps"] is not None, (name, said)  # an answer to check
        assert check["below_ceiling"], (name, results[name])
        assert check["within"], (name, results[name]["goodput_rps"], said)
