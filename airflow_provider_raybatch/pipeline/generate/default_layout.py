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

from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

log = logging.getLogger("airflow_provider_raybatch.pipeline")

#: The knee measured on an H200 (bench/RESULTS.md 18b): 3 replicas 3.13x one's rate, 4 replicas 3.27x.
MAX_REPLICAS_PER_GPU = 3
#: A generation this short (``max_tokens``) leaves one engine's CPU, not the GPU, setting the pace.
SHORT_GENERATION_MAX_TOKENS = 32
#: vLLM's ``SamplingParams.max_tokens`` when the sampling leaves it unset.
VLLM_DEFAULT_MAX_TOKENS = 16
GIB = 2**30
#: Each replica's KV cache when several share a GPU, at least: fixed, so that replicas starting side by
#: side do not size theirs from each other's free memory. 1,024 sequences of ~32 unshared tokens at
#: 128 KiB a token (an 8B model) need ~4 GiB; 2.2 GiB were in use at most in the measured run.
MIN_KV_CACHE_BYTES = 4 * GIB
#: vLLM refuses to start an engine whose KV cache cannot hold one sequence of ``max_model_len`` tokens:
#: each replica's holds that much and this margin (vLLM keeps a block or two of its own).
ONE_SEQUENCE_MARGIN = 1.1
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
#: Files that hold a model's weights (what vLLM loads onto the GPU), in the order vLLM prefers them:
#: a folder with safetensors is loaded from those alone.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
#: Config keys of a mixture of experts, whose size the config's dense formula would not give.
_EXPERT_KEYS = ("num_local_experts", "n_routed_experts", "num_experts")


@dataclass(frozen=True)
class GpuNode:
    """What the rule needs of the nodes an engine may run on (the smallest of them)."""

    gpu_memory_bytes: int
    cpus: float


@dataclass(frozen=True)
class ModelSize:
    """What the rule needs of the model: its weights, and the KV cache one token takes."""

    weights_bytes: int
    kv_bytes_per_token: int | None = None
    #: The model's context (its config's ``max_position_embeddings``), vLLM's ``max_model_len`` default.
    max_position_embeddings: int | None = None


@dataclass(frozen=True)
class LayoutChoice:
    """How many engine replicas the job runs on its GPU, who chose, and why."""

    #: None where the job's settings chose: their replicas may each have GPUs of their own.
    replicas_per_gpu: int | None
    chosen_by: Literal["the job's settings", "the default rule"]
    reason: str
    #: Each replica's KV cache where several share the GPU.
    kv_cache_bytes: int | None = None

    def as_manifest(self) -> dict[str, int | str | None]:
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


def kv_cache_bytes(spec: BatchInferenceSpec, model: ModelSize) -> int | None:
    """Each replica's KV cache: room for one sequence of the engine's ``max_model_len`` (the job's, else
    the model's context), and never under :data:`MIN_KV_CACHE_BYTES`; None where that is not known."""
    max_model_len = spec.engine_kwargs.get("max_model_len") or model.max_position_embeddings
    if model.kv_bytes_per_token is None or not max_model_len:
        return None
    one_sequence = ONE_SEQUENCE_MARGIN * int(max_model_len) * model.kv_bytes_per_token
    return max(MIN_KV_CACHE_BYTES, math.ceil(one_sequence / GIB) * GIB)


