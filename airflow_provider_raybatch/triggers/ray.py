"""RayJobTrigger: wait for a Ray job in the triggerer, without blocking its event loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_raybatch.hooks.ray import JobInfo, JobStatus, RayHook
from airflow_provider_raybatch.shared.exceptions import RayHookError
from airflow_provider_raybatch.shared.json_types import JsonObject, TaskLog
from airflow_provider_raybatch.shared.manifest import describe_progress, progress_from_log
from airflow_provider_raybatch.triggers import poll_pace
from airflow_provider_raybatch.utils.events import job_event

#: Least time between two progress lines in the task log (each costs one fetch of the driver log).
DEFAULT_PROGRESS_INTERVAL_SECONDS = 60.0
#: Longest time between two "Ray job ... is RUNNING." lines while the state does not change.
STATUS_LINE_EVERY_SECONDS = 60.0
#: How long a stop request at the deadline may take (retries included) before the event fires anyway.
STOP_CALL_SECONDS = 30.0


#: Stops that on_kill started and that outlive it (see RayJobTrigger.on_kill); kept from the collector.
_PENDING_STOPS: set[asyncio.Future[None]] = set()


#: Least seconds between a task's deferral and its trigger's event (see ``fire_not_before``). Airflow's
#: scheduler fails a deferred task whose trigger fired before it drained the executor's report of the
#: deferring process's exit (apache/airflow#66374, #72716: "finished with state success, but the task
#: instance's state attribute is queued"); that report came 3-6 s after the deferral in those issues and
#: in our CI, where a retry attached to a job that its earlier try's cleanup stopped a moment later.
DEFER_SETTLE_SECONDS = 10.0


def settle_deadline() -> float:
    """``fire_not_before`` for a trigger deferred now: the deferral plus :data:`DEFER_SETTLE_SECONDS`."""
    return time.time() + DEFER_SETTLE_SECONDS


def _seconds_left(deadline: float | None) -> float | None:
    """Seconds until an absolute deadline (None: no deadline, wait forever)."""
    return None if deadline is None else deadline - time.time()


def event_for_job(info: JobInfo) -> dict[str, str]:
    """The event a terminal job state maps to."""
    status = {JobStatus.SUCCEEDED: "success", JobStatus.STOPPED: "cancelled"}.get(info.status, "error")
    message = f"Ray job {info.job_id} finished: {info.status.value}."
    if info.message:
        message += f" {info.message}"
    return job_event(status, info.job_id, message, info.status.value.lower())


class ProgressRelay:
    """Relay the progress lines a raybatch job prints into the task log, at most once per interval."""

    def __init__(self, job_id: str, interval_seconds: float, log: TaskLog) -> None:
        self.job_id = job_id
        self.interval_seconds = interval_seconds
        self.log = log
        self._next_at = 0.0
        self._ended = False
        self._last: JsonObject | None = None

    def _take_turn(self, status: JobStatus) -> bool:
        """Whether a look at the driver log is due now; if so, the next one is an interval away.

        Once the job has ended, one last look is always due: the final count (a job shorter than
        the interval shows its progress only then).
        """
        if self.interval_seconds <= 0 or self._ended:
            return False
        if status.is_terminal:
            self._ended = True
            return True
        if status != JobStatus.RUNNING or time.monotonic() < self._next_at:
            return False
        self._next_at = time.monotonic() + self.interval_seconds
        return True

    def _log(self, driver_log: str) -> bool:
        progress = progress_from_log(driver_log)
        if progress is None or progress == self._last:
            return False
        self._last = progress
        self.log.info("Ray job %s: %s", self.job_id, describe_progress(progress))
        return True

    def _unavailable(self, err: RayHookError) -> bool:
        self.log.warning("No progress for Ray job %s: %s", self.job_id, err)
        return False

    def relay(self, hook: RayHook, status: JobStatus) -> bool:
        """Log new progress if due; True when a line was logged."""
        if not self._take_turn(status):
            return False
        try:
            return self._log(hook.get_job_logs(self.job_id))
        except RayHookError as err:
            return self._unavailable(err)

    async def a_relay(self, hook: RayHook, status: JobStatus) -> bool:
        """Async version of :meth:`relay`."""
        if not self._take_turn(status):
            return False
        try:
            return self._log(await hook.a_get_job_logs(self.job_id))
        except RayHookError as err:
            return self._unavailable(err)


class StatusLine:
    """Log a job's state when it changes, else at most every :data:`STATUS_LINE_EVERY_SECONDS`: a paced
    wait polls every second, and a line per poll would flood the task log (14,400 for a 4 h job)."""

    def __init__(self, job_id: str, log: TaskLog) -> None:
        self.job_id = job_id
        self.log = log
        self._last: JobStatus | None = None
        self._at = 0.0

    def show(self, status: JobStatus) -> None:
        now = time.monotonic()
        if status != self._last or now - self._at >= STATUS_LINE_EVERY_SECONDS:
            self.log.info("Ray job %s is %s.", self.job_id, status.value)
            self._last, self._at = status, now


class RayJobTrigger(BaseTrigger):
    """Poll a Ray job until it ends, then fire one event (see :mod:`airflow_provider_raybatch.utils.events`).

    :param job_id: Submission id of the Ray job.
    :param ray_conn_id: Airflow connection of type ``ray``. Default ``ray_default``.
    :param poll_interval_seconds: Seconds between status calls. None (default) paces them: every
        second while the triggerer waits on up to 50 jobs, slower beyond, up to every 10 s at 500
        (:mod:`~airflow_provider_raybatch.triggers.poll_pace`), so a job's end is known within about a
        second without loading the Jobs API.
    :param timeout_seconds: Give up (and stop the job) after this long from when the trigger first
        runs; None waits forever. Kept for triggers serialized before ``deadline`` existed.
    :param deadline: Give up (and stop the job) at this absolute time, in seconds since the epoch
        (``time.time()``): the operator's ``execution_timeout`` counted from the try's start. Checked
        before every wait and bounding each poll, so a triggerer restart, a slow poll or a late start
        never extends it. Takes precedence over ``timeout_seconds``.
    :param retry_window_seconds: How long one poll keeps retrying while the Jobs API is unreachable
        or answers 5xx (a head restart); None takes the connection's (default 300 s).
    :param progress_interval_seconds: Least time between two progress lines (rows done / total,
        rows/s, output tokens/s, ETA) relayed from a raybatch job's driver log; 0 turns them off.
    :param owns_job: Whether the deferred task owns the job: True (default, the operator that submitted
        it) stops the job when the task is killed while deferred (marked failed or success, cleared) or
        the timeout passes. False (:class:`~airflow_provider_raybatch.sensors.ray.RayJobSensor`) only
        watches: the job is left running whatever happens to the task, as in worker mode. Default True,
        which is also how a trigger serialized before this argument existed loads.
    :param fire_not_before: Hold the event until this absolute time (epoch seconds), at most
        :data:`DEFER_SETTLE_SECONDS` from when the trigger runs: the deferring task sets it to its
        deferral plus that long, so that a job already over (or ending at once) does not resume the task
        before Airflow has taken note of its deferral. A job longer than that is not delayed.
    """

    def __init__(
        self,
        job_id: str,
        ray_conn_id: str = RayHook.default_conn_name,
        poll_interval_seconds: float | None = None,
        timeout_seconds: float | None = None,
        retry_window_seconds: float | None = None,
        progress_interval_seconds: float = DEFAULT_PROGRESS_INTERVAL_SECONDS,
        owns_job: bool = True,
        deadline: float | None = None,
        fire_not_before: float | None = None,
    ) -> None:
        super().__init__()
        if poll_interval_seconds is not None and not poll_interval_seconds > 0:
            raise ValueError(f"poll_interval_seconds={poll_interval_seconds!r} must be > 0 (or None: paced).")
        self.job_id = job_id
        self.ray_conn_id = ray_conn_id
        self.poll_interval_seconds = None if poll_interval_seconds is None else float(poll_interval_seconds)
        self.timeout_seconds = None if timeout_seconds is None else float(timeout_seconds)
        self.deadline = None if deadline is None else float(deadline)
        self.retry_window_seconds = None if retry_window_seconds is None else float(retry_window_seconds)
        self.progress_interval_seconds = float(progress_interval_seconds)
        if not isinstance(owns_job, bool):
            raise TypeError(
                f"owns_job={owns_job!r} must be a bool: True stops the job on kill, False only watches it."
            )
        self.owns_job = owns_job
        self.fire_not_before = None if fire_not_before is None else float(fire_not_before)

    def serialize(self) -> tuple[str, JsonObject]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "job_id": self.job_id,
                "ray_conn_id": self.ray_conn_id,
                "poll_interval_seconds": self.poll_interval_seconds,
                "timeout_seconds": self.timeout_seconds,
                "retry_window_seconds": self.retry_window_seconds,
                "progress_interval_seconds": self.progress_interval_seconds,
                "owns_job": self.owns_job,
                "deadline": self.deadline,
                "fire_not_before": self.fire_not_before,
            },
        )

    def _hook(self) -> RayHook:
        return RayHook(ray_conn_id=self.ray_conn_id, retry_window_seconds=self.retry_window_seconds)

    def _deadline(self) -> float | None:
        """The absolute deadline (epoch seconds): ``deadline``, else ``timeout_seconds`` from now."""
        if self.deadline is not None:
            return self.deadline
        return None if self.timeout_seconds is None else time.time() + self.timeout_seconds

    def _settle_until(self) -> float | None:
        """When the event may fire: ``fire_not_before``, but never more than the settle time from now
        (a worker clock ahead of the triggerer's, or a bad value, must not hold a finished job's task)."""
        if self.fire_not_before is None:
            return None
        return min(self.fire_not_before, time.time() + DEFER_SETTLE_SECONDS)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = self._hook()
        deadline = self._deadline()
        progress = ProgressRelay(self.job_id, self.progress_interval_seconds, self.log)
        try:
            settle_until = self._settle_until()
            with poll_pace.waiting(self.poll_interval_seconds):
                async for event in self._wait(hook, deadline, progress):
                    if settle_until is not None and (hold := settle_until - time.time()) > 0:
                        await asyncio.sleep(hold)
                    yield event
                    return
        except Exception as err:  # noqa: BLE001 - any crash becomes an event the operator acts on.
            # Without it Airflow fails the task with no event, and only the operator's
            # resume_execution would still stop the job; with it, execute_complete does.
            self.log.exception("Waiting for Ray job %s failed.", self.job_id)
            yield TriggerEvent(
                job_event(
                    "error",
                    self.job_id,
                    f"The trigger waiting for Ray job {self.job_id} failed: {type(err).__name__}: {err}",
                    "trigger_error",
                )
            )

    async def _wait(
        self, hook: RayHook, deadline: float | None, progress: ProgressRelay
    ) -> AsyncIterator[TriggerEvent]:
        """Poll until the job ends or the deadline passes; yields the one event."""
        status_line = StatusLine(self.job_id, self.log)
        while True:
            left = _seconds_left(deadline)
            if left is not None and left <= 0:
                yield TriggerEvent(await self._timed_out(hook))
                return
            try:
                # The hook retries what passes (unreachable head, 5xx) for its retry window,
                # never past the deadline.
                info = await asyncio.wait_for(hook.a_get_job_info(self.job_id), left)
            except TimeoutError:
                yield TriggerEvent(await self._timed_out(hook))
                return
            except RayHookError as err:
                yield TriggerEvent(job_event("error", self.job_id, str(err), "api_error"))
                return
            if info.status.is_terminal:
                await progress.a_relay(hook, info.status)  # the final count
                yield TriggerEvent(event_for_job(info))
                return
            if not await progress.a_relay(hook, info.status):
                status_line.show(info.status)
            left = _seconds_left(deadline)
            wait = poll_pace.next_poll_in(self.poll_interval_seconds)
            await asyncio.sleep(wait if left is None else max(min(wait, left), 0))

    async def _timed_out(self, hook: RayHook) -> dict[str, str]:
        """The deadline passed: the job's end if it has ended (a result is not thrown away), else stop
        it if this task owns it, and say so. Each call is bounded: the event fires in any case."""
        try:
            info = await asyncio.wait_for(hook.a_get_job_info(self.job_id), STOP_CALL_SECONDS)
        except (RayHookError, TimeoutError):
            info = None
        if info is not None and info.status.is_terminal:
            return event_for_job(info)
        if self.timeout_seconds is not None:
            message = f"Ray job {self.job_id} did not finish within {self.timeout_seconds:.0f} s"
        else:
            message = f"Ray job {self.job_id} did not finish by the task's deadline"
        if not self.owns_job:
            message += "; left it running (this task only watches it)."
        else:
            try:
                await asyncio.wait_for(hook.a_stop_job(self.job_id), STOP_CALL_SECONDS)
                message += "; stopped it."
            except (RayHookError, TimeoutError) as err:
                message += f"; stopping it failed: {str(err) or 'no answer in time'}"
        return job_event("error", self.job_id, message, "timeout")

    async def on_kill(self) -> None:
        """The task was marked failed, cleared or succeeded while deferred: stop its Ray job if it owns it.

        A sensor's trigger (``owns_job=False``) leaves the job running, as the sensor does in worker mode:
        the job belongs to whoever submitted it. Airflow calls this only on such user actions, never on
        a triggerer restart or redistribution, so those never stop a job either way.
        """
        if not self.owns_job:
            self.log.info(
                "Task killed while deferred; Ray job %s left running: the task only watches it.", self.job_id
            )
            return
        # Shielded: Airflow may cancel on_kill itself while it runs (it cancels the trigger's task
        # again), and a stop cut short leaves the job running. The stop goes on in the triggerer's
        # loop; _PENDING_STOPS holds it until it ends.
        stop = asyncio.ensure_future(self._stop_owned_job())
        _PENDING_STOPS.add(stop)
        stop.add_done_callback(_PENDING_STOPS.discard)
        await asyncio.shield(stop)

    async def _stop_owned_job(self) -> None:
        try:
            stopped = await self._hook().a_stop_job(self.job_id)
        except Exception as err:  # noqa: BLE001 - nobody may be left to await this; say it here.
            self.log.warning("Task killed while deferred; stopping Ray job %s failed: %s", self.job_id, err)
            return
        self.log.info("Task killed while deferred; stop of Ray job %s requested: %s.", self.job_id, stopped)
