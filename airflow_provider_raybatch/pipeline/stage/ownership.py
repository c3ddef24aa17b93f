"""One live job writes a run's staging: which one, for which run, and whether it still lives.

Two jobs of one ``run_key`` can be alive at once: a manual run deleted and triggered again under the
same run id while its job runs, a secret rotated while a try runs, Airflow 3.2 (no trigger
``on_kill``) letting a cleared try's job run to its end. Both would stage into
``_staging/<run_key>/`` and the commit would take rows of both. So the staging has an owner,
``_staging/<run_key>.owner.json`` (beside the folder, which a discard or a commit deletes): the job
id, the run it belongs to (its Airflow run, ``run_after`` included) and a heartbeat. A job becomes
the owner only when there is none, or the owner is provably gone: Ray's job table says its job ended,
or holds no record of it (this cluster restarted since, or it never was this cluster's job). A live
owner gets :data:`OWNER_END_WAIT_SECONDS` to end (a stopped try's job); so does one whose job Ray
cannot answer for (its job table unreadable), as long as it stays so; then the job fails before it
writes anything, naming the owner.

No clock takes a staging. A heartbeat's age compares the owner's node's clock with this one's, and a
node whose clock is minutes behind would make a live owner look gone; even a heartbeat this job sees
stop moving may be a store that refused the owner's writes for a while. So the heartbeat is a hint
for people (the refusal says when it last moved), never a reason to take over. Two jobs claiming at
the same moment both write, wait :data:`SETTLE_SECONDS` and read back: the one whose claim is there
goes on, the other fails. The owner checks it still is one before it commits or holds
(:func:`confirm`).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from airflow_provider_raybatch.pipeline import storage
from airflow_provider_raybatch.pipeline.storage import OutputLayout
from airflow_provider_raybatch.shared.json_types import JsonObject

log = logging.getLogger("airflow_provider_raybatch.pipeline")

#: How often the owner's driver renews its heartbeat (a hint for people: no clock takes a staging).
HEARTBEAT_SECONDS = 15.0
#: How long a claim waits before it reads itself back (two claims at one moment: the last one wins).
#: Longer than a claim's read-then-write takes (milliseconds; one GET and one PUT on S3).
SETTLE_SECONDS = 1.0
#: How long a claim waits for a live owner to end (a stopped try's job takes seconds to), polling; as
#: long for Ray's job table to answer again when it cannot be read (a head restarting).
OWNER_END_WAIT_SECONDS = 150.0
OWNER_POLL_SECONDS = 2.0
#: Ray job statuses of a job that can no longer write.
_ENDED = frozenset({"STOPPED", "SUCCEEDED", "FAILED"})

#: Whether a Ray job (by its submission id) still runs: True; False when it ended or Ray's job table
#: holds no record of it (provably gone from this cluster); None when Ray cannot say (the table
#: cannot be read): not gone.
JobAlive = Callable[[str], "bool | None"]
#: The Airflow run a Ray job (by its submission id) belongs to, as Ray's job table has it; None when
#: Ray holds no record of the job.
JobRun = Callable[[str], "dict[str, str] | None"]
#: The keys of :attr:`Owner.run` that name the run (a try, or its ``run_after``, may differ between
#: two jobs of one run's staging: that is the case an owner exists for).
_RUN_IDENTITY = ("dag_id", "task_id", "run_id", "map_index")


class StagingOwnedError(RuntimeError):
    """Another live job writes this run's staging: this job stops before it writes beside it."""


@dataclass(frozen=True)
class Owner:
    job_id: str
    #: The Airflow run the job belongs to (dag, task, run id, run_after, try), as its metadata says.
    run: dict[str, str]
    heartbeat_at: float


def owner_uri(layout: OutputLayout) -> str:
    return f"{layout.staging_uri.rstrip('/')}.owner.json"


def read_owner(layout: OutputLayout) -> Owner | None:
    """The staging's owner, or None (none yet, or a record a write that died left half written).

    :raises OSError: the store did not answer: whether a job owns the staging is not known.
    """
    uri = owner_uri(layout)
    if not storage.exists(uri, within=layout.output_uri):
        return None
    try:
        data = json.loads(storage.read_text(uri, within=layout.output_uri))  # not UTF-8 or JSON: ValueError
        owner = Owner(data["job_id"], dict(data.get("run") or {}), float(data["heartbeat_at"]))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    # A heartbeat that is not a finite time (NaN never equals itself) would never be seen to stop.
    if not math.isfinite(owner.heartbeat_at):
        return None
    # The record's texts go into the driver log and into messages: a line break in one would start a
    # line there (a forged progress or result marker), so a record of texts no job has is none.
    texts = [owner.job_id, *owner.run.keys(), *owner.run.values()]
    return owner if owner.job_id and all(_loggable(text) for text in texts) else None


