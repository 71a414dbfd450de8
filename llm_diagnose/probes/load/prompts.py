"""Prompts of a known length in tokens, shared prefixes, and salts that defeat a warm cache.

Two forms, chosen per endpoint:
- token ids (completions on a server with `/tokenize`, e.g. vLLM): exact lengths and exact
  shared prefixes, because the ids are the tokens. The ids are drawn from those the server's
  tokenizer produced for ordinary words, so no special token (BOS, EOS) slips in;
- text (chat, or a server without `/tokenize`): seeded pseudo-words, sized by a
  tokens-per-word ratio calibrated through `/tokenize` when it exists, guessed otherwise and
  then corrected from the first response's `usage.prompt_tokens` (`PromptMaker.corrected`);
  every length in the report is then flagged as an estimate, and the analyses use the lengths
  the server counted.

A salt is a random nonce at the START of a prompt: a prefix cache keys blocks by everything
before them, so a prompt that differs in its first tokens shares nothing with any earlier
one, however warm the cache (the chained-hash fact in shared/notes/trace-formats.md).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

import aiohttp

from llm_diagnose.probes.http import ProbeHTTPError, post_json, redact_url

__all__ = ["Prompt", "PromptMaker", "calibrate_prompts", "NONCE_TOKENS", "WORDS"]

Prompt = str | tuple[int, ...]
NONCE_TOKENS = 6  # 6 random ordinary tokens: two salts collide about never
NONCE_WORDS = 4  # a text salt: 4 of the 2,000 WORDS, 44 bits
_ENTROPY = random.SystemRandom()
GUESSED_TOKENS_PER_WORD = 1.3  # English-like text in common BPE vocabularies
# Our pseudo-words are 1-3 syllables: a BPE vocabulary splits each into at least one token and
# rarely more than a few; a count outside this range is a server's (or a gateway's) wrong usage.
PLAUSIBLE_TOKENS_PER_WORD = (0.5, 8.0)


def _make_words(n: int = 2000, seed: int = 20261202) -> tuple[str, ...]:
    rng = random.Random(seed)
    onsets = ["b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "st", "tr", "pl", "ch"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ou", "ea"]
    codas = ["", "", "n", "r", "s", "t", "l", "m", "nd", "st"]
    words = {
        "".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(rng.randint(1, 3)))
        for _ in range(n * 2)
    }
    return tuple(sorted(words))[:n]


WORDS = _make_words()


@dataclass(frozen=True)
class PromptMaker:
    """Builds prompt bodies, nonces and hash-keyed blocks in the form an endpoint takes."""

    token_pool: tuple[int, ...] = ()  # ordinary token ids of the server's tokenizer; () = text only
    tokens_per_word: float = GUESSED_TOKENS_PER_WORD
    calibrated: bool = False
    source: str = "uncalibrated: about 1.3 tokens per word assumed"

    def exact_for(self, endpoint: str) -> bool:
        """Whether prompts for `endpoint` have exact token lengths (token ids)."""
        return bool(self.token_pool) and endpoint == "completions"

    def body(self, n_tokens: int, rng: random.Random, endpoint: str = "completions") -> Prompt:
        """A random body of about (text) or exactly (token ids) `n_tokens` tokens."""
        if n_tokens <= 0:
            return () if self.exact_for(endpoint) else ""
        if self.exact_for(endpoint):
            pool = self.token_pool
            return tuple(pool[rng.randrange(len(pool))] for _ in range(n_tokens))
        n_words = max(1, round(n_tokens / self.tokens_per_word))
        return " ".join(rng.choice(WORDS) for _ in range(n_words))

    def nonce(self, endpoint: str = "completions") -> Prompt:
        """A salt for the start of a prompt, from the OS's entropy: NONCE_TOKENS token ids, or for
        text about as many tokens of words (at least NONCE_WORDS of them, about 11 bits each).

        Never from a seeded generator: a seeded run repeated would repeat its salts, and the
        cache warmed by the first run would serve the second (the very thing salts prevent).
        Words rather than a hex string: a tokenizer cuts hex into a token a digit or so (a
        "run-<16 hex>:" salt is 10-20 tokens), words are sized as the body is.
        """
        if self.exact_for(endpoint):
            return self.body(NONCE_TOKENS, _ENTROPY, endpoint)
        n_words = max(NONCE_WORDS, round(NONCE_TOKENS / self.tokens_per_word))
        return " ".join(_ENTROPY.choice(WORDS) for _ in range(n_words))

    def salt_from(self, ids: Sequence[int]) -> tuple[int, ...]:
        """NONCE_TOKENS ids drawn from `ids` with the OS's entropy: a salt of a trace's own token ids,
        for a maker that knows none of the model's."""
        return tuple(_ENTROPY.choice(ids) for _ in range(NONCE_TOKENS))

    def block(self, key: str, n_tokens: int, endpoint: str = "completions") -> Prompt:
        """Deterministic content for `key` (a trace's hash id with the run's salt): equal keys, equal tokens."""
        return self.body(n_tokens, random.Random(key), endpoint)

    @staticmethod
    def join(*parts: Prompt) -> Prompt:
        """Concatenate parts of one form (texts joined by a newline, so words do not merge)."""
        ids = [p for p in parts if isinstance(p, tuple)]
        texts = [p for p in parts if isinstance(p, str)]
        if len(ids) == len(parts):
            return tuple(t for p in ids for t in p)
        if len(texts) == len(parts):
            return "\n".join(p for p in texts if p)
        raise TypeError("cannot join text and token-id prompt parts")

    def corrected(self, prompt_tokens: int, words: int, how: str) -> PromptMaker:
        """The same maker, its tokens-per-word ratio set from a response's usage.prompt_tokens.

        Without `/tokenize` (a gateway that routes only /v1/*) the ratio is a guess; the server's own
        count of a prompt's tokens is the correction. `how` says which request it came from."""
        if self.token_pool or words <= 0 or prompt_tokens <= 0:
            return self
        ratio = prompt_tokens / words
        if not PLAUSIBLE_TOKENS_PER_WORD[0] <= ratio <= PLAUSIBLE_TOKENS_PER_WORD[1]:
            return replace(
                self,
                source=f"{self.source}; usage.prompt_tokens of {how} said {prompt_tokens} tokens for {words} words "
                f"({ratio:.2f} per word), which no tokenizer gives: not used",
            )
        return replace(
            self,
            tokens_per_word=ratio,
            source=f"corrected from usage.prompt_tokens of {how}: {prompt_tokens} tokens for {words} words "
            f"({ratio:.2f} per word; before: {self.source})",
        )

    def describe(self) -> str:
        if self.token_pool:
            return f"token-id prompts from {len(self.token_pool)} ordinary tokens ({self.source})"
        return f"text prompts, {self.tokens_per_word:.2f} tokens per word ({self.source})"


