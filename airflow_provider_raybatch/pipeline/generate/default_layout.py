"""The engine layout a job gets when it leaves it unset: how many engine replicas share its GPU.

Why: on short generations one vLLM engine cannot keep a GPU busy. Measured on one H200 with an 8B
model on the company-industry classification (~55 prompt tokens a row, a ``choice``, 6 output
tokens; bench/RESULTS.md 18b), one engine kept the GPU 22% busy: its EngineCore's CPU (scheduling ~720
requests a step and filling the choice grammar's bitmask) was the limit, not the GPU or the KV cache.
Each replica brings its own EngineCore: 2 replicas on the GPU generated 1.97x one's rate, 3 replicas
3.13x (2.21x raw vLLM end to end), a 4th added 5% and cost 15 s more of start-up. On long generations
(2,000 x 128 tokens out) one engine kept the GPU 94-100% busy and a second added nothing.

So, unless the job sets its own layout (``concurrency``, ``replica_resources``, tensor or pipeline
parallelism, the GPU memory settings): for short generations, as many replicas share one GPU as its
memory and its node's cores hold, at most :data:`MAX_REPLICAS_PER_GPU`; else one replica, as before.
What was chosen, and why, goes into the manifest (``layout``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Literal

from airflow_provider_raybatch.specs import BatchInferenceSpec

log = logging.getLogger("airflow_provider_raybatch.pipeline")

#: The knee measured on an H200 (bench/RESULTS.md 18b): 3 replicas 3.13x one's rate, 4 replicas 3.27x.
MAX_REPLICAS_PER_GPU = 3
#: A generation this short (``max_tokens``) leaves one engine's CPU, not the GPU, setting the pace.
SHORT_GENERATION_MAX_TOKENS = 32
#: vLLM's ``SamplingParams.max_tokens`` when the sampling leaves it unset.
VLLM_DEFAULT_MAX_TOKENS = 16
GIB = 2**30
#: Each replica's KV cache when several share a GPU: fixed, so that replicas starting side by side do not
#: size theirs from each other's free memory. 1,024 sequences of ~32 unshared tokens at 128 KiB a token
#: (an 8B model) need ~4 GiB; 2.2 GiB were in use at most in the measured run.
KV_CACHE_BYTES_PER_REPLICA = 4 * GIB
#: Activations, CUDA graphs and the allocator's slack of one engine, beside its weights and KV cache.
ENGINE_OVERHEAD_BYTES = 4 * GIB
#: The share of the GPU's memory the replicas may use between them (vLLM's own default is 0.9).
GPU_MEMORY_SHARE = 0.8
#: Host cores one replica keeps busy: its actor (~1) and its EngineCore (~2); 2.4 measured.
CORES_PER_REPLICA = 3
#: Host cores left to Ray Data's reads, the driver and the raylet.
CORES_KEPT_FREE = 2
#: Engine settings that are the job's own layout: where one is set, the job's layout is left as it is.
LAYOUT_ENGINE_KWARGS = ("gpu_memory_utilization", "kv_cache_memory_bytes", "num_gpu_blocks_override")
#: Files that hold a model's weights (what vLLM loads onto the GPU).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


@dataclass(frozen=True)
class GpuNode:
    """What the rule needs of the node an engine would run on."""

    gpu_memory_bytes: int
    cpus: float


@dataclass(frozen=True)
class LayoutChoice:
    """How many engine replicas the job runs on its GPU, who chose, and why."""

    replicas_per_gpu: int
    chosen_by: Literal["the job's settings", "the default rule"]
    reason: str

    def as_manifest(self) -> dict[str, int | str]:
        return {"replicas_per_gpu": self.replicas_per_gpu, "chosen_by": self.chosen_by, "reason": self.reason}


def settings_that_set_the_layout(spec: BatchInferenceSpec) -> list[str]:
    """The job's own layout settings (each by its parameter name); empty: the default rule chooses."""
    named = [name for name in ("concurrency", "replica_resources") if getattr(spec, name) is not None]
    for key in ("tensor_parallel_size", "pipeline_parallel_size"):
        if int(spec.engine_kwargs.get(key) or 1) > 1:
            named.append(f"engine_kwargs['{key}']")
    named += [f"engine_kwargs['{key}']" for key in LAYOUT_ENGINE_KWARGS if key in spec.engine_kwargs]
    return named


