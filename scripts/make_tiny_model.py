"""Write a small random-weight Llama model folder that vLLM's CPU build can load.

Nothing can be downloaded from a model hub on our machines, so the demo and the tests make
their own model: a byte-level BPE tokenizer trained on the spot (so any text, including every
label a structured-output ``choice`` may ask for, is encodable), a trivial chat template, and a
two-layer Llama with random weights saved by ``save_pretrained``. head_dim is 64 because vLLM's
CPU attention kernel rejects 16 (see PLATFORM-NOTES.md). Output is gibberish by design; the
point is to run the real engine end to end in seconds.

usage: python make_tiny_model.py OUT_DIR [--seed N]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

VOCAB_SIZE = 512
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|pad|>"]


def training_corpus(text: str) -> list[str]:
    """Every rotation of the words, a few times over: enough for a BPE vocabulary of VOCAB_SIZE."""
    words = text.split()
    return [" ".join(words[i:] + words[:i]) for i in range(len(words))] * 8


def train_tokenizer(
    corpus: list[str], special_tokens: list[str], eos: str, pad: str
) -> Any:  # Any: a tokenizer.
    """A byte-level BPE tokenizer trained on the spot (nothing can be downloaded here)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token=pad, bos_token=None)


def _train_tokenizer(out_dir: Path) -> None:
    corpus = training_corpus(
        "Law Firm Healthcare Technology Retail Consulting Manufacturing Finance Real Estate Other "
        "What industry is this company in You classify companies answer with one label only "
        "summary ticket customer support order refund shipping account password the a of and to"
    )
    hf = train_tokenizer(corpus, SPECIAL_TOKENS, eos="<|endoftext|>", pad="<|pad|>")
    hf.chat_template = CHAT_TEMPLATE
    hf.save_pretrained(out_dir)


def make_tiny_model(out_dir: Path, seed: int = 0) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out_dir.mkdir(parents=True, exist_ok=True)
    _train_tokenizer(out_dir)
    eos_id = json.loads((out_dir / "tokenizer.json").read_text())["added_tokens"][0]["id"]
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
        eos_token_id=eos_id,
        pad_token_id=eos_id + 1,
        bos_token_id=None,
        tie_word_embeddings=True,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def cli(make: Callable[[Path, int], Path], description: str) -> None:
    """``script OUT_DIR [--seed N]``: write the model unless OUT_DIR already holds one."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if (args.out_dir / "config.json").exists():
        print(f"model already at {args.out_dir}")
        return
    print(f"wrote {make(args.out_dir, args.seed)}")


if __name__ == "__main__":
    cli(make_tiny_model, __doc__.splitlines()[0])
