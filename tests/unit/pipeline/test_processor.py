"""pipeline/generate/processor.py: the driver builds the ray.data.llm processor without vLLM, torch
or transformers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from airflow_provider_raybatch.pipeline.generate import processor
from tests.unit.pipeline.ray_env import run_in_ray_env

ENGINE_LIBRARIES = ("vllm", "torch", "transformers")

# The driver's build as run_batch makes it (run._processor, in a thread beside the reads), in a fresh
# interpreter of the cluster's environment.
# No cluster: ray.init is a no-op and, with auto-connect off, Ray's telemetry actor is skipped (Ray
# swallows that failure); the report it would send is recorded instead.
_BUILD = """
import json, sys
import ray
ray.init = lambda *args, **kwargs: None
from ray.llm._internal.batch.observability.usage_telemetry import usage
usage.TelemetryAgent.push_telemetry_report = lambda self, report: reports.append(report.model_dump())
reports = []
from airflow_provider_raybatch.pipeline import run
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec
spec = BatchInferenceSpec(model=MODEL, input_uri="/in/rows.jsonl", output_uri="/out/", user_template="{text}",
                          replica_resources={"CPU": 1})
from airflow_provider_raybatch.pipeline.stage.parts import PartWriter
parts = PartWriter("/out/_staging/k", "parquet", count_labels=False)
# In its own thread, as run_batch builds it.
built, lease = run._build_while_reading(spec, MODEL, parts).result()
architectures = [report["model_architecture"] for report in reports]
# On a warm pool (keep_warm_seconds): the engine stage sends rows to the pool, and its engine settings
# and resources go to the pool's replicas (built the same way, without the engine libraries).
warm = run._processor(spec.model_copy(update={"keep_warm_seconds": 60.0}), MODEL, parts)
warm_stage = warm.stages["vLLMEngineStage"]
from airflow_provider_raybatch.pipeline.generate import stage_swap
pool = stage_swap.pool_of(warm)
# A job of the same model whose rows carry messages renders its own prompts (they may hold images).
messages = run._processor(spec.model_copy(update={"keep_warm_seconds": 60.0, "user_template": None,
                                                  "messages_column": "messages"}), MODEL, parts)
messages_stage = messages.stages["vLLMEngineStage"]
# A completions job of the same model has no chat template: the same pool still (one engine per model).
completions = run._processor(spec.model_copy(update={"keep_warm_seconds": 60.0, "user_template": None,
                                                     "openai_endpoint": "/v1/completions"}), MODEL, parts)
