"""Judging side of llm-diagnose: evidence, the decision tree, recommendations, reports, gates, CLI."""
