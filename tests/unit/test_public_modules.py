"""Tests of the package's public module paths (specs.py, exceptions.py, manifest.py, utils/layout.py): the
names DAGs import from them are the shared layer's own objects, and the exceptions go by their public path."""

from __future__ import annotations

import importlib
import pickle

import pytest

import airflow_provider_raybatch.exceptions as public_exceptions
from airflow_provider_raybatch.shared import exceptions as shared_exceptions
from airflow_provider_raybatch.shared import run_manifest


@pytest.mark.parametrize(
    ("public", "shared", "named"),
    [
        (
            "specs",
            "shared.specs",
            {"BatchInferenceSpec", "DEFAULT_MAX_FAILED_FRACTION", "check_sampling_params"},
        ),
        (
            "exceptions",
            "shared.exceptions",
            {"BatchSpecError", "RayBatchRowsFailedError", "RayJobFailedError"},
        ),
        (
            "manifest",
            "shared.manifest",
            {"RunManifest", "HELD_STATUS", "failed_rows_verdict", "manifest_from_log"},
        ),
        ("utils.layout", "shared.layout", {"plan_layout", "LayoutPlan", "cluster_resources_from_api"}),
    ],
)
def test_a_public_path_names_the_shared_layer_s_own_objects(
    public: str, shared: str, named: set[str]
) -> None:
    public_module = importlib.import_module(f"airflow_provider_raybatch.{public}")
    homes = [importlib.import_module(f"airflow_provider_raybatch.{shared}"), run_manifest]
    assert named <= set(public_module.__all__)
    for name in public_module.__all__:
        home = next(module for module in homes if hasattr(module, name))
        assert getattr(public_module, name) is getattr(home, name), name


def test_every_exception_type_is_named_at_its_public_path() -> None:
    types = {
        name
        for name, value in vars(shared_exceptions).items()
        if isinstance(value, type) and issubclass(value, shared_exceptions.RayBatchError)
    }
    assert types == set(public_exceptions.__all__)


def test_the_manifest_s_model_is_named_where_dags_read_it() -> None:
    from airflow_provider_raybatch.manifest import DryRunManifest, RunManifest
    from airflow_provider_raybatch.shared.run_manifest import DryRunManifest as Dry
    from airflow_provider_raybatch.shared.run_manifest import RunManifest as Run

    assert (RunManifest, DryRunManifest) == (Run, Dry)


def test_an_exception_goes_by_its_public_path_and_pickles_there() -> None:
    error = shared_exceptions.BatchSpecError("Invalid batch job spec: concurrency=0 is invalid.")

    assert type(error).__module__ == "airflow_provider_raybatch.exceptions"
    assert public_exceptions.BatchSpecError is type(error)
    again = pickle.loads(pickle.dumps(error))
    assert (type(again), str(again)) == (type(error), str(error))