# An OpenAI batch's sampling fields come from its lines (run._fields_to_fill): built after the reads.
openai_spec = spec.model_copy(update={"openai_endpoint": "/v1/chat/completions", "user_template": None})
print(json.dumps({
    "loaded": sorted(m for m, mod in sys.modules.items() if mod and m.split(".")[0] in ENGINE_LIBRARIES),
    "left_in_sys_modules": sorted(m for m in ENGINE_LIBRARIES if m in sys.modules),
    "udfs": {name: f"{stage.fn.__module__}.{stage.fn.__name__}" for name, stage in built.stages.items()},
    "lease": type(lease).__name__, "room_needs": getattr(lease, "needs", None),
    "warm_udf": f"{warm_stage.fn.__module__}.{warm_stage.fn.__name__}",
    "warm_stages": list(warm.stages),
    "pool_chat_template": sorted(pool.chat_template or {}),
    "engine_kwargs": sorted(pool.engine_kwargs),
    "warm_stage_resources": {k: warm_stage.map_batches_kwargs.get(k)
                             for k in ("num_cpus", "num_gpus", "resources")},
    "pool": {"replicas": pool.replicas,
             "resources": {k: v for k, v in pool.actor_options.items() if k != "runtime_env"},
             "model": pool.engine_kwargs["model"], "kwargs": sorted(warm_stage.fn_constructor_kwargs)},
    "render_in_pool": warm_stage.fn_constructor_kwargs["raybatch_render_in_pool"],
    "messages": {"stages": list(messages.stages),
                 "render_in_pool": messages_stage.fn_constructor_kwargs["raybatch_render_in_pool"],
                 "same_pool": stage_swap.pool_of(messages).fingerprint == pool.fingerprint},
    "completions": {"stages": list(completions.stages),
                    "chat_template": stage_swap.pool_of(completions).chat_template,
                    "same_pool": stage_swap.pool_of(completions).fingerprint == pool.fingerprint},
    "architectures": architectures,
    "openai_built_while_reading": run._build_while_reading(openai_spec, MODEL, parts) is not None,
}))
"""


@pytest.fixture
def model_folder(tmp_path: Path) -> Path:
    """Only what the driver reads of a model: config.json (for Ray's telemetry)."""
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    return tmp_path


def test_the_driver_builds_the_processor_without_the_engine_libraries(model_folder: Path) -> None:
    report = run_in_ray_env(
        f"MODEL = {str(model_folder)!r}\nENGINE_LIBRARIES = {ENGINE_LIBRARIES!r}\n{_BUILD}"
    )

    assert report["loaded"] == []
    assert report["left_in_sys_modules"] == []  # no stand-in or block outlives the build
    # Ray's own stages with our chat-template and engine UDFs, by name: the replicas import the real
    # libraries.
    ours = "airflow_provider_raybatch.pipeline"
    assert report["udfs"] == {
        "ChatTemplateStage": f"{ours}.prompt.chat_template.RaybatchChatTemplateUDF",
        "TokenizeStage": "ray.llm._internal.batch.stages.tokenize_stage.TokenizeUDF",
        "vLLMEngineStage": f"{ours}.generate.engine_actor.RaybatchvLLMEngineStageUDF",
    }
    assert report["architectures"] == ["LlamaForCausalLM"]  # Ray's telemetry still gets it
    # Its own engines: no pool to hold; what makes room for them knows what one replica needs.
    assert report["lease"] == "RoomKeeper" and report["room_needs"] == {"CPU": 1.0}
    assert report["warm_udf"] == f"{ours}.generate.pooled_stage.RaybatchPooledEngineStageUDF"
    # The warm replica renders the chat template and its engine tokenizes: the job starts neither stage.
    assert report["warm_stages"] == ["vLLMEngineStage"]
    assert report["pool_chat_template"] == [
        "chat_template",
        "chat_template_kwargs",
        "model",
        "trust_remote_code",
    ]
    # The job's stage holds nothing; the pool's replica holds what the engine stage would have.
    assert report["warm_stage_resources"] == {"num_cpus": 0, "num_gpus": None, "resources": None}
    assert report["pool"] == {
        "replicas": 1,
        "resources": {"num_cpus": 1},
        "model": str(model_folder),
        "kwargs": ["raybatch_pool", "raybatch_render_in_pool", "raybatch_staging", "task_type"],
    }
    assert report["render_in_pool"] is True
    # A job whose rows carry messages keeps its own chat-template stage and the replicas render none
    # of its rows, on the same pool: one engine per model and settings, whatever the prompts' source.
    assert report["messages"] == {
        "stages": ["ChatTemplateStage", "vLLMEngineStage"],
        "render_in_pool": False,
        "same_pool": True,
    }
    # The chat template is each job's, outside the engine's settings: a completions job (none) shares
    # the chat jobs' engine too.
    assert "raybatch_chat_template" not in report["engine_kwargs"]
    assert report["completions"] == {"stages": ["vLLMEngineStage"], "chat_template": None, "same_pool": True}
    assert report["openai_built_while_reading"] is False


def test_a_deferred_module_imports_the_real_one_on_first_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(processor, "DEFERRED", ("colorsys",))
    monkeypatch.delitem(sys.modules, "colorsys")
    with processor.engine_libraries_held_back():
        import colorsys as stand_in

        assert isinstance(stand_in, processor._DeferredModule)
        assert stand_in.hsv_to_rgb(0.0, 0.0, 1.0) == (1.0, 1.0, 1.0)  # a use imports it
        real = sys.modules["colorsys"]
        assert real is not stand_in
    assert stand_in.rgb_to_hsv is real.rgb_to_hsv  # a module that bound the stand-in keeps working
    assert "colorsys" in sys.modules


def test_vllm_cannot_be_imported_while_building_and_can_afterwards(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(processor, "BLOCKED", ("colorsys",))
    monkeypatch.delitem(sys.modules, "colorsys")
    with processor.engine_libraries_held_back(), pytest.raises(ImportError):
        import colorsys  # noqa: F401
    import colorsys as later

    assert later.hsv_to_rgb(0.0, 0.0, 1.0) == (1.0, 1.0, 1.0)


_TELEMETRY = """
import json, ray
ray.init = lambda *args, **kwargs: None
from ray.llm._internal.batch.observability.usage_telemetry import usage
waited, sent = [], []
ray.get = lambda ref, *args, **kwargs: waited.append(ref)
class Record:  # the telemetry actor's method: a report sent to it returns a ref to wait for
    def remote(self, report):
        sent.append(report.model_dump()["model_architecture"])
        return "ref"
class Actor:
    record = Record()
    _update_record_tag_func = type("Call", (), {"remote": lambda self, *args: None})()
class Options:
    def remote(self):
        return Actor()
usage._TelemetryAgent.options = lambda **options: Options()  # as if the cluster made the actor
from airflow_provider_raybatch.pipeline import run
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec
from airflow_provider_raybatch.pipeline.stage.parts import PartWriter
spec = BatchInferenceSpec(model=MODEL, input_uri="/in/rows.jsonl", output_uri="/out/", user_template="{text}",
                          replica_resources={"CPU": 1})
run._processor(spec, MODEL, PartWriter("/out/_staging/k", "parquet", count_labels=False))
built_sent, built_waited = list(sent), list(waited)
usage.TelemetryAgent().push_telemetry_report(usage.BatchModelTelemetry(model_architecture="Later"))
print(json.dumps({"built": [built_sent, built_waited], "later": [sent[len(built_sent):], waited]}))
"""


def test_the_build_sends_rays_telemetry_without_waiting_for_its_actor_to_start(model_folder: Path) -> None:
    """On a cluster's first job Ray's telemetry actor starts inside the build, and a warm
    pool's cold replica was asked for only then, 8 s into a 10.5 s read instead of at its start."""
    report = run_in_ray_env(f"MODEL = {str(model_folder)!r}\n{_TELEMETRY}")
    assert report["built"] == [["LlamaForCausalLM"], []]  # the report went to Ray, not waited for
    assert report["later"] == [["Later"], ["ref"]]  # outside our build, Ray's own: sent and waited for
