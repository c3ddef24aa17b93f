"""Exactly-once at the edges, as real Ray jobs on the local cluster (pipeline/stage/binding.py and
ownership.py; the protocol's random sequences are tests/unit/pipeline/test_commit_protocol.py):

- an input rewritten in place between a stopped try and its retry: the retry discards what the stopped
  try staged and commits every id of the new input once (a mix before: an id twice, one lost);
- two live jobs of one run (a run deleted and triggered again while its job runs): the second waits
  for the first to end and takes its staging over; it never writes beside it;
- a retry that may take its run's committed version (``reuse_earlier_result``) takes it while nothing
  it was made from changed, and generates again once an input file was rewritten in place.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from airflow_provider_raybatch.hooks.ray import JobStatus, RayHook
from airflow_provider_raybatch.shared.job_ids import REUSE_COMMITTED_KEY, TaskTry
from airflow_provider_raybatch.shared.manifest import REUSED_RESULT_KEY, manifest_from_log
from tests.conftest import free_cpus_held, submit_pipeline, wait_for_job, warm_conf
from tests.integration.test_pipeline_job import make_operator

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def _write(path: Path, ids: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": i, "text": f"ticket {i}"}) + "\n" for i in ids))


def _operator(tiny_model: Path, tmp_path: Path, **overrides):
    return make_operator(
        tiny_model,
        str(tmp_path / "in" / "tickets.jsonl"),
        str(tmp_path / "out"),
        messages_column=None,
        user_template="Classify: {text}",
        id_column="id",
        keep_columns=None,
        output_format="parquet",
        **overrides,
    )


def _committed_ids(output_uri: Path) -> list[str]:
    manifest = json.loads((output_uri / "manifest.json").read_text())
    outputs = pq.read_table(manifest["outputs_uri"]).to_pylist()
    errors = pq.read_table(manifest["errors_uri"]).to_pylist() if manifest["rows_failed"] else []
    return sorted([row["id"] for row in outputs] + [row["id"] for row in errors])


def _staged(output_uri: Path, run_key: str) -> int:
    parts = output_uri / "_staging" / run_key / "parts"
    return (
        sum(len(json.loads(p.read_text())["sources"]) for p in parts.glob("*.json")) if parts.exists() else 0
    )


def test_an_input_rewritten_in_place_before_the_retry_commits_the_new_input_once(
    ray_connection, tiny_model: Path, tmp_path: Path
) -> None:
    """On the session's warm engines: the subject is the staging, not the engine."""
    hook, run_key = RayHook(), "edge-rewrite"
    source = tmp_path / "in" / "tickets.jsonl"
    _write(source, [f"c{i}" for i in range(1, 41)])
    operator = _operator(tiny_model, tmp_path, batch_size=4, **warm_conf())
    first = submit_pipeline(operator, run_key, f"edge-{uuid.uuid4().hex[:8]}")
    while _staged(tmp_path / "out", run_key) < 4:  # some rows staged: then it is stopped
        assert not hook.get_job_status(first).is_terminal, hook.get_job_log_tail(first, 40)
        time.sleep(0.1)
    hook.stop_job(first)
    assert wait_for_job(first) == JobStatus.STOPPED
    assert not (tmp_path / "out" / "manifest.json").exists()

    # Upstream delivers the file again, in place, with a row inserted at the top.
    _write(source, [f"c{i}" for i in range(0, 41)])
    retry = submit_pipeline(operator, run_key, f"edge-{uuid.uuid4().hex[:8]}")
    assert wait_for_job(retry) == JobStatus.SUCCEEDED, hook.get_job_log_tail(retry, 60)

    assert _committed_ids(tmp_path / "out") == sorted(f"c{i}" for i in range(0, 41))  # each once
    log = hook.get_job_logs(retry)
    assert "is not this run's (changed since: the input files)" in log, log[-3000:]


