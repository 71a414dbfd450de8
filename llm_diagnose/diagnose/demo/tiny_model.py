"""Make a small, seeded Llama model directory that vLLM and transformers both load.

Nothing is downloaded: the weights are random (seeded) and the byte-level BPE tokenizer is
trained in-process on seeded generated text, so the same recipe gives the same bytes on
every machine. torch, transformers and tokenizers are imported inside functions so that
importing this package needs none of them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
from pathlib import Path
from typing import Any

__all__ = ["RECIPE_VERSION", "SIZES", "make_tiny_model"]

# Bump whenever anything below changes the files produced: a directory marked with an older
# version is rebuilt instead of being reused.
RECIPE_VERSION = 1
MARKER = "llmd-tiny-model.json"
SEED = 1234

SIZES: dict[str, dict[str, Any]] = {
    # 1.45 M parameters: fast, but too small to show prefill/decode interference.
    "tiny": {
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "head_dim": 32,
        "intermediate_size": 352,
    },
    # 23 M parameters (47 MB bf16): slow enough on 2 cores for latency experiments.
    "small": {
        "hidden_size": 512,
        "num_hidden_layers": 6,
        "num_attention_heads": 8,
        "head_dim": 64,
        "intermediate_size": 1408,
    },
    # ~162 M parameters (12 layers of 1024: 4 x 1024^2 attention + 3 x 1024 x 2816 MLP, two 4096 x
    # 1024 embeddings): tens of ms per token on a 2-core CPU, as a large model on a GPU (issues 24, 26).
    "slow": {
        "hidden_size": 1024,
        "num_hidden_layers": 12,
        "num_attention_heads": 16,
        "head_dim": 64,
        "intermediate_size": 2816,
    },
}
VOCAB_SIZE = 4096
MAX_POSITIONS = 2048
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]  # ids 0..4
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _marker(size: str) -> dict[str, object]:
    return {"recipe": RECIPE_VERSION, "size": size, "seed": SEED}


def _is_complete(model_dir: Path, size: str) -> bool:
    try:
        return json.loads((model_dir / MARKER).read_text()) == _marker(size)
    except (OSError, ValueError):
        return False


def _corpus(rng: random.Random, n_lines: int = 4000) -> list[str]:
    """Seeded English-like text: enough variety for BPE to fill a 4096-token vocabulary."""
    onsets = [
        "",
        "b",
        "c",
        "d",
        "f",
        "g",
        "h",
        "k",
        "l",
        "m",
        "n",
        "p",
        "r",
        "s",
        "t",
        "v",
        "w",
        "st",
        "tr",
        "pl",
        "ch",
        "sh",
        "th",
        "gr",
        "br",
    ]
    vowels = ["a", "e", "i", "o", "u", "ai", "ou", "ea", "io"]
    codas = ["", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ng", "ck"]
    words = [
        "".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(rng.randint(1, 3)))
        for _ in range(3000)
    ]
    words += [
        "the",
        "a",
        "of",
        "and",
        "to",
        "in",
        "is",
        "that",
        "for",
        "it",
        "user",
        "assistant",
        "system",
        "hello",
        "please",
        "answer",
        "question",
        "token",
    ]
    lines = []
    for _ in range(n_lines):
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(4, 20)))
        lines.append(sentence.capitalize() + rng.choice([".", "?", "!", ",", ";"]) + f" {rng.randint(0, 9999)}")
    return lines


def _build_tokenizer(out: Path, rng: random.Random) -> None:
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(rng), trainer=trainer)
    # BOS is added by the post-processor, as Llama tokenizers do; EOS is left to the model.
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", model_max_length=MAX_POSITIONS
    )
    fast.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def _build_weights(out: Path, size: str) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=MAX_POSITIONS,
        num_key_value_heads=SIZES[size]["num_attention_heads"],
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        **SIZES[size],
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model.save_pretrained(out)


def make_tiny_model(out_dir: Path, size: str = "tiny") -> Path:
    """Make (or reuse) the seeded model directory `out_dir` and return its path.

    A directory already marked with this recipe version and size is returned untouched; one
    marked with another version or size (made here, so ours to replace) is rebuilt.
    The model is built in a sibling folder and renamed into place, so an interrupted build
    never leaves a half-made directory that looks complete.

    Raises:
        ValueError: unknown `size`.
        FileExistsError: `out_dir` holds something that is not a model of this recipe.
    """
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {sorted(SIZES)}")
    out_dir = Path(out_dir).resolve()
    if _is_complete(out_dir, size):
        return out_dir
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / MARKER).exists():
        raise FileExistsError(f"{out_dir} is not empty and holds no {MARKER}: not overwriting it")

    tmp = out_dir.with_name(f".{out_dir.name}.building-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        _build_tokenizer(tmp, random.Random(SEED))
        _build_weights(tmp, size)
        for f in tmp.iterdir():
            f.chmod(0o644)  # safetensors comes out 0600; others (a container user) must read it
        # The marker is written last: its presence means every other file is complete.
        (tmp / MARKER).write_text(json.dumps(_marker(size), sort_keys=True) + "\n")
        shutil.rmtree(out_dir, ignore_errors=True)  # empty, or our own older recipe
        tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m llm_diagnose.diagnose.demo.tiny_model", description=__doc__.splitlines()[0]
    )
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    args = parser.parse_args(argv)
    print(make_tiny_model(args.out_dir, args.size))
    return 0


if __name__ == "__main__":
    sys.exit(main())
