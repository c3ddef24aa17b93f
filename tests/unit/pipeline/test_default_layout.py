"""The default engine layout: how many replicas share a GPU when the job sets no layout of its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_provider_raybatch.pipeline.generate import default_layout
from airflow_provider_raybatch.pipeline.generate.default_layout import GIB, GpuNode, ModelSize
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec
from tests.unit.pipeline.ray_env import run_in_ray_env

#: The measured machine (bench/RESULTS.md 18b): one H200 (143,771 MiB) on a 16-core node.
H200_NODE = GpuNode(gpu_memory_bytes=143_771 * 2**20, cpus=16)
H100_NODE = GpuNode(gpu_memory_bytes=81_559 * 2**20, cpus=16)
A100_40GB_NODE = GpuNode(gpu_memory_bytes=40_960 * 2**20, cpus=16)
EIGHT_B_WEIGHTS = 16 * 10**9
#: Llama 3.1 8B's config.json: 8.03 billion parameters, 128 KiB of KV cache a token, 131,072 of context.
LLAMA_8B_CONFIG = {
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
}
KV_A_TOKEN = 2 * 32 * 8 * 128 * 2
#: The 8B model as the benchmarks ran it: its engine's max_model_len 512, so its KV cache the minimum.
EIGHT_B = ModelSize(EIGHT_B_WEIGHTS, KV_A_TOKEN, 131072)
CLASSIFY = {"temperature": 0, "max_tokens": 16, "structured_outputs": {"choice": ["retail", "energy"]}}


def _spec(**overrides: object) -> BatchInferenceSpec:
    params: dict[str, object] = {
        "model": "/models/llama-8b",
        "input_uri": "/data/in.csv",
        "output_uri": "/data/out",
        "user_template": "Classify {Company}",
        "sampling_params": CLASSIFY,
        "engine_kwargs": {"max_model_len": 512},
    }
    return BatchInferenceSpec(**{**params, **overrides})


def test_the_seeds_classification_on_an_h200_gets_three_replicas_on_its_gpu() -> None:
    spec = _spec()
    choice = default_layout.choose(spec, H200_NODE, EIGHT_B)
    assert (choice.replicas_per_gpu, choice.chosen_by) == (3, "the default rule")
    assert "limited by the measured knee" in choice.reason

    engine_spec = default_layout.applied(spec, choice)
    assert engine_spec.concurrency == 3
    assert engine_spec.replica_resources == {"GPU": 0.3333, "CPU": 1.0}
    assert engine_spec.engine_kwargs["gpu_memory_utilization"] == 0.267
    assert engine_spec.engine_kwargs["kv_cache_memory_bytes"] == 4 * GIB
    # The job's spec is untouched: it binds the staged rows and names the job.
    assert spec.concurrency is None and spec.replica_resources is None
    assert spec.engine_kwargs == {"max_model_len": 512}
    assert choice.as_manifest() == {
        "replicas_per_gpu": 3,
        "chosen_by": "the default rule",
        "reason": choice.reason,
    }


@pytest.mark.parametrize(
    ("node", "weights", "replicas", "limit"),
    [
        (H100_NODE, EIGHT_B_WEIGHTS, 3, "GPU memory (80 GiB for 14.9 GiB of weights + 8 GiB a replica"),
        (A100_40GB_NODE, 6 * 10**9, 2, "GPU memory (40 GiB for 5.6 GiB of weights + 8 GiB a replica"),
        (GpuNode(143_771 * 2**20, cpus=8), EIGHT_B_WEIGHTS, 2, "the node's 8 cores"),
        (H200_NODE, 140 * 10**9, 1, "GPU memory"),  # a 70B model: one replica, as before
        (A100_40GB_NODE, EIGHT_B_WEIGHTS, 1, "GPU memory"),  # nothing fits twice: still one
        (GpuNode(143_771 * 2**20, cpus=4), EIGHT_B_WEIGHTS, 1, "the node's 4 cores"),
    ],
)
def test_the_gpus_memory_and_the_nodes_cores_bound_the_replicas(
    node: GpuNode, weights: int, replicas: int, limit: str
) -> None:
    choice = default_layout.choose(_spec(), node, ModelSize(weights, KV_A_TOKEN, 131072))
    assert choice.replicas_per_gpu == replicas
    assert f"limited by {limit}" in choice.reason


def test_each_replicas_kv_cache_holds_one_sequence_of_the_models_whole_context() -> None:
    """Without max_model_len the engine takes the model's context (131,072 tokens for Llama 3.1 8B:
    16 GiB of KV cache): vLLM refuses to start an engine whose KV cache cannot hold one such sequence."""
    whole_context = _spec(engine_kwargs={})
    on_h200 = default_layout.choose(whole_context, H200_NODE, EIGHT_B)
    assert (on_h200.replicas_per_gpu, on_h200.kv_cache_bytes) == (3, 18 * GIB)  # 16 GiB x 1.1, whole GiB
    engine_kwargs = default_layout.applied(whole_context, on_h200).engine_kwargs
    assert engine_kwargs["kv_cache_memory_bytes"] == 18 * GIB
    on_h100 = default_layout.choose(whole_context, H100_NODE, EIGHT_B)  # 15 + 4 + 18 GiB: two do not fit
    assert on_h100.replicas_per_gpu == 1 and "18 GiB of it KV cache" in on_h100.reason
    assert default_layout.applied(whole_context, on_h100).engine_kwargs == {}
    # A short context, or none known: the minimum; no config to size a token's KV: one replica.
    assert default_layout.choose(_spec(), H200_NODE, EIGHT_B).kv_cache_bytes == 4 * GIB
    unsized = default_layout.choose(_spec(), H200_NODE, ModelSize(EIGHT_B_WEIGHTS))
    assert unsized.replicas_per_gpu == 1 and "KV cache one sequence needs is not known" in unsized.reason


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"concurrency": 2}, "concurrency"),
        ({"concurrency": (1, 4)}, "concurrency"),
        ({"replica_resources": {"CPU": 1}}, "replica_resources"),
        ({"engine_kwargs": {"tensor_parallel_size": 2}}, "engine_kwargs['tensor_parallel_size']"),
        ({"engine_kwargs": {"gpu_memory_utilization": 0.5}}, "engine_kwargs['gpu_memory_utilization']"),
        ({"engine_kwargs": {"kv_cache_memory_bytes": GIB}}, "engine_kwargs['kv_cache_memory_bytes']"),
    ],
)
def test_a_layout_the_job_sets_is_left_as_it_is(overrides: dict[str, object], named: str) -> None:
    spec = _spec(**overrides)
    choice = default_layout.choose(spec, H200_NODE, EIGHT_B)
    assert choice.chosen_by == "the job's settings" and choice.reason == f"set by {named}"
    assert default_layout.applied(spec, choice) is spec
    assert choice.replicas_per_gpu is None  # its replicas may each have GPUs of their own


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ({"sampling_params": {"max_tokens": 128}}, "long generations"),
        ({"sampling_params": {"max_tokens": 33}}, "long generations"),
        ({"image_column": "image"}, "not measured for this kind of job"),
        (
            {"openai_endpoint": "/v1/chat/completions", "user_template": None, "sampling_params": {}},
            "lines set their own max_tokens",
        ),
    ],
)
def test_one_replica_where_one_engine_keeps_its_gpu_busy_or_it_was_not_measured(
    overrides: dict[str, object], why: str
) -> None:
    spec = _spec(**overrides)
    choice = default_layout.choose(spec, H200_NODE, EIGHT_B)
    assert (choice.replicas_per_gpu, choice.chosen_by) == (1, "the default rule")
    assert why in choice.reason
    assert default_layout.applied(spec, choice).concurrency == 1


def test_short_is_a_choice_or_few_tokens_vllms_default_of_16_included() -> None:
    assert default_layout.short_generation(_spec(sampling_params={}))  # vLLM's max_tokens: 16
    assert default_layout.short_generation(_spec(sampling_params={"max_tokens": 32}))
    assert not default_layout.short_generation(_spec(sampling_params={"max_tokens": 64}))
    long_choice = {"max_tokens": 512, "structured_outputs": {"choice": ["a", "b"]}}
    assert default_layout.short_generation(_spec(sampling_params=long_choice))


def test_one_replica_where_the_cluster_has_no_gpu_or_the_model_size_is_unknown() -> None:
    no_gpu = default_layout.choose(_spec(), None, None).reason
    assert no_gpu == "one replica on one GPU: no GPU node was alive as the job started"
    unknown = default_layout.choose(_spec(), H200_NODE, None)
    assert unknown.replicas_per_gpu == 1 and "size is not known" in unknown.reason


def test_the_cluster_is_read_only_where_the_rule_needs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    probed: list[str] = []

    def probe(spec: BatchInferenceSpec, model_source: str) -> tuple[GpuNode, ModelSize]:
        probed.append(model_source)
        return H200_NODE, EIGHT_B

    monkeypatch.setattr(default_layout, "probe", probe)
    engine_spec, choice = default_layout.engine_layout(_spec(concurrency=1), "/local/copy")
    assert (choice.chosen_by, probed) == ("the job's settings", [])
    engine_spec, choice = default_layout.engine_layout(_spec(), "/local/copy")
    assert (choice.replicas_per_gpu, choice.chosen_by, probed) == (3, "the default rule", ["/local/copy"])
    assert engine_spec.concurrency == 3


def test_a_models_size_is_the_weight_files_vllm_loads_else_its_config(tmp_path: Path) -> None:
    weights = tmp_path / "with-weights"
    (weights / "original").mkdir(parents=True)
    (weights / "model-00001.safetensors").write_bytes(b"\0" * 1000)
    (weights / "model-00002.safetensors").write_bytes(b"\0" * 500)
    (weights / "pytorch_model.bin").write_bytes(b"\0" * 3000)  # vLLM loads the safetensors alone
    (weights / "original" / "consolidated.00.pth").write_bytes(b"\0" * 7000)  # the hub's copy: not loaded
    (weights / "tokenizer.json").write_bytes(b"\0" * 99)  # not weights
    (weights / "config.json").write_text(json.dumps(LLAMA_8B_CONFIG))
    assert default_layout.model_size(str(weights)) == ModelSize(1500, KV_A_TOKEN, 131072)

    dummy = tmp_path / "config-only"  # a model loaded with dummy weights (the GPU benchmarks')
    dummy.mkdir()
    (dummy / "config.json").write_text(json.dumps(LLAMA_8B_CONFIG))
    size = default_layout.model_size(str(dummy))
    assert size is not None and size.weights_bytes == pytest.approx(2 * 8.03e9, rel=0.01)

    for name, config in {
        "experts": {**LLAMA_8B_CONFIG, "num_local_experts": 8},  # a mixture: the dense count is wrong
        "no-heads": {**LLAMA_8B_CONFIG, "num_attention_heads": 0},
        "negative": {**LLAMA_8B_CONFIG, "num_hidden_layers": -32},
        "a-list": [1, 2],
    }.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        assert default_layout.model_size(str(tmp_path / name)) is None, name
    (tmp_path / "empty").mkdir()
    assert default_layout.model_size(str(tmp_path / "empty")) is None
    assert default_layout.model_size("no-such-org/no-such-model") is None


def test_the_probe_reads_the_gpu_node_through_ray(tmp_path: Path) -> None:
    """On a local Ray node that claims a GPU it has not: the probe's task runs there, finds no GPU
    memory to read (no NVML, no nvidia-smi) and the model's size; with no GPU node, nothing."""
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 4096)
    facts = run_in_ray_env(f"""
import dataclasses, json, ray
from airflow_provider_raybatch.pipeline.generate import default_layout
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec
spec = BatchInferenceSpec(
    model={str(tmp_path)!r}, input_uri="/in.csv", output_uri="/out", user_template="{{x}}"
)
ray.init(num_cpus=1, num_gpus=1, include_dashboard=False, logging_level="ERROR")
with_gpu = default_layout.probe(spec, {str(tmp_path)!r})
ray.shutdown()
ray.init(num_cpus=1, num_gpus=0, include_dashboard=False, logging_level="ERROR")
without = default_layout.probe(spec, {str(tmp_path)!r})
print(json.dumps([[gpu, size and dataclasses.asdict(size)] for gpu, size in (with_gpu, without)]))
""")
    model = {"weights_bytes": 4096, "kv_bytes_per_token": None, "max_position_embeddings": None}
    assert facts == [[None, model], [None, None]]
