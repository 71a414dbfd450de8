"""CLI sub-commands, one module each (see llm_diagnose.diagnose.cli)."""
