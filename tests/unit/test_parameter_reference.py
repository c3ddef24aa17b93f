"""docs/parameters.md is what scripts/make_parameter_reference.py makes from the code, and covers it all."""

from __future__ import annotations

import difflib
import importlib.util
import inspect
from pathlib import Path
from types import ModuleType

import pytest

from airflow_provider_raybatch.operators.llm_batch import SPEC_PARAMETERS, RayLLMBatchOperator
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

ROOT = Path(__file__).resolve().parents[2]

#: Settings of Ray Data LLM the table must map, whether or not Ray is importable here (Ray 2.57 to 2.60,
#: and the older flat names); where it is, every setting of the installed Ray is checked as well.
KNOWN_RAY_SETTINGS = (
    "model_source",
    "engine_kwargs",
    "batch_size",
    "concurrency",
    "accelerator_type",
    "max_concurrent_batches",
    "apply_chat_template",
    "chat_template",
    "chat_template_kwargs",
    "tokenize",
    "detokenize",
    "has_image",
    "runtime_env",
    "task_type",
    "dynamic_lora_loading_path",
    "placement_group_config",
    "preprocess",
    "postprocess",
    "preprocess_map_kwargs",
    "postprocess_map_kwargs",
    "builder_kwargs",
    "max_pending_requests",
    "max_tasks_in_flight_per_actor",
    "should_continue_on_error",
    "log_engine_metrics",
    "chat_template_stage",
    "tokenize_stage",
    "detokenize_stage",
    "prepare_multimodal_stage",
    "resources_per_bundle",
    "experimental",
)


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "make_parameter_reference", ROOT / "scripts" / "make_parameter_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generator = _load_generator()


def test_page_is_up_to_date() -> None:
    committed = (ROOT / "docs" / "parameters.md").read_text(encoding="utf-8")
    page = generator.render()
    if page != committed:
        diff = difflib.unified_diff(
            committed.splitlines(), page.splitlines(), "docs/parameters.md", "generated", lineterm="", n=0
        )
        shown = "\n".join(list(diff)[:20])
        pytest.fail(
            f"docs/parameters.md is out of date with the code: run `{generator.COMMAND}` and "
            f"commit the page.\n{shown}",
            pytrace=False,
        )


def test_every_argument_and_spec_field_has_a_row() -> None:
    page = generator.render()
    arguments = [
        name
        for name in inspect.signature(RayLLMBatchOperator.__init__).parameters
        if name not in ("self", "kwargs")
    ]
    missing = [name for name in arguments if f"\n| `{name}` |" not in page]
    assert not missing, f"arguments without a row: {missing}"
    fields = set(BatchInferenceSpec.model_fields)
    assert set(SPEC_PARAMETERS) == fields - {"run_key"}
    assert set(SPEC_PARAMETERS) <= set(arguments)
    assert "`run_key`" in page  # the one field that is no argument: the intro says where it comes from


def _installed_ray_settings() -> set[str] | None:
    """Every setting of the installed Ray Data LLM's vLLM processor, or None where Ray is not importable
    (the Airflow virtualenv: the cluster's libraries are not there)."""
    try:
        from ray.data.llm import build_processor, vLLMEngineProcessorConfig
    except ImportError:
        return None
    parameters = set(inspect.signature(build_processor).parameters) - {"config"}
    return set(vLLMEngineProcessorConfig.model_fields) | parameters


def test_every_ray_data_llm_setting_is_mapped() -> None:
    mapped = generator.ray_setting_names()
    installed = _installed_ray_settings()
    expected = set(KNOWN_RAY_SETTINGS) | (installed or set())
    missing = sorted(expected - mapped)
    assert not missing, f"Ray Data LLM settings missing from RAY_DATA_LLM_SETTINGS: {missing}"
    section = generator.render().partition("## From Ray Data LLM to this operator")[2]
    assert all(f"`{name}`" in section for name in mapped)
    assert all(setting.ours.strip() and setting.where.strip() for setting in generator.RAY_DATA_LLM_SETTINGS)
