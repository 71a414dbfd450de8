"""Prompt text to token ids: the model's own tokenizer when given, else an approximation.

`--tokenizer DIR` loads DIR/tokenizer.json with the `tokenizers` library (imported only
then). Without it, `ApproxTokenizer` splits text the way byte-level BPE tokenizers roughly do:
a word piece of up to 6 letters with its leading space, a group of up to 3 digits, one
punctuation mark, or a run of whitespace is one token. On English prose that lands within
about 20% of GPT-style counts; on code, CJK text or unusual scripts it can be further off.
Its ids are CRC-32s of the pieces, so equal text gives equal ids and prefix matching works;
every figure computed from it is marked approximate in the evidence.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from llm_diagnose.probes.traces.errors import TraceError

__all__ = ["Tokenizer", "ApproxTokenizer", "HfTokenizer", "load_tokenizer", "APPROX_NAME"]

APPROX_NAME = "regex word-piece approximation"


class Tokenizer(Protocol):
    name: str
    exact: bool

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]: ...

    def count(self, text: str) -> int: ...


_PIECE = re.compile(r"\s?[^\W\d_]{1,6}|\s?\d{1,3}|\s?[^\w\s]|\s?_|\s+")


class ApproxTokenizer:
    name = APPROX_NAME
    exact = False

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}

    def _id(self, piece: str) -> int:
        i = self._ids.get(piece)
        if i is None:
            i = zlib.crc32(piece.encode("utf-8", "surrogatepass"))
            if len(self._ids) < 1 << 18:  # a bounded cache: ids are recomputable
                self._ids[piece] = i
        return i

    def encode(self, text: str) -> np.ndarray:
        ids = self._ids
        pieces = _PIECE.findall(text)
        out = [ids.get(p) for p in pieces]
        if None in out:
            out = [self._id(p) for p in pieces]
        return np.array(out, dtype=np.uint32)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [self.encode(t) for t in texts]

    def count(self, text: str) -> int:
        return len(_PIECE.findall(text))


class HfTokenizer:
    """A Hugging Face `tokenizer.json`, through the `tokenizers` library."""

    exact = True

    def __init__(self, file: Path) -> None:
        try:
            import tokenizers  # imported here: only --tokenizer needs it
        except ImportError:
            raise TraceError("--tokenizer needs the 'tokenizers' package (pip install tokenizers)") from None
        try:
            self._tok = tokenizers.Tokenizer.from_file(str(file))
        except Exception as exc:  # the library raises its own exception types
            raise TraceError(f"cannot load the tokenizer: {exc}", path=str(file)) from None
        self.name = f"tokenizer {file.parent.name or file.name}"

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.array(e.ids, dtype=np.uint32) for e in self._tok.encode_batch(list(texts))]

    def count(self, text: str) -> int:
        return len(self._tok.encode(text).ids)


def load_tokenizer(path: str | None) -> Tokenizer:
    """The tokenizer in DIR (its tokenizer.json) or the file itself; the approximation for None."""
    if path is None:
        return ApproxTokenizer()
    p = Path(path)
    file = p / "tokenizer.json" if p.is_dir() else p
    if not file.is_file():
        raise TraceError("no tokenizer.json there (give a model directory or a tokenizer.json file)", path=str(path))
    return HfTokenizer(file)
