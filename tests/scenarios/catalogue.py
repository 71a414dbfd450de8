"""Every scenario of the corpus, in module order (modules `s_*.py`, each with `SCENARIOS`)."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from tests.scenarios.model import Scenario

__all__ = ["ALL"]


def _load() -> list[Scenario]:
    out: list[Scenario] = []
    for info in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda i: i.name):
        if info.name.startswith("s_"):
            out.extend(importlib.import_module(f"tests.scenarios.{info.name}").SCENARIOS)
    return out


ALL: list[Scenario] = _load()
