"""`python -m llm_diagnose`: the command line (same as the `llm-diagnose` script)."""

from llm_diagnose.diagnose.cli import main

raise SystemExit(main())
