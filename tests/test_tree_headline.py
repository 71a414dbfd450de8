"""The headline never contradicts the path (issue 26, item 7).

On a ~25 ms server the headline read "no bottleneck found among the questions answered" while Q6
on the path said chunked prefill was not working (35x stalls, real there). Q6's answer sat at the
headline's confidence threshold, so its finding could not headline; the headline now names it and
says why it is not the headline. headline() is pure: these tests give it the answers and
recommendations the walk would.
"""

from __future__ import annotations

from llm_diagnose.diagnose.tree.diagnosis import Answer, Missing, Recommendation
from llm_diagnose.diagnose.tree.headline import headline

Q6_BROKEN = Recommendation(
    "chunked-prefill",
    "not-working",
    "Q6",
    "chunked prefill is on, yet streams still slow 35.0x during prefills: tune the chunk first",
)


def _answers(q6_confidence: float) -> dict[str, Answer]:
    q6 = Answer(
        "Q6",
        "Do prefill and decode contend?",
        "yes",
        q6_confidence,
        "streams slow 35x while prompts are prefilled",
        missing=(Missing("interference.itl_inflation", "one attempt only", "run --active again on a quieter host"),),
    )
    q3 = Answer("Q3", "Do short requests wait for long ones?", "no", 0.9, "continuous batching works")
    return {"Q3": q3, "Q6": q6}


def test_a_finding_under_the_headlines_confidence_is_named_not_denied():
    kind, subject, line = headline([Q6_BROKEN], _answers(0.45), [], least=0.5)
    assert (kind, subject) == ("none-found", "")
    assert line.startswith("no bottleneck found firmly enough to headline among the questions answered")
    assert "not the headline: Q6 found chunked-prefill not-working (chunked prefill is on" in line
    assert "confidence 0.45 is at or below the headline's 0.50" in line
    assert "to settle it: run --active again on a quieter host" in line


def test_the_same_finding_above_the_threshold_is_the_headline():
    kind, subject, line = headline([Q6_BROKEN], _answers(0.8), [], least=0.5)
    assert (kind, subject) == ("fix", "chunked-prefill") and "not the headline" not in line


def test_nothing_held_back_leaves_the_plain_none_found_line():
    kind, _, line = headline([], _answers(0.8), [], least=0.5)
    assert kind == "none-found" and line == "no bottleneck found among the questions answered"


def test_a_held_back_finding_is_named_even_when_nothing_counts_as_measured():
    weak = {"Q6": _answers(0.3)["Q6"]}
    kind, _, line = headline([Q6_BROKEN], weak, [], least=0.5)
    assert kind == "nothing-measured" and "not the headline: Q6 found chunked-prefill not-working" in line