def short_generation(spec: BatchInferenceSpec) -> bool:
    """Whether every row's answer is short: a ``choice``, or ``max_tokens`` (vLLM's 16 when unset) of at
    most :data:`SHORT_GENERATION_MAX_TOKENS`. A preprocess that sets its rows' own ``max_tokens`` is not
    seen here: such a job sets ``concurrency`` itself."""
    if spec.structured_choices:
        return True
    max_tokens = spec.sampling_params.get("max_tokens")
    max_tokens = VLLM_DEFAULT_MAX_TOKENS if max_tokens is None else int(max_tokens)
    return max_tokens <= SHORT_GENERATION_MAX_TOKENS


def replicas_that_fit(gpu: GpuNode, weights_bytes: int) -> tuple[int, str]:
    """How many replicas one GPU of ``gpu``'s node holds, and which limit decided it."""
    per_replica = weights_bytes + ENGINE_OVERHEAD_BYTES + KV_CACHE_BYTES_PER_REPLICA
    by_memory = math.floor(0.9 * gpu.gpu_memory_bytes / per_replica)
    by_cores = math.floor((gpu.cpus - CORES_KEPT_FREE) / CORES_PER_REPLICA)
    limits = {
        f"GPU memory ({gpu.gpu_memory_bytes / GIB:.0f} GiB for {weights_bytes / GIB:.1f} GiB of weights "
        f"+ {(ENGINE_OVERHEAD_BYTES + KV_CACHE_BYTES_PER_REPLICA) / GIB:.0f} GiB a replica)": by_memory,
        f"the node's {gpu.cpus:g} cores ({CORES_PER_REPLICA} a replica, {CORES_KEPT_FREE} kept free)": (
            by_cores
        ),
        "the measured knee": MAX_REPLICAS_PER_GPU,
    }
    limit = min(limits, key=lambda name: limits[name])
    return max(1, limits[limit]), limit


def decided_without_the_cluster(spec: BatchInferenceSpec) -> LayoutChoice | None:
    """The layout where the job's settings alone decide it; None where the cluster's GPU must be read."""
    own = settings_that_set_the_layout(spec)
    if own:
        replicas = spec.concurrency if isinstance(spec.concurrency, int) else None
        return LayoutChoice(replicas or 1, "the job's settings", f"set by {', '.join(own)}")
    one = "one replica on one GPU"
    if spec.image_column is not None or spec.openai_endpoint == "/v1/embeddings":
        return LayoutChoice(1, "the default rule", f"{one}: not measured for this kind of job")
    if not short_generation(spec):
        return LayoutChoice(
            1, "the default rule", f"{one}: long generations (max_tokens over "
            f"{SHORT_GENERATION_MAX_TOKENS}) keep one engine's GPU busy",
        )  # fmt: skip
    return None


def choose(spec: BatchInferenceSpec, gpu: GpuNode | None, weights_bytes: int | None) -> LayoutChoice:
    """The layout for ``spec`` on a cluster whose GPU node is ``gpu`` (None: no GPU), for a model of
    ``weights_bytes`` (None: not known before its engine fetches it)."""
    decided = decided_without_the_cluster(spec)
    if decided is not None:
        return decided
    if gpu is None:
        return LayoutChoice(1, "the default rule", "one replica: the cluster has no GPU")
    if weights_bytes is None:
        unknown = "one replica on one GPU: the model's size is not known before its engine fetches it"
        return LayoutChoice(1, "the default rule", unknown)
    replicas, limit = replicas_that_fit(gpu, weights_bytes)
    why = f"{replicas} replica(s) on one GPU for short generations, limited by {limit}"
    return LayoutChoice(replicas, "the default rule", why)


