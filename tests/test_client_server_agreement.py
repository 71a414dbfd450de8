"""Client against server (experiments.agreement): the rules that say which side to believe.

The server side is a stand-in with the two members `compare` reads (`available`,
`histogram_mean`); the real ServerDelta over real vLLM scrapes is exercised by the live
experiment tests. The records are real RequestRecords."""

from __future__ import annotations

from llm_diagnose.probes import quantities as Q
from llm_diagnose.probes.experiments import agreement as A
from llm_diagnose.probes.load.records import RequestRecord
from llm_diagnose.probes.warning_codes import WarningCode, coded


class _Server:
    available = True

    def __init__(self, **means: tuple[float, float]) -> None:
        self.means = means

    def histogram_mean(self, concept: str):
        return self.means.get(concept)


def _record(i: int, ttft: float, gap: float, tokens: int = 5) -> RequestRecord:
    times = tuple(ttft + k * gap for k in range(tokens))
    return RequestRecord(f"r{i}", "decode", "batch-1", "", "completions", 0.0, 0.0, event_times=times,
                         t_end=times[-1] + 0.001, finish_reason="length")  # fmt: skip


RECORDS = [_record(i, ttft=0.050, gap=0.010) for i in range(4)]


def test_client_and_server_that_agree_within_the_tolerance():
    server = _Server(ttft=(0.045, 4), itl=(0.0098, 16), e2e=(0.088, 4))
    pairs, skipped = A.compare(RECORDS, server)
    assert [p.concept for p in pairs] == ["ttft", "itl", "e2e"] and not skipped
    assert all(p.agree for p in pairs), [p.describe() for p in pairs]
    assert A.disbelieved(pairs, None, False) is None


def test_a_starved_client_that_disagrees_is_the_side_not_to_believe():
    server = _Server(ttft=(0.015, 4))  # the engine says 15 ms; the client saw 50 ms
    pairs, _ = A.compare(RECORDS, server)
    assert not pairs[0].agree
    starved = coded(WarningCode.CLIENT_STARVED, f"{Q.CLIENT_STARVED_WARNING} event-loop lag p99 40 ms")
    warning = A.disbelieved(pairs, starved, False)
    assert warning.startswith(Q.CLIENT_STARVED_WARNING) and "believe the server" in warning
    # a client that kept up: the path adds the difference; its ratios stand
    assert A.disbelieved(pairs, None, False) is None


def test_bundled_tokens_are_never_read_as_fast_decoding():
    server = _Server(itl=(0.030, 16))  # the engine's steps are 30 ms; the client's gaps say 10 ms
    pairs, _ = A.compare(RECORDS, server)
    warning = A.disbelieved(pairs, None, True)
    assert warning.startswith(Q.CLIENT_STARVED_WARNING) and "bundled" in warning


def test_other_traffic_on_the_server_is_not_compared():
    server = _Server(ttft=(0.015, 40))  # 40 first tokens against our 4 requests: someone else's
    pairs, skipped = A.compare(RECORDS, server)
    assert not pairs and "other traffic" in skipped


def test_the_run_level_ratio_pools_the_experiments():
    a = A.SideBySide("ttft", 0.050, 4, 0.040, 4)
    b = A.SideBySide("ttft", 0.150, 4, 0.040, 4)
    out = A.run_level({"decode": [a], "heterogeneity": [b]}, "test")
    m = out[Q.CLIENT_SERVER_TTFT_RATIO]
    assert m.value == (0.1 / 0.04) and m.warnings and "decode 1.25, heterogeneity 3.75" in m.note
