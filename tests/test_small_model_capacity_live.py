"""Capacity plans on a real server of tens of milliseconds per token (issue 24): `plan` from the
default `run --active` evidence, and `plan --active`, against an independent open-loop sweep of
the same trace on the same server, in one test.

The server is the session's small-model vLLM CPU server (the recipe's 23 M "small" model, shared
with test_slow_server_live.py before and test_small_model_live.py after; file names sort so): about
20-25 ms per token at batch 1 on this 2-core host, where the tiny model's 2 ms batched nearly for
free. The procedure is benchmarks/bench_capacity_slow.py's `check_plans` (the benchmark runs it on a
160 M model too; benchmarks/RESULTS.md, "Capacity plans on a slow server"): a warm-up, `run --active`
with its defaults, an SLO set from that run's batch-1 gap (itl p50 at most 2.5x it, ttft p90 at most
40x it: the issue's objective over its server's time per token), `plan`, `plan --active`, then the
sweep (Poisson rates x sqrt(2) from about four lone requests in flight, until two rates in a row
break, then two bisections between the last rate that held and the first that broke: the sweep's
goodput is within 2^(1/8) of its edge). The bounds are the issue's: `plan` within 2x of the sweep,
`plan --active` within 1.5x, neither above the engine's own ceiling. The run folders stay under the test's tmp_path.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.conftest import small_server_flags
from tests.test_cli_run_demo import wait_idle

pytestmark = pytest.mark.real_engine

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_capacity_slow.py"
REQUESTS = 32  # per trial and per sweep rate: the trace's requests, 200 prompt and 64 output tokens each
# The sweep starts at the rate of this many lone requests in flight (the run's calibration: a request
# of the trace's shape alone took about 1.55 s). Measured here: the sweep held at 1.3, 1.8, 2.6, 3.6
# and 5.2/s and broke at 7.3 and 10.3/s (goodput 5.2/s, about 8 lone requests' worth); the two rates
# below 2.6/s took 43 s and said nothing about the edge. A continuously batching server sustains
# more than four of its lone requests; a sweep that held nowhere fails the test, it is not skipped.
SWEEP_LONE_REQUESTS = 4.0


def _bench():
    spec = importlib.util.spec_from_file_location("bench_capacity_slow", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_plans_agree_with_an_independent_sweep_on_a_server_of_tens_of_ms(
    vllm_server_factory, small_model_dir, tmp_path, capsys
):
    server = vllm_server_factory(**small_server_flags(small_model_dir))
    bench = _bench()
    results = bench.check_plans(
        server.url, small_model_dir, tmp_path / "capacity", requests=REQUESTS, sweep_lone_requests=SWEEP_LONE_REQUESTS
    )
    wait_idle(server.url)  # a trial cut at its deadline leaves aborted streams: the next module finds it idle
    (tmp_path / "results.json").write_text(json.dumps(results, indent=2, default=str))
    with capsys.disabled():
        bench.print_results(results, "small")
    said = json.dumps({k: results[k] for k in ("slo", "swept_goodput_rps", "sweep", "checks")}, default=str)
    itl = json.loads((tmp_path / "capacity" / "run" / "evidence.json").read_text())["items"]
    batch1 = itl["decode.batch1_itl_p50_s"]["value"]
    # The regime the test is about: 18-27 ms measured here, the tiny model 2 ms. A CPU three times as
    # fast still passes; one where the small model decodes like the tiny one no longer tests a slow server.
    assert batch1 >= 0.005, batch1
    assert results["swept_goodput_rps"] is not None, said  # a rate held
    assert any(row["met"] is False for row in results["sweep"]), said  # and one above it broke: the edge
    for name in ("plan", "plan --active"):
        check = results["checks"][name]
        assert check["below_ceiling"], (name, results[name])
        assert check["within"], (name, results[name]["goodput_rps"], said)
