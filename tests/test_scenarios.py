"""The scenario corpus (tests/scenarios/): each situation gets the verdict a senior engineer gives."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.scenarios.catalogue import ALL
from tests.scenarios.model import check
from tests.scenarios.table import render, row

DOC = Path(__file__).resolve().parents[1] / "docs" / "scenarios.md"


# A known-wrong scenario states the right verdict and must still fail: strict xfail turns a fix
# into a failure, so the marker is removed when the case is fixed.
@pytest.mark.parametrize(
    "scenario",
    [pytest.param(s, marks=pytest.mark.xfail(strict=True, reason=s.known_wrong)) if s.known_wrong else s for s in ALL],
    ids=[s.id for s in ALL],
)
def test_scenario(scenario):
    wrong = check(scenario, scenario.run())
    assert not wrong, f"{scenario.id} ({scenario.source}): " + "; ".join(wrong)


def test_corpus_is_large_and_sourced():
    assert len(ALL) >= 40
    assert len({s.id for s in ALL}) == len(ALL), "scenario ids must be unique"
    for s in ALL:
        assert s.source.startswith("https://"), f"{s.id}: a public source URL"
        assert s.verdict and s.source_says, f"{s.id}: the verdict and what the source says"
        assert s.expectations() >= 2, f"{s.id}: check at least two things (statuses, headline, answers, ...)"


def test_table_in_docs_is_generated_from_this_run():
    # Regenerate with: python -m tests.scenarios.table > docs/scenarios.md
    assert DOC.read_text(encoding="utf-8") == render(), "docs/scenarios.md is stale: regenerate it"


def test_known_wrong_scenario_shows_as_differs():
    # A scenario whose expectation the tree misses, marked known wrong: the table says DIFFERS with the reason.
    base = next(s for s in ALL if s.headline == ("capacity", "scale-out"))
    wrong = replace(base, headline=("none-found", ""), known_wrong="the tree does not say this yet")
    agrees, text = row(wrong)
    assert not agrees and "DIFFERS (known wrong: the tree does not say this yet)" in text
    # Marked known wrong but agreeing: still DIFFERS, so the stale mark gets removed.
    agrees, text = row(replace(base, known_wrong="stale"))
    assert not agrees and "remove known_wrong" in text
