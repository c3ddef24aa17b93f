"""The Ray Data LLM internals the pipeline builds on (pipeline/generate/ray_internals.py): all there on
the cluster's Ray, checked without importing vLLM in the driver, and a change named with the version."""

from __future__ import annotations

import types

import pytest

from airflow_provider_raybatch.pipeline.generate import ray_internals
from tests.unit.pipeline.ray_env import run_in_ray_env


def _modules_with(drop: str | None = None, drop_attribute: tuple[str, str] | None = None):
    """A stand-in import_module: every REQUIRED name present, except the ones asked dropped."""
    modules = {}
    for module_name, names in ray_internals.REQUIRED.items():
        module = types.ModuleType(module_name)
        for name, attributes in names.items():
            if f"{module_name}.{name}" == drop:
                continue
            kept = {a: None for a in attributes if drop_attribute != (name, a)}
            setattr(module, name, type(name, (), kept))
        modules[module_name] = module

    def import_module(name: str) -> types.ModuleType:
        if name not in modules:
            raise ImportError(f"No module named {name!r}")
        return modules[name]

    return modules, import_module


def test_nothing_is_missing_when_every_name_is_there() -> None:
    _, import_module = _modules_with()
    assert ray_internals.missing_internals(import_module) == []
    ray_internals.check_ray_internals("2.60.0", import_module)


def test_a_renamed_class_a_lost_method_and_a_moved_module_are_named_with_the_ray_version() -> None:
    engine_stage = "ray.llm._internal.batch.stages.vllm_engine_stage"
    modules, import_module = _modules_with(
        drop=f"{engine_stage}.vLLMEngineStageUDF", drop_attribute=("vLLMEngineWrapper", "_generate_async")
    )
    del modules["ray.llm._internal.batch.stages.tokenize_stage"]
    with pytest.raises(ray_internals.RayInternalsChanged) as raised:
        ray_internals.check_ray_internals("2.99.0", import_module)
    message = str(raised.value)
    assert message.startswith("Ray 2.99.0: the Ray Data LLM internals this provider builds on were renamed")
    assert f"tested with ({ray_internals.TESTED_RAY})" in message
    assert f"{engine_stage}.vLLMEngineStageUDF" in message
    assert f"{engine_stage}.vLLMEngineWrapper._generate_async" in message
    assert "ray.llm._internal.batch.stages.tokenize_stage (No module named" in message
    assert "before reading any row" in message


def test_a_library_missing_on_the_node_is_not_reported_as_a_change_of_ray_s() -> None:
    def import_module(name: str) -> types.ModuleType:
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    with pytest.raises(ModuleNotFoundError, match="torch"):
        ray_internals.check_ray_internals("2.60.0", import_module)


def test_a_dry_run_needs_only_the_prompt_stages() -> None:
    modules, import_module = _modules_with(
        drop="ray.llm._internal.batch.stages.vllm_engine_stage.vLLMEngineStageUDF"
    )
    ray_internals.check_ray_internals("2.60.0", import_module, dry_run=True)
    with pytest.raises(ray_internals.RayInternalsChanged, match="vLLMEngineStageUDF"):
        ray_internals.check_ray_internals("2.60.0", import_module)


_ON_RAY = """
import json, sys
import ray
from airflow_provider_raybatch.pipeline.generate import ray_internals
from airflow_provider_raybatch.pipeline.generate.processor import engine_libraries_held_back
with engine_libraries_held_back():
    missing = ray_internals.missing_internals()
    ray_internals.check_ray_internals(ray.__version__)
    from ray.llm._internal.batch.stages import vllm_engine_stage
print(json.dumps({"missing": missing, "version": ray.__version__,
                  "vllm_loaded": "vllm" in sys.modules and sys.modules["vllm"] is not None,
                  "row_failure_logger": vllm_engine_stage.logger.name}))
"""


@pytest.mark.timeout(300)
def test_the_cluster_s_ray_has_every_internal_and_the_check_loads_no_vllm() -> None:
    out = run_in_ray_env(_ON_RAY)
    assert out["missing"] == [], f"Ray {out['version']}: {out['missing']}"
    assert out["vllm_loaded"] is False  # the driver stays light (pipeline/generate/processor.py)
    # The logger a pool replica quietens (a shared replica's row failures reach another job's log).
    from airflow_provider_raybatch.pipeline.generate.pool_replica import ROW_FAILURE_LOGGER

    assert out["row_failure_logger"] == ROW_FAILURE_LOGGER