def test_a_second_live_job_of_a_run_waits_for_the_first_and_never_writes_beside_it(
    ray_connection, tiny_model: Path, tmp_path: Path
) -> None:
    """On the session's warm engines, both jobs: the subject is the staging's owner, not the engine."""
    hook, run_key = RayHook(), "edge-two-jobs"
    _write(tmp_path / "in" / "tickets.jsonl", [f"t{i}" for i in range(12)])
    operator = _operator(tiny_model, tmp_path, **warm_conf())
    with free_cpus_held(hook):  # the first job runs, its reads waiting for a CPU, until it is stopped
        first = submit_pipeline(operator, run_key, f"one-{uuid.uuid4().hex[:8]}")
        owner = tmp_path / "out" / "_staging" / f"{run_key}.owner.json"
        while not owner.exists():
            assert not hook.get_job_status(first).is_terminal, hook.get_job_log_tail(first, 40)
            time.sleep(0.5)
        # The run deleted and triggered again: its new try's job, the same run key.
        second = submit_pipeline(operator, run_key, f"two-{uuid.uuid4().hex[:8]}")
        while "waiting up to" not in hook.get_job_logs(second):
            assert not hook.get_job_status(second).is_terminal, hook.get_job_log_tail(second, 40)
            time.sleep(0.5)
        assert json.loads(owner.read_text())["job_id"] == first  # it did not take the staging
        hook.stop_job(first)  # what the deleted run's on_kill sends
        assert wait_for_job(first) == JobStatus.STOPPED
    assert wait_for_job(second) == JobStatus.SUCCEEDED, hook.get_job_log_tail(second, 60)

    assert _committed_ids(tmp_path / "out") == sorted(f"t{i}" for i in range(12))
    assert f"belonged to Ray job {first}, which ended (Ray's job table says so" in hook.get_job_logs(second)
    assert not owner.exists()  # released at the commit


def test_a_retry_takes_the_committed_version_only_while_nothing_it_was_made_from_changed(
    ray_connection, tiny_model: Path, tmp_path: Path
) -> None:
    """Jobs of one run on the session's warm engines, each allowed to take the committed version.
    The second finds nothing changed: it generates nothing and hands on the first's version (as after a
    Ray cluster restart, whose job table no longer knows the first: the version says what made it).
    The third finds an input file rewritten in place with its size and modification time kept: it
    generates again, the new input's ids each once. A fourth, of the run deleted and triggered again
    under its run id, generates again too."""
    hook, run_key = RayHook(), "edge-reuse"
    # Each job a try of one Airflow run (its metadata), allowed to take the run's committed version.
    run = TaskTry("edges", "manual__2026-11-21", "classify", -1, 1, "2026-11-21T08:00:00+00:00")
    take = {**run.metadata(), REUSE_COMMITTED_KEY: "true"}
    source = tmp_path / "in" / "tickets.jsonl"
    _write(source, [f"c{i}" for i in range(1, 9)])
    operator = _operator(tiny_model, tmp_path, **warm_conf())
    first = submit_pipeline(operator, run_key, f"edge-{uuid.uuid4().hex[:8]}", take)
    assert wait_for_job(first) == JobStatus.SUCCEEDED, hook.get_job_log_tail(first, 60)
    committed = json.loads((tmp_path / "out" / "manifest.json").read_text())

    second = submit_pipeline(operator, run_key, f"edge-{uuid.uuid4().hex[:8]}", take)
    assert wait_for_job(second) == JobStatus.SUCCEEDED, hook.get_job_log_tail(second, 60)
    assert json.loads((tmp_path / "out" / "manifest.json").read_text()) == committed  # nothing written
    taken = manifest_from_log(hook.get_job_logs(second))
    assert (taken["job_id"], taken["version"]) == (second, committed["version"])
    assert taken[REUSED_RESULT_KEY]["job_id"] == first and taken["timings"] is None

    # Upstream rewrites the file in place: two rows swapped, as many bytes, its modification time set back.
    before = source.stat()
    _write(source, ["c2", "c1", *(f"c{i}" for i in range(3, 9))])
    os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))
    third = submit_pipeline(operator, run_key, f"edge-{uuid.uuid4().hex[:8]}", take)
    assert wait_for_job(third) == JobStatus.SUCCEEDED, hook.get_job_log_tail(third, 60)
    log = hook.get_job_logs(third)
    assert f"Not taking version {committed['version']}, which Ray job {first} committed" in log, log[-3000:]
    assert "changed since: the input files" in log
    now = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert now["job_id"] == third and now["version"] != committed["version"]
    assert _committed_ids(tmp_path / "out") == sorted(f"c{i}" for i in range(1, 9))

    # The run deleted and triggered again under its run id (another run_after): a new run, which
    # asked to be run again; it generates, though nothing else changed.
    again = {**take, "airflow_run_after": "2026-11-21T09:00:00+00:00"}
    fourth = submit_pipeline(operator, run_key, f"edge-{uuid.uuid4().hex[:8]}", again)
    assert wait_for_job(fourth) == JobStatus.SUCCEEDED, hook.get_job_log_tail(fourth, 60)
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["job_id"] == fourth
