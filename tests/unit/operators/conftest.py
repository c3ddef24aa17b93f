"""Fixtures shared by the operator tests."""

from __future__ import annotations

from typing import Any

import pytest
import respx

from tests.unit.operators.test_llm_batch import FakeCluster


@pytest.fixture
def cluster(ray_api: respx.MockRouter, job_payload: Any) -> FakeCluster:  # Any: the conftest factory.
    """A fake Ray Jobs API with no job yet (``cluster.add_job`` adds some)."""
    return FakeCluster(ray_api, job_payload)


@pytest.fixture(autouse=True)
def _no_stops_asked_before() -> Any:  # Any: a fixture's generator
    """Each test starts with no job this process asked to stop: the tests' job ids repeat."""
    from airflow_provider_raybatch.operators import llm_batch

    llm_batch._STOPS_ASKED_HERE.clear()
    yield
    llm_batch._STOPS_ASKED_HERE.clear()
