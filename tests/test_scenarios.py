"""The scenario corpus (tests/scenarios/): each situation gets the verdict a senior engineer gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scenarios.catalogue import ALL
from tests.scenarios.model import check
from tests.scenarios.table import render

DOC = Path(__file__).resolve().parents[1] / "docs" / "scenarios.md"


@pytest.mark.parametrize("scenario", ALL, ids=[s.id for s in ALL])
def test_scenario(scenario):
    wrong = check(scenario, scenario.run())
    assert not wrong, f"{scenario.id} ({scenario.source}): " + "; ".join(wrong)


def test_corpus_is_large_and_sourced():
    assert len(ALL) >= 40
    assert len({s.id for s in ALL}) == len(ALL), "scenario ids must be unique"
    for s in ALL:
        assert s.source.startswith("https://"), f"{s.id}: a public source URL"
        assert s.verdict and s.source_says, f"{s.id}: the verdict and what the source says"


def test_table_in_docs_is_generated_from_this_run():
    # Regenerate with: python -m tests.scenarios.table > docs/scenarios.md
    assert DOC.read_text(encoding="utf-8") == render(), "docs/scenarios.md is stale: regenerate it"
