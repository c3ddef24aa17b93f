"""The provider's exception types, where DAGs import (and catch) them from.

They live in the shared layer (:mod:`airflow_provider_raybatch.shared.exceptions`), and are named by
this path in tracebacks, task logs and Airflow's import errors.
"""

from __future__ import annotations

from airflow_provider_raybatch.shared.exceptions import (
    BatchSpecError,
    ClusterLayoutError,
    RayAuthError,
    RayBatchConfigError,
    RayBatchError,
    RayBatchRowsFailedError,
    RayHookError,
    RayJobAlreadyExistsError,
    RayJobFailedError,
    RayJobNotFoundError,
    RayJobTimeoutError,
    RayTriggerEventError,
    RayUnavailableError,
    RayUnexpectedResponseError,
)

__all__ = [
    "RayBatchError",
    "BatchSpecError",
    "RayBatchConfigError",
    "RayHookError",
    "RayUnavailableError",
    "RayAuthError",
    "RayJobNotFoundError",
    "RayJobAlreadyExistsError",
    "RayUnexpectedResponseError",
    "RayJobFailedError",
    "RayBatchRowsFailedError",
    "RayJobTimeoutError",
    "RayTriggerEventError",
    "ClusterLayoutError",
]
