"""The scenario corpus: realistic serving situations, each from a public source, with the
evidence as llm-diagnose would measure it and the verdict a senior inference engineer gives.

Every module `s_*.py` here holds a list `SCENARIOS` of `Scenario`s; `tests/test_scenarios.py`
runs them all, and `python -m tests.scenarios.table > docs/scenarios.md` writes the table
(scenario, source, expected, got) that a test checks is current.
"""