#: The longest text an owner record's job id or run may hold (Ray's ids and Airflow's are far shorter).
_MAX_RECORD_TEXT = 512


def _loggable(text: object) -> bool:
    """Whether ``text`` is a string that prints on one line as itself (no control character, no line
    or paragraph separator) and is short."""
    return isinstance(text, str) and len(text) <= _MAX_RECORD_TEXT and text.isprintable()


def _write(layout: OutputLayout, owner: Owner) -> None:
    storage.write_text(owner_uri(layout), json.dumps(asdict(owner), sort_keys=True), within=layout.output_uri)


def claim(
    layout: OutputLayout,
    me: Owner,
    job_alive: JobAlive,
    now: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    job_run: JobRun = lambda job_id: None,
) -> Owner | None:
    """Make this job the staging's owner; return the gone owner it took over from, if any.

    A record naming a job that Ray says belongs to another run is no owner (a record planted by
    someone who can write the store, naming another tenant's long job, would otherwise keep every
    try of this run waiting, then failing).

    :raises StagingOwnedError: another job owns it and is not provably gone, or claimed it at the
        same moment and won.
    """
    current = read_owner(layout)
    earlier = current if current is not None and current.job_id != me.job_id else None
    if earlier is not None and not _of_this_run(job_run(earlier.job_id), me.run):
        log.warning(
            "Staging of %s names Ray job %s as its owner, but that job belongs to another run: not this "
            "staging's owner; this job takes it over.",
            layout.run_key,
            earlier.job_id,
        )
    elif earlier is not None:
        deadline, said = now() + OWNER_END_WAIT_SECONDS, False
        beat, beat_seen_at = earlier.heartbeat_at, now()
        while (alive := job_alive(earlier.job_id)) is not False:
            latest = read_owner(layout)
            if latest is not None and latest.job_id == earlier.job_id and latest.heartbeat_at != beat:
                beat, beat_seen_at = latest.heartbeat_at, now()  # it still beats
            if now() >= deadline:
                raise StagingOwnedError(_owned_message(layout, earlier, me, alive, now() - beat_seen_at))
            if not said:
                log.warning(
                    "Staging of %s is being written by Ray job %s%s: waiting up to %.0f s for it to end.",
                    layout.run_key,
                    earlier.job_id,
                    "" if alive else " (Ray's job table cannot be read now)",
                    OWNER_END_WAIT_SECONDS,
                )
                said = True
            sleep(OWNER_POLL_SECONDS)
        log.warning(
            "Staging of %s belonged to Ray job %s, which ended (Ray's job table says so, or knows it "
            "no more: a cluster restarted since); this job takes it over.",
            layout.run_key,
            earlier.job_id,
        )
    _write(layout, replace(me, heartbeat_at=now()))
    sleep(SETTLE_SECONDS)
    after = read_owner(layout)
    if after is None or after.job_id != me.job_id:
        raise StagingOwnedError(_owned_message(layout, after or earlier or me, me))
    return earlier


def _of_this_run(job_run: dict[str, str] | None, mine: dict[str, str]) -> bool:
    """Whether a job Ray records as submitted for ``job_run`` is a job of this run. Only a job whose
    metadata and this job's both name a whole run, and name another one, is another run's; anything
    unknown (no record in Ray, metadata without a run) counts as this run's: the record stands."""
    named = [run for run in (job_run, mine) if run is not None and all(key in run for key in _RUN_IDENTITY)]
    if len(named) < 2:
        return True
    return all(named[0][key] == named[1][key] for key in _RUN_IDENTITY)


def confirm(layout: OutputLayout, me: Owner) -> None:
    """Raise :class:`StagingOwnedError` unless this job still owns the staging (before it commits)."""
    current = read_owner(layout)
    if current is None or current.job_id != me.job_id:
        taker = current.job_id if current is not None else "another job"
        raise StagingOwnedError(
            f"Staging of {layout.run_key} was taken over by Ray job {taker} while this job ran (it found "
            "this job gone): this job commits nothing. Every row it staged is there for that job."
        )


