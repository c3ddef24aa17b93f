"""The benchmark workload, defined once for both sides: the input file and the operator's parameters.

N requests of L random ``w<i>`` words (exactly L prompt tokens with the word-level tokenizers of
bench/make_model.py and bench/gpu/make_model.py), M output tokens each (``ignore_eos``, greedy).
Standard library only: imported by bench/compare.py (Airflow env), bench/raw_vllm.py (Ray env) and
the GPU scripts (device image).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

#: Engine settings of the CPU benchmark: vLLM's CPU build on the shared 2-core, 24 GiB VM.
CPU_ENGINE_KWARGS = {
    "max_model_len": 512,
    "gpu_memory_utilization": 0.15,  # the share of host RAM for the KV cache on the CPU build
    "enforce_eager": True,
    "max_num_seqs": 256,
    "seed": 0,
}
#: Engine settings of the GPU benchmark: /work/shared/gpu/bench_vllm.py's ENGINE.
GPU_ENGINE_KWARGS = {
    "load_format": "dummy",
    "max_model_len": 512,
    "gpu_memory_utilization": 0.9,
    "max_num_seqs": 256,
    "max_num_batched_tokens": 16384,
    "dtype": "bfloat16",
    "seed": 0,
}


def write_prompts(path: Path, n: int, prompt_tokens: int, vocab_words: int, seed: int = 0) -> Path:
    """Write N JSONL rows ``{"id", "prompt"}``; reuses an existing file with the same parameters."""
    tag = {"n": n, "prompt_tokens": prompt_tokens, "vocab_words": vocab_words, "seed": seed}
    marker = path.with_suffix(".params.json")
    if path.exists() and marker.exists() and json.loads(marker.read_text()) == tag:
        return path
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for i in range(n):
            words = " ".join(f"w{rng.randrange(vocab_words)}" for _ in range(prompt_tokens))
            out.write(json.dumps({"id": f"r{i:06d}", "prompt": words}) + "\n")
    marker.write_text(json.dumps(tag))
    return path


def operator_kwargs(
    model: str,
    input_uri: str,
    output_uri: str,
    max_tokens: int,
    engine_kwargs: dict[str, Any],  # Any: vLLM engine arguments.
    batch_size: int,
    replica_resources: dict[str, float] | None,
    max_concurrent_batches: int | None = None,
) -> dict[str, Any]:  # Any: RayLLMBatchOperator arguments.
    """RayLLMBatchOperator arguments for the workload; raw vLLM reads the same values from its spec."""
    return {
        "model": model,
        "input_uri": input_uri,
        "output_uri": output_uri,
        "user_template": "{prompt}",
        "id_column": "id",
        "keep_columns": [],
        "sampling_params": {"max_tokens": max_tokens, "ignore_eos": True, "temperature": 0},
        "engine_kwargs": dict(engine_kwargs),
        "batch_size": batch_size,
        "replica_resources": replica_resources,
        "max_concurrent_batches": max_concurrent_batches,
    }
