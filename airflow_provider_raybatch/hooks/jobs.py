"""Ray's job states and job details: what the hook's job calls return.

Plain data, kept apart from the HTTP code: the answers' parsing
(:mod:`~airflow_provider_raybatch.hooks.answers`) builds them, and the operator, the sensor and the
trigger read them (through :mod:`~airflow_provider_raybatch.hooks.ray`, which re-exports them).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from airflow_provider_raybatch.shared.json_types import JsonObject


class JobStatus(str, enum.Enum):  # noqa: UP042 - StrEnum would change str() and format() of a status
    """Ray's job states (``ray.job_submission.JobStatus``)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    @property
    def is_terminal(self) -> bool:
        return self in (JobStatus.STOPPED, JobStatus.SUCCEEDED, JobStatus.FAILED)


@dataclass(frozen=True)
class JobInfo:
    """The parts of Ray's job details the provider uses."""

    job_id: str
    status: JobStatus
    message: str = ""
    entrypoint: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    error_type: str | None = None
    driver_exit_code: int | None = None
    start_time_ms: int | None = None
    end_time_ms: int | None = None

    @classmethod
    def from_api(cls, payload: JsonObject) -> JobInfo:
        """:raises KeyError, ValueError: not Ray's job details (no ``status``, or an unknown one)."""
        return cls(
            job_id=payload.get("submission_id") or payload.get("job_id") or "",
            status=JobStatus(payload["status"]),
            message=payload.get("message") or "",
            entrypoint=payload.get("entrypoint") or "",
            metadata=payload.get("metadata") or {},
            error_type=payload.get("error_type"),
            driver_exit_code=payload.get("driver_exit_code"),
            start_time_ms=payload.get("start_time"),
            end_time_ms=payload.get("end_time"),
        )
