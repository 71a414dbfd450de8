"""CLI sub-commands, one module each (see diagnose.cli)."""
