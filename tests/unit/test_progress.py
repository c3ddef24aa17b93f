"""Progress: the pipeline's marked lines, their description, and the relay into the task log."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from airflow_provider_raybatch.hooks.ray import JobStatus, RayHook
from airflow_provider_raybatch.pipeline.reporting.progress import ProgressReporter
from airflow_provider_raybatch.shared.manifest import (
    describe_progress,
    manifest_log_line,
    progress_from_log,
    progress_log_line,
)
from airflow_provider_raybatch.triggers.ray import ProgressRelay


def _progress(**overrides: Any) -> dict[str, Any]:  # Any: JSON values.
    return {
        "rows_done": 1200,
        "rows_total": 5000,
        "rows_resumed": 0,
        "tokens_out": 6000,
        "elapsed_seconds": 40,
        **overrides,
    }


def test_description_has_counts_rates_and_eta() -> None:
    assert describe_progress(_progress()) == (
        "1,200 / 5,000 rows (24.0%), 30.0 rows/s, 150 output tokens/s, ETA 2m07s"
    )


def test_resumed_rows_count_as_done_but_not_in_the_rate() -> None:
    line = describe_progress(_progress(rows_done=3000, rows_resumed=2000, elapsed_seconds=100))

    assert line.startswith("3,000 / 5,000 rows (60.0%), 10.0 rows/s")
    assert line.endswith("ETA 3m20s")


def test_no_eta_when_done_or_before_any_row() -> None:
    assert "ETA" not in describe_progress(_progress(rows_done=5000))
    assert "ETA" not in describe_progress(_progress(rows_done=0))
    assert describe_progress(_progress(elapsed_seconds=0)) == "1,200 / 5,000 rows (24.0%)"


def test_the_eta_is_at_the_engines_rate_and_waits_for_their_first_row() -> None:
    """8 rows staged at once (bad rows, no engine) while the engine built, and the line
    said "ETA 24m26s"; the job ended 27 s later. The ETA now waits for the engines and uses their rate."""
    building = _progress(
        rows_done=8, rows_total=69, elapsed_seconds=30, rows_generated=0, generating_seconds=None
    )
    generating = _progress(
        rows_done=24, rows_total=69, elapsed_seconds=60, rows_generated=16, generating_seconds=4
    )

    assert describe_progress(building).endswith(", engines starting")
    assert "ETA" not in describe_progress(building)
    assert describe_progress(generating).endswith(
        " (4.0 rows/s while generating), ETA 11s"
    )  # 45 to go at 16 / 4 s
    assert "engines starting" not in describe_progress(
        {**building, "rows_done": 69}
    )  # done: nothing to wait for


def test_the_reporter_times_the_engines_from_their_first_row(tmp_path: Path) -> None:
    parts = tmp_path / "parts"
    _sidecar(parts, "part-resumed", rows=8, tokens_out=10, first_row_in_engine_at=1.0)  # an earlier try's
    reporter = ProgressReporter(str(parts), str(parts), rows_total=40, rows_resumed=8, interval=3600).start()
    _sidecar(parts, "part-rejected", rows=4, tokens_out=0)  # bad rows, staged by the sink: no engine
    assert (reporter.snapshot()["rows_generated"], reporter.snapshot()["generating_seconds"]) == (0, None)

    _sidecar(parts, "part-a", rows=16, tokens_out=100, first_row_in_engine_at=time.time() - 5)
    snapshot = reporter.snapshot()
    reporter.stop()

    assert snapshot["rows_generated"] == 16
    assert 5 <= snapshot["generating_seconds"] <= 7


def test_latest_progress_is_read_from_a_noisy_log() -> None:
    log = "\n".join(
        [
            "vllm INFO something",
            progress_log_line(_progress(rows_done=10)),
            "(MapWorker pid=1) more noise",
            progress_log_line(_progress(rows_done=20)),
            manifest_log_line({"rows_in": 20}),
            'RAYBATCH_PROGRESS_JSON={"rows_done": 3',  # cut short: ignored
        ]
    )
    assert progress_from_log(log)["rows_done"] == 20
    assert progress_from_log("no progress yet") is None


class _Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message: str, *args: Any) -> None:
        self.lines.append(message % args)

    warning = info


def test_relay_logs_new_progress_at_most_once_per_interval(
    hook: RayHook, ray_api: respx.MockRouter, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs = ray_api.get("/api/jobs/j1/logs").mock(
        side_effect=[
            httpx.Response(200, json={"logs": progress_log_line(_progress(rows_done=100))}),
            httpx.Response(200, json={"logs": progress_log_line(_progress(rows_done=100))}),
        ]
    )
    now = [1000.0]
    monkeypatch.setattr("time.monotonic", lambda: now[0])  # the time module's: tenacity reads it too
    log = _Log()
    relay = ProgressRelay("j1", interval_seconds=60, log=log)

    assert relay.relay(hook, JobStatus.RUNNING) is True  # first look
    now[0] += 10
    assert relay.relay(hook, JobStatus.RUNNING) is False  # not due: no fetch
    now[0] += 51
    assert relay.relay(hook, JobStatus.RUNNING) is False  # due, but nothing new
    now[0] += 100
    assert relay.relay(hook, JobStatus.PENDING) is False  # not running: no fetch

    assert logs.call_count == 2
    assert log.lines == ["Ray job j1: 100 / 5,000 rows (2.0%), 2.5 rows/s, 150 output tokens/s, ETA 32m40s"]


def test_the_end_of_the_job_always_gets_one_last_look(
    hook: RayHook, ray_api: respx.MockRouter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job shorter than the interval still shows its final count (the reporter prints it last)."""
    logs = ray_api.get("/api/jobs/j1/logs").mock(
        side_effect=[
            httpx.Response(200, json={"logs": "starting"}),
            httpx.Response(200, json={"logs": progress_log_line(_progress(rows_done=5000))}),
        ]
    )
    monkeypatch.setattr("time.monotonic", lambda: 1000.0)  # the interval never passes
    log = _Log()
    relay = ProgressRelay("j1", interval_seconds=60, log=log)

    assert relay.relay(hook, JobStatus.RUNNING) is False  # first look: no progress printed yet
    assert relay.relay(hook, JobStatus.SUCCEEDED) is True  # ended: looked although not due
    assert relay.relay(hook, JobStatus.SUCCEEDED) is False  # only once

    assert logs.call_count == 2
    assert log.lines[0].startswith("Ray job j1: 5,000 / 5,000 rows (100.0%)")


