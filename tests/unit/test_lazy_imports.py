"""Importing the provider, as Airflow does on every DAG parse, loads none of the heavy cluster libraries."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("ray", "vllm", "torch", "transformers", "pyarrow")
PROVIDER_MODULES = (
    "airflow_provider_raybatch",
    "airflow_provider_raybatch.hooks.ray",
    "airflow_provider_raybatch.operators.llm_batch",
    "airflow_provider_raybatch.sensors.ray",
    "airflow_provider_raybatch.triggers.ray",
    "airflow_provider_raybatch.specs",
)


def _loaded_after_importing_the_provider(top_names: tuple[str, ...]) -> list[str]:
    """The modules under ``top_names`` that importing the provider's modules loads, in a fresh interpreter."""
    code = (
        "import importlib, json, sys\n"
        f"for name in {PROVIDER_MODULES!r}: importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {top_names!r})))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_provider_imports_no_heavy_modules() -> None:
    assert _loaded_after_importing_the_provider(HEAVY) == []


def test_provider_imports_no_openlineage_client() -> None:
    # Airflow itself imports the OpenLineage provider's package info; the client and our lineage
    # module are loaded only when the OpenLineage listener asks the operator for its lineage.
    loaded = _loaded_after_importing_the_provider(("openlineage", "airflow_provider_raybatch"))
    assert [m for m in loaded if m.startswith("openlineage") or m.endswith(".lineage")] == []


def test_provider_info_is_registered_through_the_entry_point() -> None:
    from importlib.metadata import entry_points

    (entry,) = [
        e for e in entry_points(group="apache_airflow_provider") if e.value.startswith("airflow_provider_")
    ]
    info = entry.load()()
    assert info["package-name"] == "airflow-provider-raybatch"
    (connection_type,) = info["connection-types"]
    assert connection_type["connection-type"] == "ray"
    assert connection_type["hook-class-name"] == "airflow_provider_raybatch.hooks.ray.RayHook"
    modules = {
        m
        for kind in ("hooks", "operators", "sensors", "triggers")
        for e in info[kind]
        for m in e["python-modules"]
    }
    assert modules == {
        "airflow_provider_raybatch.hooks.ray",
        "airflow_provider_raybatch.operators.llm_batch",
        "airflow_provider_raybatch.sensors.ray",
        "airflow_provider_raybatch.triggers.ray",
    }
