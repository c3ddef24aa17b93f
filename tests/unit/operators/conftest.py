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
