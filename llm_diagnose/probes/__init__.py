"""Measurement side of llm-diagnose: sources, probes and the timing core.

Nothing in this package imports `diagnose`: probes measure, the diagnosis judges.
"""
