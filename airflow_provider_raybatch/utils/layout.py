"""The replica layout a spec plans and its fit check, at the path the deployment guides name.

It lives in the shared layer (:mod:`airflow_provider_raybatch.shared.layout`).
"""

from __future__ import annotations

from airflow_provider_raybatch.shared.layout import (
    ACCELERATOR_LABEL,
    ACCELERATOR_RESOURCE_PREFIX,
    CLUSTER_NODES_ENDPOINT,
    DEFAULT_MAX_CONCURRENT_BATCHES,
    DEFAULT_WORKER_BUNDLE,
    ClusterResources,
    LayoutPlan,
    NodeResources,
    cluster_resources_from_api,
    plan_layout,
)

__all__ = [
    "CLUSTER_NODES_ENDPOINT",
    "DEFAULT_MAX_CONCURRENT_BATCHES",
    "ACCELERATOR_RESOURCE_PREFIX",
    "ACCELERATOR_LABEL",
    "DEFAULT_WORKER_BUNDLE",
    "NodeResources",
    "ClusterResources",
    "LayoutPlan",
    "plan_layout",
    "cluster_resources_from_api",
]
