"""RayJobSensor: wait for an existing Ray job, in poke, reschedule or deferrable mode."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, NoReturn

from airflow.sdk import BaseSensorOperator, conf
from airflow.sdk.exceptions import (
    AirflowFailException,
    AirflowSensorTimeout,
    AirflowSkipException,
    AirflowTaskTimeout,
)

from airflow_provider_raybatch.hooks.ray import JobStatus, RayHook
from airflow_provider_raybatch.shared.json_types import ArgValue
from airflow_provider_raybatch.triggers.ray import RayJobTrigger, event_for_job, settle_deadline
from airflow_provider_raybatch.utils.events import job_failed_error, validate_event

if TYPE_CHECKING:
    from airflow.sdk import Context

#: The ``termination_reason`` of a job that ended, but not SUCCEEDED: what ``soft_fail`` turns into a skip.
_BAD_ENDINGS = frozenset(status.value.lower() for status in (JobStatus.FAILED, JobStatus.STOPPED))


class RayJobSensor(BaseSensorOperator):
    """Succeed when a Ray job has SUCCEEDED; fail, with the end of its log, when it FAILED or was STOPPED.

    The sensor only watches: it never stops the job, in any mode. Timing out, being marked failed or
    success, or being cleared ends the wait and leaves the job running; stop it from the task that
    submitted it (or ``ray job stop``).

    ``soft_fail`` and ``never_fail`` mean the same in every mode. ``soft_fail=True`` skips the task
    instead of failing it when the job ended FAILED or STOPPED, or the sensor's ``timeout`` passed; an
    error of the Ray API still fails it. ``never_fail=True`` skips on any error.

    :param job_id: Submission id of the job to wait for (templated).
    :param ray_conn_id: Airflow connection of type ``ray``. Default ``ray_default``.
    :param deferrable: Wait in the triggerer instead of a worker slot. Default: the
        ``[operators] default_deferrable`` setting. The sensor's ``timeout`` bounds the wait in every mode;
        reaching it fails the sensor but leaves the job running (it is not this sensor's job).

    Deferred, the sensor polls as ``RayLLMBatchOperator`` does unless ``poke_interval`` is given: every
    second while its triggerer waits on up to 50 jobs, slower beyond (``triggers/poll_pace.py``), so
    the task ends about a second after the job. Airflow's 60 s ``poke_interval`` default made it
    end 39 s after the job on average (bench/RESULTS.md section 11). A ``poke_interval`` given is
    kept, in every mode; poke and reschedule modes keep Airflow's default.
    """

    template_fields = ("job_id",)

    def __init__(
        self,
        *,
        job_id: str,
        ray_conn_id: str = RayHook.default_conn_name,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        **kwargs: ArgValue,
    ) -> None:
        super().__init__(**kwargs)
        #: Deferred, a poke_interval left at Airflow's default gives way to the paced polling.
        self.poke_interval_given = "poke_interval" in kwargs
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
            self._fail(event_for_job(info))
        return False

    def execute(self, context: Context) -> None:
        if not self.deferrable:
            super().execute(context)
            return
        with self._skip_as_the_poke_loop_would():
            if self.poke(context):
                return
        self.defer(
            # owns_job=False: the job is not this task's, so killing the deferred sensor must not stop it.
            trigger=RayJobTrigger(
                job_id=self.job_id,
                ray_conn_id=self.ray_conn_id,
                poll_interval_seconds=self.poke_interval if self.poke_interval_given else None,
                owns_job=False,
                fire_not_before=settle_deadline(),
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def execute_complete(self, context: Context, event: dict[str, str] | None = None) -> None:
        with self._skip_as_the_poke_loop_would():
            event = validate_event(event)
            if event["status"] != "success":
                self._fail(event)
        self.log.info(event["message"])

    def _fail(self, event: dict[str, str]) -> NoReturn:
        """Fail the task for an event that is not a success, or skip it where ``soft_fail`` says so."""
        error = job_failed_error(event, self.hook.get_job_log_tail(event["job_id"]))
        if self.soft_fail and event["termination_reason"] in _BAD_ENDINGS:
            self.log.warning("%s", error)
            raise AirflowSkipException(f"{event['message']} Skipping: soft_fail=True.") from error
        raise error

    @contextmanager
    def _skip_as_the_poke_loop_would(self) -> Iterator[None]:
        """Apply ``soft_fail`` and ``never_fail`` to the deferrable path as the poke loop does.

        ``BaseSensorOperator.execute`` applies them around ``poke()`` in poke and reschedule mode, but
        deferrable mode calls ``poke()`` outside that loop, and Airflow's ``resume_execution`` applies
        them after the deferral only to ``AirflowException``, which our errors are not (they are plain
        Python so the cluster side can import them): without this, ``never_fail`` is ignored there.
        """
        try:
            yield
        except AirflowSkipException:
            raise
        except (AirflowSensorTimeout, AirflowTaskTimeout, AirflowFailException) as err:
            if self.soft_fail or self.never_fail:
                flag = "soft_fail" if self.soft_fail else "never_fail"
                raise AirflowSkipException(f"Skipping due to {flag}=True: {err}") from err
            raise
        except Exception as err:
            if self.never_fail:
                self.log.warning("%s", err)  # whole, with the job's log tail; the skip gets its first line
                first_line = str(err).partition("\n")[0][:300]
                raise AirflowSkipException(
                    f"Skipping due to never_fail=True: {type(err).__name__}: {first_line}"
                ) from err
            raise