def applied(spec: BatchInferenceSpec, choice: LayoutChoice) -> BatchInferenceSpec:
    """``spec`` with the layout ``choice`` made, for the engine stage: its fingerprint is not the job's
    (the job's spec stays what binds its staged rows)."""
    if choice.chosen_by == "the job's settings":
        return spec
    replicas = choice.replicas_per_gpu
    if replicas == 1:
        return spec.model_copy(update={"concurrency": 1})
    engine_kwargs = {
        **spec.engine_kwargs,
        "gpu_memory_utilization": round(GPU_MEMORY_SHARE / replicas, 3),
        "kv_cache_memory_bytes": KV_CACHE_BYTES_PER_REPLICA,
    }
    return spec.model_copy(
        update={
            "concurrency": replicas,
            "replica_resources": {"GPU": round(1 / replicas, 4), "CPU": 1.0},
            "engine_kwargs": engine_kwargs,
        }
    )


# -- what the rule reads of the cluster --------------------------------------------------------------


def weights_bytes(model_source: str) -> int | None:
    """The bytes of a local model folder's weight files; from its config where it has none (a model
    loaded with dummy weights); None for a model not on this node (a Hugging Face id not yet fetched)."""
    folder = model_source
    if not os.path.isdir(folder):
        folder = _hugging_face_snapshot(model_source) or ""
        if not os.path.isdir(folder):
            return None
    total = sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(folder)
        for name in names
        if name.endswith(WEIGHT_SUFFIXES)
    )
    return total or _weights_bytes_from_config(os.path.join(folder, "config.json"))


def _hugging_face_snapshot(model_id: str) -> str | None:
    try:
        from huggingface_hub import snapshot_download

        return str(snapshot_download(model_id, local_files_only=True))
    except Exception:  # noqa: BLE001 - not in this node's cache (or not an id): not known yet
        return None


def _weights_bytes_from_config(config_path: str) -> int | None:
    """A decoder's parameters from its ``config.json`` (embeddings, attention, MLP), 2 bytes each."""
    try:
        with open(config_path, encoding="utf-8") as file:
            config = json.load(file)
        hidden, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
        intermediate, vocab = int(config["intermediate_size"]), int(config["vocab_size"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    head_dim = hidden // heads
    attention = 2 * hidden * hidden + 2 * hidden * kv_heads * head_dim
    parameters = 2 * vocab * hidden + layers * (attention + 3 * hidden * intermediate)
    return 2 * parameters


def _gpu_memory_bytes() -> int | None:
    """The first GPU's memory on this node (NVML, else nvidia-smi); None where there is none."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML here: ask nvidia-smi
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True).stdout  # fmt: skip
        return int(float(out.split()[0]) * 2**20)  # MiB
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def _node_facts(model_source: str) -> tuple[int | None, int | None]:
    """On a GPU node: its first GPU's memory, and the model's weights as that node has them."""
    return _gpu_memory_bytes(), weights_bytes(model_source)


def probe(spec: BatchInferenceSpec, model_source: str) -> tuple[GpuNode | None, int | None]:
    """The cluster's first alive GPU node (of ``spec.accelerator_type`` where set) and the model's size
    there; (None, None) when the cluster has no GPU. A task of no CPU and no GPU reads them on that node."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    wanted = f"accelerator_type:{spec.accelerator_type}" if spec.accelerator_type else None
    nodes = [
        node for node in ray.nodes()
        if node.get("Alive") and node["Resources"].get("GPU", 0) >= 1
        and (wanted is None or wanted in node["Resources"])
    ]  # fmt: skip
    if not nodes:
        return None, None
    node = nodes[0]
    facts = ray.remote(num_cpus=0)(_node_facts).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
    )
    memory, weights = ray.get(facts.remote(model_source), timeout=120)
    if memory is None:
        return None, weights
    return GpuNode(gpu_memory_bytes=memory, cpus=float(node["Resources"].get("CPU", 0))), weights


def engine_layout(spec: BatchInferenceSpec, model_source: str) -> tuple[BatchInferenceSpec, LayoutChoice]:
    """The spec the engine stage runs with, and the layout choice behind it (logged)."""
    choice = decided_without_the_cluster(spec)
    if choice is None:
        choice = choose(spec, *probe(spec, model_source))
    log.info("Engine layout: %d replica(s) per GPU, chosen by %s: %s.", choice.replicas_per_gpu,
             choice.chosen_by, choice.reason)  # fmt: skip
    return applied(spec, choice), choice
