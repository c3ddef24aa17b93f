"""One live job writes a run's staging (pipeline/stage/ownership.py), on local disk with a stand-in
for Ray's job table and a clock the waits advance."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from airflow_provider_raybatch.pipeline.stage import ownership
from airflow_provider_raybatch.pipeline.stage.ownership import Owner, StagingOwnedError
from airflow_provider_raybatch.pipeline.storage import OutputLayout


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0
        self.on_sleep = None

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep()


@pytest.fixture
def layout(tmp_path: Path) -> OutputLayout:
    return OutputLayout(str(tmp_path / "out"), "daily-2026-11-20")


#: The Airflow run the owners below belong to, as a job's metadata names it.
RUN = {"dag_id": "daily", "task_id": "classify", "run_id": "manual__2026-11-20", "map_index": "-1"}


def _owner(job_id: str, at: float = 1_000.0) -> Owner:
    return Owner(job_id, {**RUN, "run_after": "2026-11-20T00:00:00"}, at)


def _claim(layout: OutputLayout, me: Owner, alive: dict[str, bool | None], clock: Clock) -> Owner | None:
    return ownership.claim(layout, me, alive.get, now=clock.time, sleep=clock.sleep)


def test_a_first_job_claims_and_a_second_live_one_is_refused_naming_it(layout: OutputLayout) -> None:
    clock = Clock()
    assert _claim(layout, _owner("job-1"), {}, clock) is None

    with pytest.raises(StagingOwnedError, match=r"being written by Ray job job-1 \(.*run_after") as refused:
        _claim(layout, _owner("job-2"), {"job-1": True}, clock)
    assert "stops before it writes beside it" in str(refused.value)
    assert ownership.read_owner(layout).job_id == "job-1"  # untouched
    assert clock.now >= 1_000 + ownership.OWNER_END_WAIT_SECONDS  # it gave the owner time to end


def test_a_job_takes_over_from_an_owner_that_ended_or_ends_while_it_waits(layout: OutputLayout) -> None:
    clock, alive = Clock(), {"job-1": True}
    _claim(layout, _owner("job-1"), alive, clock)
    clock.on_sleep = lambda: alive.update({"job-1": False})  # a stopped try's job ends

    assert _claim(layout, _owner("job-2"), alive, clock).job_id == "job-1"
    assert ownership.read_owner(layout).job_id == "job-2"


#: A heartbeat written by a node whose clock is far behind this one's (it reads as hours old the moment
#: it is written), as this one's, or far ahead.
HOSTILE_SKEWS = [-10_000.0, -121.0, 0.0, 10_000.0]


@pytest.mark.parametrize("skew", HOSTILE_SKEWS)
@pytest.mark.parametrize("beating", [True, False], ids=["beating", "heartbeat-stopped"])
def test_no_clock_takes_the_staging_of_an_owner_ray_cannot_answer_for(
    layout: OutputLayout, skew: float, beating: bool
) -> None:
    """Ray's job table cannot be read: whatever the owner's heartbeat says (written by a node whose
    clock is skewed, or not moving: a store refusing its writes a while), the owner may be alive, and
    the claim fails naming it rather than write beside it."""
    clock = Clock()
    ownership._write(layout, _owner("job-1", clock.now + skew))
    if beating:
        clock.on_sleep = lambda: ownership._write(layout, _owner("job-1", clock.now + skew))

    with pytest.raises(StagingOwnedError, match="which Ray cannot say has ended") as refused:
        _claim(layout, _owner("job-2"), {"job-1": None}, clock)

    assert ownership.read_owner(layout).job_id == "job-1"
    assert "a hint only" in str(refused.value)
    assert clock.now >= 1_000 + ownership.OWNER_END_WAIT_SECONDS  # it waited for Ray to answer


@pytest.mark.parametrize("skew", HOSTILE_SKEWS)
def test_a_live_owner_keeps_its_staging_whatever_its_heartbeat_says(
    layout: OutputLayout, skew: float
) -> None:
    clock = Clock()
    ownership._write(layout, _owner("job-1", clock.now + skew))

    with pytest.raises(StagingOwnedError, match="which is still running"):
        _claim(layout, _owner("job-2"), {"job-1": True}, clock)
    assert ownership.read_owner(layout).job_id == "job-1"


def test_an_owner_ray_answers_for_again_as_ended_is_taken_over(layout: OutputLayout) -> None:
    """The job table unreadable for a while (a head restarting), then Ray says the owner ended."""
    clock, alive = Clock(), {"job-1": None}
    ownership._write(layout, _owner("job-1", clock.now))
    clock.on_sleep = lambda: alive.update({"job-1": False}) if clock.now > 1_060 else None

    assert _claim(layout, _owner("job-2"), alive, clock).job_id == "job-1"
    assert ownership.read_owner(layout).job_id == "job-2"


@pytest.mark.parametrize(
    ("record", "alive"),
    [
        ({"status": "RUNNING"}, True),
        ({"status": "PENDING"}, True),
        ({"status": "STOPPED"}, False),
        ({"status": "FAILED"}, False),
        ({"status": "SUCCEEDED"}, False),
        (None, False),  # no record: the cluster restarted since, or it was never this cluster's job
        ({}, None),  # a record that says nothing
        (RuntimeError("GCS unavailable"), None),  # the table cannot be read
    ],
    ids=["running", "pending", "stopped", "failed", "succeeded", "unknown", "no-status", "unreadable"],
)
def test_what_rays_job_table_says_of_an_owner(
    monkeypatch: pytest.MonkeyPatch, record: dict[str, str] | None | Exception, alive: bool | None
) -> None:
    def job_info(job_id: str) -> dict[str, str] | None:
        if isinstance(record, Exception):
            raise ownership._JobTableUnreadable(str(record))
        return record

    monkeypatch.setattr(ownership, "_ray_job_info", job_info)
    assert ownership.ray_job_alive("raybatch-x") is alive
    assert ownership.ray_job_run("raybatch-x") == ({} if isinstance(record, dict) else None)


def test_an_owner_rays_job_table_does_not_know_is_gone_at_once(layout: OutputLayout) -> None:
    """A Ray cluster restarted since the owner's job ran: its job table is empty, and that job writes
    no more. The heartbeat, however fresh it looks, does not hold the staging."""
    clock = Clock()
    ownership._write(layout, _owner("job-1", clock.now + 10_000.0))

    assert _claim(layout, _owner("job-2"), {"job-1": False}, clock).job_id == "job-1"
    assert clock.now < 1_000 + ownership.OWNER_POLL_SECONDS + ownership.SETTLE_SECONDS + 1  # no wait
    assert ownership.read_owner(layout).job_id == "job-2"


def test_a_store_that_does_not_answer_is_not_taken_for_no_owner(
    layout: OutputLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    _claim(layout, _owner("job-1"), {}, Clock())

    def unavailable(uri: str, within: str | None = None) -> str:
        raise OSError("503 Slow Down")

    monkeypatch.setattr(ownership.storage, "read_text", unavailable)
    with pytest.raises(OSError):
        _claim(layout, _owner("job-2"), {}, Clock())


def test_of_two_claims_at_one_moment_the_last_one_written_wins(layout: OutputLayout) -> None:
    clock = Clock()
    # job-2 writes its claim while job-1 waits to read its own back.
    clock.on_sleep = lambda: ownership._write(layout, _owner("job-2", clock.now))

    with pytest.raises(StagingOwnedError, match="job-2"):
        _claim(layout, _owner("job-1"), {}, clock)


def test_a_job_taken_over_commits_nothing_and_an_owner_releases_what_is_its(layout: OutputLayout) -> None:
    clock = Clock()
    me = _owner("job-1")
    _claim(layout, me, {}, clock)
    ownership.confirm(layout, me)

    ownership._write(layout, _owner("job-2"))
    with pytest.raises(StagingOwnedError, match="taken over by Ray job job-2"):
        ownership.confirm(layout, me)
    ownership.release(layout, me)  # not its own any more: left as it is
    assert ownership.read_owner(layout).job_id == "job-2"
    ownership.release(layout, _owner("job-2"))
    assert ownership.read_owner(layout) is None


def test_a_record_naming_a_live_job_of_another_run_is_no_owner(layout: OutputLayout) -> None:
    """A record planted by someone who can write the store, naming another tenant's long job (with
    this run's identity copied into it): Ray's job table says whose the job is, and no try waits."""
    clock = Clock()
    ownership._write(layout, _owner("their-long-job"))
    jobs_runs = {"their-long-job": {**RUN, "dag_id": "someone_elses", "try_number": "1"}}

    taken_from = ownership.claim(
        layout, _owner("job-2"), {"their-long-job": True}.get, clock.time, clock.sleep, jobs_runs.get
    )

    assert taken_from.job_id == "their-long-job"
    assert ownership.read_owner(layout).job_id == "job-2"
    assert clock.now < 1_000 + ownership.OWNER_POLL_SECONDS + ownership.SETTLE_SECONDS + 1  # no wait


def test_a_live_job_of_this_run_another_try_or_run_after_stays_the_owner(layout: OutputLayout) -> None:
    clock = Clock()
    ownership._write(layout, _owner("job-1"))
    jobs_runs = {"job-1": {**RUN, "run_after": "2026-11-19T00:00:00", "try_number": "3"}}

    with pytest.raises(StagingOwnedError, match="being written by Ray job job-1"):
        ownership.claim(layout, _owner("job-2"), {"job-1": True}.get, clock.time, clock.sleep, jobs_runs.get)


def test_a_live_job_whose_metadata_names_no_run_stays_the_owner(layout: OutputLayout) -> None:
    """Only metadata naming another whole run makes a job another run's (a job submitted without
    Airflow's metadata may be this run's writer)."""
    clock = Clock()
    ownership._write(layout, _owner("job-1"))

    with pytest.raises(StagingOwnedError, match="being written by Ray job job-1"):
        ownership.claim(
            layout, _owner("job-2"), {"job-1": True}.get, clock.time, clock.sleep, {"job-1": {}}.get
        )


@pytest.mark.parametrize(
    "record",
    [
        b'{"job_id": "x", "run": {}, "heartbeat_at": NaN}',
        b'{"job_id": "x", "heartbeat_at": Infinity}',
        b"\xff\xfe{",
    ],
    ids=["nan-heartbeat", "infinite-heartbeat", "not-utf8"],
)
def test_a_record_no_heartbeat_could_age_or_no_reader_could_decode_is_no_owner(
    layout: OutputLayout, record: bytes
) -> None:
    path = Path(ownership.owner_uri(layout))
    path.parent.mkdir(parents=True)
    path.write_bytes(record)

    assert ownership.read_owner(layout) is None
    assert _claim(layout, _owner("job-2"), {"x": None}, Clock()) is None  # no wait
    assert ownership.read_owner(layout).job_id == "job-2"


def test_a_release_after_a_failure_leaves_no_owner_and_a_store_error_there_is_only_a_warning(
    layout: OutputLayout, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    me = _owner("job-1")
    _claim(layout, me, {}, Clock())
    ownership.release(layout, me)
    assert ownership.read_owner(layout) is None

    _claim(layout, me, {}, Clock())

    def store_down(uri: str, within: str | None = None) -> bool:
        raise OSError("the store did not answer")

    monkeypatch.setattr(ownership.storage, "exists", store_down)
    ownership.release(layout, me)  # does not raise over the job's own failure
    assert "Could not remove the staging's owner record" in caplog.text


def test_an_unreadable_record_is_no_owner(layout: OutputLayout) -> None:
    path = Path(ownership.owner_uri(layout))
    path.parent.mkdir(parents=True)
    path.write_text('{"job_id": "job-1", "heartb')  # a write that died
    assert ownership.read_owner(layout) is None
    assert _claim(layout, _owner("job-2"), {}, Clock()) is None
    assert json.loads(path.read_text())["job_id"] == "job-2"


def test_the_heartbeat_renews_the_owners_record_until_taken_over(
    layout: OutputLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ownership, "HEARTBEAT_SECONDS", 0.01)
    me = _owner("job-1", 5.0)
    ownership._write(layout, me)
    beat = ownership.Heartbeat(layout, me, now=lambda: 99.0).start()
    try:
        for _ in range(500):
            if ownership.read_owner(layout).heartbeat_at == 99.0:
                break
            time.sleep(0.01)
        assert ownership.read_owner(layout).heartbeat_at == 99.0
    finally:
        beat.stop()
