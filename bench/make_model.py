"""Write a random-weight Llama for the CPU benchmark, with a word-level tokenizer.

The tokenizer maps the words ``w0 .. w<V-3>`` to one id each (plus bos/eos at the top), so a
prompt of L random ``w<i>`` words is exactly L tokens, and every generated id decodes. That is the
same trick as the GPU recipe's Llama-3.1-8B-shaped model (/work/shared/gpu/make_model.py, copied to
bench/gpu/), so both benchmarks use the same workload generator (bench/workload.py).

The default shape (hidden 1024, 8 layers, 16 heads of 64, vocab 32000, ~170 M parameters, bf16)
makes generation on the 2-core CPU VM take a minute or two, longer than the ~20 s engine start.

usage: .venvs/ray/bin/python bench/make_model.py OUT_DIR [--hidden 1024 --layers 8 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
# Same template as the GPU recipe's model: the user text followed by one space, no extra tokens.
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


def make(out: str, hidden: int, layers: int, heads: int, intermediate: int, vocab: int, dtype: str) -> dict:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    os.makedirs(out, exist_ok=True)
    bos_id, eos_id = vocab - 2, vocab - 1
    words = {f"w{i}": i for i in range(vocab - 2)} | {BOS: bos_id, EOS: eos_id}
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, unk_token="w0", pad_token=EOS
    )
    hf.chat_template = CHAT_TEMPLATE
    hf.save_pretrained(out)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=hidden // heads,
        max_position_embeddings=2048,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        tie_word_embeddings=False,
        torch_dtype=dtype,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    model.save_pretrained(out, safe_serialization=True)
    with open(os.path.join(out, "generation_config.json"), "w") as config_file:
        json.dump({"bos_token_id": bos_id, "eos_token_id": eos_id}, config_file)
    return {"params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1), "vocab": vocab}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--intermediate", type=int, default=2816)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    if args.hidden // args.heads != 64:
        sys.exit("head_dim must be 64 (vLLM's CPU attention kernel rejects 16; see PLATFORM-NOTES.md)")
    if os.path.exists(os.path.join(args.out, "config.json")):
        print(f"model already at {args.out}")
        return
    info = make(args.out, args.hidden, args.layers, args.heads, args.intermediate, args.vocab, args.dtype)
    print(f"wrote {args.out}: {info}")


if __name__ == "__main__":
    main()