def test_interval_zero_turns_the_relay_off(hook: RayHook, ray_api: respx.MockRouter) -> None:
    logs = ray_api.get("/api/jobs/j1/logs").respond(json={"logs": ""})

    assert ProgressRelay("j1", interval_seconds=0, log=_Log()).relay(hook, JobStatus.RUNNING) is False
    assert not logs.called


def _sidecar(folder: Path, name: str, rows: int, tokens_out: int, **fields: float) -> None:
    """A part's sidecar as the part writer makes it (the reporter skips any other: the commit refuses it)."""
    folder.mkdir(parents=True, exist_ok=True)
    sidecar = {
        "sources": [f"{name}:{i}" for i in range(rows)],
        "files": {"outputs": f"{name}.parquet"},
        "rows_out": rows,
        "rows_failed": 0,
        "tokens_in": 0,
        "tokens_out": tokens_out,
        "errors_by_reason": {},
        **fields,
    }
    (folder / f"{name}.json").write_text(json.dumps(sidecar))


def test_a_sidecar_no_writer_of_ours_makes_is_not_counted(tmp_path: Path) -> None:
    parts = tmp_path / "parts"
    _sidecar(parts, "part-a", rows=3, tokens_out=5)
    (parts / "part-b.json").write_text(json.dumps({"sources": ["x"] * 1000, "tokens_out": 10**9}))
    (parts / "part-c.json").write_text("not JSON")

    snapshot = ProgressReporter(str(parts), str(parts), rows_total=2000, rows_resumed=0).snapshot()

    assert (snapshot["rows_done"], snapshot["tokens_out"]) == (3, 5)


def test_reporter_counts_staged_parts_and_only_this_runs_tokens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parts = tmp_path / "parts"
    _sidecar(parts, "part-resumed", rows=8, tokens_out=80)  # staged by an earlier try
    reporter = ProgressReporter(str(parts), str(parts), rows_total=40, rows_resumed=8, interval=3600).start()
    _sidecar(parts, "part-a", rows=16, tokens_out=100)
    (parts / "part-b.json.tmp-1").write_text("{")  # a sidecar being written: not a part yet

    snapshot = reporter.snapshot()
    reporter.stop()

    assert (snapshot["rows_done"], snapshot["rows_total"], snapshot["rows_resumed"]) == (24, 40, 8)
    assert snapshot["tokens_out"] == 100
    assert progress_from_log(capsys.readouterr().out)["rows_done"] == 24  # stop() prints the final count


def test_rows_staged_again_never_show_more_done_than_total(tmp_path: Path) -> None:
    parts = tmp_path / "parts"
    reporter = ProgressReporter(str(parts), str(parts), rows_total=4, rows_resumed=0, interval=3600).start()
    _sidecar(parts, "part-a", rows=4, tokens_out=4)
    _sidecar(parts, "part-b", rows=2, tokens_out=2)  # a retried batch's rows, staged again

    snapshot = reporter.snapshot()
    reporter.stop()

    assert (snapshot["rows_done"], snapshot["rows_total"]) == (4, 4)
    assert describe_progress(snapshot).startswith("4 / 4 rows (100.0%)")
