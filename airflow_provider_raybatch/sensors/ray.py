"""RayJobSensor: wait for an existing Ray job, in poke, reschedule or deferrable mode."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, conf

from airflow_provider_raybatch.hooks.ray import JobStatus, RayHook
from airflow_provider_raybatch.triggers.ray import RayJobTrigger, event_for_job
from airflow_provider_raybatch.utils.events import job_failed_error, validate_event

if TYPE_CHECKING:
    from airflow.sdk import Context


class RayJobSensor(BaseSensorOperator):
    """Succeed when a Ray job has SUCCEEDED; fail, with the end of its log, when it FAILED or was STOPPED.

    :param job_id: Submission id of the job to wait for (templated).
    :param ray_conn_id: Airflow connection of type ``ray``. Default ``ray_default``.
    :param deferrable: Wait in the triggerer instead of a worker slot. Default: the
        ``[operators] default_deferrable`` setting. The sensor's ``timeout`` bounds the wait in every mode;
        reaching it fails the sensor but leaves the job running (it is not this sensor's job).
    """

    template_fields = ("job_id",)

    def __init__(
        self,
        *,
        job_id: str,
        ray_conn_id: str = RayHook.default_conn_name,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        **kwargs: Any,  # Any: BaseSensorOperator's arguments (poke_interval, timeout, mode, ...).
    ) -> None:
        super().__init__(**kwargs)
        self.job_id = job_id
        self.ray_conn_id = ray_conn_id
        self.deferrable = deferrable

    @property
    def hook(self) -> RayHook:
        return RayHook(ray_conn_id=self.ray_conn_id)

    def poke(self, context: Context) -> bool:
        info = self.hook.get_job_info(self.job_id)
        self.log.info("Ray job %s is %s.", self.job_id, info.status.value)
        if info.status == JobStatus.SUCCEEDED:
            return True
        if info.status.is_terminal:
            raise job_failed_error(event_for_job(info), self.hook.get_job_log_tail(self.job_id))
        return False

    def execute(self, context: Context) -> None:
        if not self.deferrable:
            super().execute(context)
            return
        if self.poke(context):
            return
        self.defer(
            trigger=RayJobTrigger(
                job_id=self.job_id, ray_conn_id=self.ray_conn_id, poll_interval_seconds=self.poke_interval
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def execute_complete(self, context: Context, event: dict[str, str] | None = None) -> None:
        event = validate_event(event)
        if event["status"] != "success":
            raise job_failed_error(event, self.hook.get_job_log_tail(event["job_id"]))
        self.log.info(event["message"])