def release(layout: OutputLayout, me: Owner) -> None:
    """Give the staging up as the job ends (committed, held or failed): delete the record if it is
    still this job's. A store that does not answer leaves it, with a warning: the next try finds its
    job ended and takes it over, so this never fails a job nor hides why it failed."""
    try:
        current = read_owner(layout)
        if current is not None and current.job_id == me.job_id:
            storage.delete_file(owner_uri(layout), within=layout.output_uri)
    except OSError:
        log.warning(
            "Could not remove the staging's owner record %s; a next try takes it over.",
            owner_uri(layout),
            exc_info=True,
        )


def _owned_message(
    layout: OutputLayout, owner: Owner, me: Owner, alive: bool | None = True, beat_unmoved_s: float = 0.0
) -> str:
    run = ", ".join(f"{key} {value}" for key, value in sorted(owner.run.items())) or "run not recorded"
    state = (
        "which is still running"
        if alive
        else "which Ray cannot say has ended (its job table could not be read for "
        f"{OWNER_END_WAIT_SECONDS:.0f} s; the job's heartbeat had not moved for {beat_unmoved_s:.0f} s as "
        "this job watched, a hint only: a heartbeat is no proof that a job ended)"
    )
    return (
        f"Staging of {layout.run_key} at {layout.output_uri} is being written by Ray job {owner.job_id} "
        f"({run}), {state}: Ray job {me.job_id} stops before it writes beside it. Two jobs "
        "of one run at once: a run deleted and triggered again while its job ran, or a cleared try whose "
        "job was not stopped. Stop that job (or let it finish), then retry."
    )


class Heartbeat:
    """The owner's driver renews its heartbeat every :data:`HEARTBEAT_SECONDS` until :meth:`stop`."""

    def __init__(self, layout: OutputLayout, me: Owner, now: Callable[[], float] = time.time) -> None:
        self._layout, self._me, self._now = layout, me, now
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="raybatch-staging-owner", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=HEARTBEAT_SECONDS)

    def _run(self) -> None:
        while not self._stopped.wait(HEARTBEAT_SECONDS):
            try:
                current = read_owner(self._layout)
                if current is not None and current.job_id != self._me.job_id:
                    return  # taken over: confirm() says so before any commit
                _write(self._layout, replace(self._me, heartbeat_at=self._now()))
            except OSError:
                log.warning("Could not renew the staging's heartbeat; trying again.", exc_info=True)


class _JobTableUnreadable(RuntimeError):
    """Ray's job table could not be read: whether a job lives is not known."""


def _ray_job_info(job_id: str) -> JsonObject | None:
    """The record Ray's job manager keeps of a submitted job in its GCS key-value store, or None when
    it holds none (not a job of this cluster, or one from before the cluster restarted). The key and
    namespace are Ray's own (checked at the job's start: generate/ray_internals.py).

    :raises _JobTableUnreadable: the store did not answer, or the record is not JSON.
    """
    from ray._private.ray_constants import KV_NAMESPACE_JOB
    from ray.dashboard.modules.job.common import JobInfoStorageClient
    from ray.experimental import internal_kv

    try:
        key = JobInfoStorageClient.JOB_DATA_KEY.format(job_id=job_id)
        raw = internal_kv._internal_kv_get(key, namespace=KV_NAMESPACE_JOB)
        return json.loads(raw) if raw else None
    except Exception as err:  # noqa: BLE001 - whatever Ray raised, it cannot say
        raise _JobTableUnreadable(str(err)) from err


def ray_job_alive(job_id: str) -> bool | None:
    """Whether the Ray job with this submission id still runs (:data:`JobAlive`): False when it ended or
    Ray holds no record of it; None when Ray cannot say (its job table unreadable, a record without a
    status)."""
    try:
        info = _ray_job_info(job_id)
    except _JobTableUnreadable:
        return None
    if info is None:
        return False
    status = info.get("status")
    return None if status is None else status not in _ENDED


def ray_job_run(job_id: str) -> dict[str, str] | None:
    """The Airflow run a Ray job was submitted for, from its metadata in Ray's job table (keys as in
    :attr:`Owner.run`); None when Ray holds no record of the job or cannot say."""
    try:
        info = _ray_job_info(job_id)
    except _JobTableUnreadable:
        return None
    if info is None:
        return None
    metadata = info.get("metadata") or {}
    return {
        key.removeprefix("airflow_"): str(value)
        for key, value in metadata.items()
        if key.startswith("airflow_")
    }
