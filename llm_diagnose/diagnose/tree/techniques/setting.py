"""One engine setting of a technique, and the engines settings are given for.

Each `Setting` is the part one types (`command`), kept apart from why or when (`note`) and the
releases it holds for (`versions`), so tests/test_engine_settings.py can take the flags out and
check them against the engine's own parser (vLLM: the installed `vllm serve` parser) or its
recorded flag list (SGLang, TensorRT-LLM: source and version named in that test). Where a
command goes is its `kind`:

- "flags": options of the engine's server (`vllm serve`, `python -m sglang.launch_server`,
  `trtllm-serve`);
- "command": a whole command line whose first words name the program (`vllm run-batch ...`);
- "config": YAML for the engine's config file (TensorRT-LLM: the file `trtllm-serve --config`
  reads), written in flow style so it is one line;
- "python": a Python call;
- "none": nothing to type (built in, or on by default); the note says what to check.

Placeholders are in angle brackets (`<N>`, `<draft>`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["Setting", "Kind", "ENGINES", "ENGINE_NAMES", "TRT_YAML", "per_engine"]

ENGINES = ("vllm", "sglang", "trtllm", "transformers")
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM", "transformers": "transformers"}
TRT_YAML = "in the YAML that trtllm-serve --config reads"

Kind = Literal["flags", "command", "config", "python", "none"]


@dataclass(frozen=True)
class Setting:
    """One engine setting: what to type, why or when, and for which releases."""

    command: str  # exactly what is typed; "" when nothing is (kind "none")
    note: str = ""
    kind: Kind = "flags"
    versions: str = ""  # e.g. "vLLM 0.14+"; "" when every release the tool knows has it

    def __str__(self) -> str:
        extra = "; ".join(p for p in (self.note, self.versions) if p)
        if not self.command:
            return extra
        return f"{self.command}  ({extra})" if extra else self.command


def per_engine(**settings: Sequence[Setting]) -> tuple[tuple[str, tuple[Setting, ...]], ...]:
    """(engine, settings) in ENGINES order, for the engines given (an unknown engine is an error)."""
    unknown = set(settings) - set(ENGINES)
    if unknown:
        raise ValueError(f"settings for unknown engines {sorted(unknown)}: engines are {ENGINES}")
    return tuple((e, tuple(settings[e])) for e in ENGINES if e in settings)