async def calibrate_prompts(
    session: aiohttp.ClientSession, base_url: str, model: str
) -> tuple[PromptMaker, int | None]:
    """Ask the server's `/tokenize` how it tokenizes our words; also returns its max_model_len.

    A server without `/tokenize` (or one that refuses it) gives an uncalibrated PromptMaker,
    whose `source` says why: lengths are then estimates.
    """
    sample_words = list(WORDS)  # all of them: every id our text prompts can produce joins the pool
    random.Random(1).shuffle(sample_words)
    sample = " ".join(sample_words)
    url = base_url + "/tokenize"
    try:
        answer = await post_json(session, url, {"model": model, "prompt": sample, "add_special_tokens": False})
    except ProbeHTTPError as exc:
        return PromptMaker(
            source=f"uncalibrated: {redact_url(url)} failed ({exc}); about 1.3 tokens per word assumed"
        ), None
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    if (
        not isinstance(answer, dict)
        or not isinstance(tokens, list)
        or not tokens
        or not all(isinstance(t, int) for t in tokens)
    ):
        return PromptMaker(source=f"uncalibrated: {redact_url(url)} returned no token ids"), None
    max_len = answer.get("max_model_len")
    pool = tuple(sorted(set(tokens)))
    maker = PromptMaker(
        token_pool=pool,
        tokens_per_word=len(tokens) / len(sample_words),
        calibrated=True,
        source=f"calibrated with {redact_url(url)}",
    )
    return maker, int(max_len) if isinstance(max_len, int) else None