def replicas_that_fit(gpu: GpuNode, weights_bytes: int, kv_bytes: int) -> tuple[int, str]:
    """How many replicas one GPU of ``gpu``'s node holds, and which limit decided it."""
    per_replica = weights_bytes + ENGINE_OVERHEAD_BYTES + kv_bytes
    by_memory = math.floor(0.9 * gpu.gpu_memory_bytes / per_replica)
    by_cores = math.floor((gpu.cpus - CORES_KEPT_FREE) / CORES_PER_REPLICA)
    limits = {
        f"GPU memory ({gpu.gpu_memory_bytes / GIB:.0f} GiB for {weights_bytes / GIB:.1f} GiB of weights "
        f"+ {(ENGINE_OVERHEAD_BYTES + kv_bytes) / GIB:.0f} GiB a replica, {kv_bytes / GIB:.0f} GiB of it "
        "KV cache)": by_memory,
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
        return LayoutChoice(None, "the job's settings", f"set by {', '.join(own)}")
    one = "one replica on one GPU"
    if spec.openai_endpoint is not None:
        return LayoutChoice(1, "the default rule", f"{one}: an OpenAI batch's lines set their own max_tokens")
    if spec.image_column is not None:
        return LayoutChoice(1, "the default rule", f"{one}: not measured for this kind of job")
    if not short_generation(spec):
        return LayoutChoice(
            1,
            "the default rule",
            f"{one}: long generations (max_tokens over "
            f"{SHORT_GENERATION_MAX_TOKENS}) keep one engine's GPU busy",
        )
    return None


def choose(spec: BatchInferenceSpec, gpu: GpuNode | None, model: ModelSize | None) -> LayoutChoice:
    """The layout for ``spec`` where the smallest GPU node alive is ``gpu`` (None: none alive) and the
    model is ``model`` (None: its size is not known before its engine fetches it)."""
    decided = decided_without_the_cluster(spec)
    if decided is not None:
        return decided
    one = "one replica on one GPU"
    if gpu is None:
        return LayoutChoice(1, "the default rule", f"{one}: no GPU node was alive as the job started")
    if model is None:
        return LayoutChoice(
            1, "the default rule", f"{one}: the model's size is not known before its engine fetches it"
        )
    kv_bytes = kv_cache_bytes(spec, model)
    if kv_bytes is None:
        return LayoutChoice(
            1, "the default rule", f"{one}: the KV cache one sequence needs is not known (no config)"
        )
    replicas, limit = replicas_that_fit(gpu, model.weights_bytes, kv_bytes)
    why = f"{replicas} replica(s) on one GPU for short generations, limited by {limit}"
    return LayoutChoice(replicas, "the default rule", why, kv_cache_bytes=kv_bytes)


def applied(spec: BatchInferenceSpec, choice: LayoutChoice) -> BatchInferenceSpec:
    """``spec`` with the layout ``choice`` made, for the engine stage: its fingerprint is not the job's
    (the job's spec stays what binds its staged rows)."""
    if choice.chosen_by == "the job's settings":
        return spec
    replicas = choice.replicas_per_gpu or 1
    if replicas == 1 or choice.kv_cache_bytes is None:
        return spec.model_copy(update={"concurrency": 1})
    engine_kwargs = {
        **spec.engine_kwargs,
        "gpu_memory_utilization": round(GPU_MEMORY_SHARE / replicas, 3),
        "kv_cache_memory_bytes": choice.kv_cache_bytes,
    }
    return spec.model_copy(
        update={
            "concurrency": replicas,
            "replica_resources": {"GPU": round(1 / replicas, 4), "CPU": 1.0},
            "engine_kwargs": engine_kwargs,
        }
    )


# -- what the rule reads of the cluster --------------------------------------------------------------


def model_size(model_source: str) -> ModelSize | None:
    """The model's size as this node has it: its weight files (those vLLM loads), else its config's
    count (a model loaded with dummy weights); None for a model not on this node (a Hugging Face id not
    fetched yet) or one the config cannot size (a mixture of experts)."""
    folder = model_source
    if not os.path.isdir(folder):
        folder = _hugging_face_snapshot(model_source) or ""
        if not os.path.isdir(folder):
            return None
    config = _config(os.path.join(folder, "config.json"))
    names = os.listdir(folder)  # the folder's own files: a copy in original/ or a checkpoint's are not loaded
    for suffix in WEIGHT_SUFFIXES:
        weights = sum(os.path.getsize(os.path.join(folder, name)) for name in names if name.endswith(suffix))
        if weights:
            break
    else:
        weights = _dense_weights_bytes(config) or 0
    if not weights:
        return None
    return ModelSize(
        weights, _kv_bytes_per_token(config), _positive_int(config.get("max_position_embeddings"))
    )


def _hugging_face_snapshot(model_id: str) -> str | None:
    try:
        from huggingface_hub import snapshot_download

        return str(snapshot_download(model_id, local_files_only=True))
    except Exception:  # noqa: BLE001 - not in this node's cache (or not an id): not known yet
        return None


def _config(path: str) -> dict[str, object]:
    try:
        with open(path, encoding="utf-8") as file:
            config = json.load(file)
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _dense_weights_bytes(config: dict[str, object]) -> int | None:
    """A dense decoder's parameters from its config (embeddings, attention, MLP), 2 bytes each."""
    hidden, layers = _positive_int(config.get("hidden_size")), _positive_int(config.get("num_hidden_layers"))
    intermediate, vocab = (
        _positive_int(config.get("intermediate_size")),
        _positive_int(config.get("vocab_size")),
    )
    heads = _positive_int(config.get("num_attention_heads"))
    kv_heads = _positive_int(config.get("num_key_value_heads")) or heads
    if not (hidden and layers and intermediate and vocab and heads and kv_heads):
        return None
    if any(config.get(key) for key in _EXPERT_KEYS):
        return None
    head_dim = hidden // heads
    attention = 2 * hidden * hidden + 2 * hidden * kv_heads * head_dim
    return 2 * (2 * vocab * hidden + layers * (attention + 3 * hidden * intermediate))


def _kv_bytes_per_token(config: dict[str, object]) -> int | None:
    """Keys and values of every layer for one token, 2 bytes each (vLLM's default KV cache type)."""
    hidden, layers = _positive_int(config.get("hidden_size")), _positive_int(config.get("num_hidden_layers"))
    heads = _positive_int(config.get("num_attention_heads"))
    if not (hidden and layers and heads):
        return None
    kv_heads = _positive_int(config.get("num_key_value_heads")) or heads
    head_dim = _positive_int(config.get("head_dim")) or hidden // heads
    return 2 * layers * kv_heads * head_dim * 2


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
        out = subprocess.run(
            [smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
        return int(float(out.split()[0]) * 2**20)  # MiB
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def _node_facts(model_source: str) -> tuple[int | None, ModelSize | None]:
    """On a GPU node: its first GPU's memory, and the model's size as that node has it."""
    return _gpu_memory_bytes(), model_size(model_source)


def probe(spec: BatchInferenceSpec, model_source: str) -> tuple[GpuNode | None, ModelSize | None]:
    """The smallest of the alive GPU nodes a replica may run on (of ``spec.accelerator_type`` where set:
    its GPU memory, its cores) and the model's size there; no node where none is alive (a GPU group
    that scales up from zero). A task of no CPU and no GPU reads each node."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    wanted = f"accelerator_type:{spec.accelerator_type}" if spec.accelerator_type else None
    nodes = [
        node
        for node in ray.nodes()
        if node.get("Alive")
        and node["Resources"].get("GPU", 0) >= 1
        and (wanted is None or wanted in node["Resources"])
    ]
    if not nodes:
        return None, None
    facts = ray.remote(num_cpus=0)(_node_facts)
    read = ray.get(
        [
            facts.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
            ).remote(model_source)
            for node in nodes
        ],
        timeout=120,
    )
    memories = [memory for memory, _ in read]
    model = next((size for _, size in read if size is not None), None)
    if any(memory is None for memory in memories):  # a node whose GPU cannot be read: not sized
        return None, model
    cores = min(float(node["Resources"].get("CPU", 0)) for node in nodes)
    return GpuNode(
        gpu_memory_bytes=min(memory for memory in memories if memory is not None), cpus=cores
    ), model


def engine_layout(spec: BatchInferenceSpec, model_source: str) -> tuple[BatchInferenceSpec, LayoutChoice]:
    """The spec the engine stage runs with, and the layout choice behind it (logged)."""
    choice = decided_without_the_cluster(spec)
    if choice is None:
        choice = choose(spec, *probe(spec, model_source))
    per_gpu = choice.replicas_per_gpu if choice.replicas_per_gpu is not None else "the job's"
    log.info(
        "Engine layout: %s replica(s) per GPU, chosen by %s: %s.", per_gpu, choice.chosen_by, choice.reason
    )
    return applied(spec, choice), choice
