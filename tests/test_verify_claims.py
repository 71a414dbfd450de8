"""The claims verify judges are the promises each technique's `expect` text makes: same keys,
same directions (the text is generated from the claims: this reads it back as a user would)."""

from __future__ import annotations

import re

import pytest

from llm_diagnose.diagnose.tree.techniques.catalogue import CATALOGUE
from llm_diagnose.diagnose.verify.claims import ADOPTION, CLAIMS, REFERENCES, SWITCHES, Claim
from llm_diagnose.diagnose.verify.judge import judge_interval
from llm_diagnose.probes import quantities as Q

_KEY = re.compile(r"\b[a-z_]+\.[a-z0-9_]+\b")
_WORD = {"up": "up", "down": "down", "below": "down", "stays >=": "at-least"}


def named_keys(text: str) -> list[str]:
    return [k for k in _KEY.findall(text) if k in Q.CATALOGUE]


def promised_direction(text: str, key: str) -> str:
    """The direction the text gives a key: "at equal KEY" is not-up, else the first direction word after it."""
    at = text.index(key)
    if text[:at].rstrip().endswith("at equal"):
        return "not-up"
    words = re.search(r"\b(up|down|below|stays >=)", text[at + len(key) :])
    assert words, (text, key)
    return _WORD[words.group(1)]


def test_every_technique_has_claims_and_every_claimed_technique_exists():
    assert set(CLAIMS) == set(CATALOGUE)
    assert set(ADOPTION.values()) - {""} <= set(CATALOGUE) and set(SWITCHES.values()) <= set(CATALOGUE)


@pytest.mark.parametrize("technique", sorted(CATALOGUE))
def test_the_expect_text_names_exactly_the_claimed_keys_and_their_directions(technique):
    text = CATALOGUE[technique].expect
    claims = CLAIMS[technique]
    named = named_keys(text)
    assert named, f"{technique}: its expect text names no evidence key"
    assert set(named) == {c.key for c in claims} | set(REFERENCES.get(technique, ())), (text, claims)
    for c in claims:
        assert promised_direction(text, c.key) == c.direction, (technique, c, text)
        assert c.key in Q.CATALOGUE
    assert not set(REFERENCES.get(technique, ())) & {c.key for c in claims}


def test_at_least_claims_carry_their_level_and_others_a_positive_effect():
    for claims in CLAIMS.values():
        for c in claims:
            if c.direction == "at-least":
                assert c.level is not None and f"{c.level:g}" in c.describe()
            else:
                assert c.min_effect > 0 and c.level is None


DOWN = Claim("latency.ttft_p50_s", "down", 0.10)
UP = Claim("prefix.hit_rate", "up", 0.05, relative=False)
NOT_UP = Claim("latency.ttft_p50_s", "not-up", 0.10)


@pytest.mark.parametrize(
    "claim, low, high, verdict",
    [
        (DOWN, -0.40, -0.30, "delivered"),
        (DOWN, -0.05, 0.04, "no-measurable-effect"),
        (DOWN, -0.10, 0.10, "no-measurable-effect"),  # on the bounds: within +-min_effect
        (DOWN, 0.20, 0.35, "made-it-worse"),
        (DOWN, -0.30, 0.05, "cannot-tell"),  # straddles the minimum effect
        (DOWN, -0.30, -0.05, "cannot-tell"),  # a real drop, maybe smaller than promised
        (UP, 0.10, 0.20, "delivered"),
        (UP, -0.20, -0.10, "made-it-worse"),
        (UP, 0.0, 0.0, "no-measurable-effect"),
        (NOT_UP, -0.05, 0.08, "delivered"),
        (NOT_UP, 0.15, 0.30, "made-it-worse"),
        (NOT_UP, 0.05, 0.15, "cannot-tell"),
    ],
)
def test_an_interval_is_judged_against_the_minimum_effect(claim, low, high, verdict):
    assert judge_interval(claim, low, high) == verdict


def test_a_client_change_the_engine_did_not_see_is_not_the_techniques_doing():
    """verify's claim follows the gate's cross-check: a TTFT the client saw 20x worse while the
    engine's own histogram did not move (the client starved in one run) is cannot-tell, not
    made-it-worse (test_change_verified_live: +137% in CI; here +2541% client, -20% engine)."""
    import numpy as np

    from llm_diagnose.diagnose.compare.settings import CompareSettings
    from llm_diagnose.diagnose.verify.judge import judge_claim
    from llm_diagnose.probes.results import Measurement, Summary
    from tests.evidence_builders import PROV, build, sampled

    def run(client_median: float, seed: int):
        rng = np.random.default_rng(seed)
        engine = Summary.from_samples(list(rng.lognormal(np.log(0.015), 0.3, 24)))
        return build(
            {
                "requests.ttft_p50_s": sampled(list(rng.lognormal(np.log(client_median), 0.3, 24)), "s"),
                Q.TTFT_P50: Measurement(engine.median, "s", PROV, summary=engine),
            }
        )

    r = judge_claim("prefix-caching", DOWN, run(0.020, 1), run(0.450, 2), CompareSettings())
    assert r.verdict == "cannot-tell", r
    assert "the engine's own" in r.basis and "in AFTER" in r.basis, r.basis


def test_values_without_samples_follow_the_host_rule_too():
    """A claim judged on plain values (no samples, no summaries: a passive run's gauge) that the
    gate withheld because the host changed under the server is cannot-tell, not made-it-worse."""
    from llm_diagnose.diagnose.compare.settings import CompareSettings
    from llm_diagnose.diagnose.verify.judge import judge_claim
    from llm_diagnose.probes.results import Measurement
    from tests.evidence_builders import PROV, build

    def run(ttft_s: float, other_cores: float):
        return build(
            {
                Q.TTFT_P50: Measurement(ttft_s, "s", PROV),
                Q.CLIENT_HOST_OTHER_CORES: Measurement(other_cores, "cores", PROV),
                Q.CLIENT_HOST_BUSY: Measurement(1.0, "fraction", PROV),
            }
        )

    r = judge_claim("prefix-caching", DOWN, run(0.020, 0.0), run(0.040, 1.0), CompareSettings())
    assert r.verdict == "cannot-tell" and "other processes on the server's host" in r.basis, r
    assert judge_claim("prefix-caching", DOWN, run(0.020, 0.0), run(0.040, 0.05), CompareSettings()).verdict == (
        "made-it-worse"
    )
