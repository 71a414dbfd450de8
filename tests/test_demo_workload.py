"""The demo's own workload: what it sends before it measures (pure: no server)."""

from __future__ import annotations


def test_the_demos_warm_up_has_the_workloads_shape_and_shares_none_of_its_prefixes():
    # A fresh server is warmed up before it is measured; what the warm-up leaves in a prefix cache
    # must not serve the recorded requests (exact prefixes, block by block from the first token).
    import os.path

    from llm_diagnose.diagnose.demo.workload import WARM_UP_REQUESTS, DemoWorkload

    for workload in (DemoWorkload(requests=32), DemoWorkload(requests=24, system_prompt="")):
        warm = workload.warm_up_workload()
        assert warm.requests == WARM_UP_REQUESTS and warm.concurrency == workload.concurrency
        recorded, warming = workload.specs(), warm.specs()
        longest = max(len(os.path.commonprefix([w.prompt, r.prompt])) for w in warming for r in recorded)
        assert longest < 10, longest  # at most "User " before the first differing character
        size = sum(len(s.prompt) for s in recorded) / len(recorded)
        assert abs(sum(len(s.prompt) for s in warming) / len(warming) - size) < 0.1 * size + 30
