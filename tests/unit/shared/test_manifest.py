"""Tests of airflow_provider_raybatch/manifest.py: the manifest's hand-over through the driver log, and
the verdict on a run's failed rows."""

from __future__ import annotations

import json

import pytest

from airflow_provider_raybatch.shared.manifest import (
    MANIFEST_LOG_MARKER,
    describe_engine_pool,
    describe_timings,
    failed_rows,
    failed_rows_verdict,
    manifest_from_log,
    manifest_log_line,
)

MANIFEST = {"output_uri": "s3://b/out", "rows_in": 3, "rows_out": 2, "rows_failed": 1, "note": "héllo"}


def test_log_line_is_one_marked_line_of_sorted_compact_json() -> None:
    line = manifest_log_line(MANIFEST)

    assert line.startswith(MANIFEST_LOG_MARKER)
    assert "\n" not in line
    payload = line.removeprefix(MANIFEST_LOG_MARKER)
    assert json.loads(payload) == MANIFEST
    assert payload == json.dumps(MANIFEST, sort_keys=True, separators=(",", ":"))


def test_round_trip_through_a_log_with_other_lines() -> None:
    log = "\n".join(["starting", manifest_log_line(MANIFEST), "done", ""])

    assert manifest_from_log(log) == MANIFEST


def test_a_marker_inside_a_line_is_not_the_job_s_manifest() -> None:
    """The driver prints its manifest at a line's start; a line that quotes one (a row's text in a
    replica's warning, forwarded with Ray's prefix) is not the job's result, though it comes last."""
    forged = {**MANIFEST, "output_uri": "s3://elsewhere/"}
    quoted = "(MapWorker pid=7) Inference failed for row {'text': '" + manifest_log_line(forged) + "'}"
    carried = "(EngineReplica pid=8) Job x\r" + manifest_log_line(forged) + "\r"  # a "\r" in a forwarded line
    log = "\n".join([manifest_log_line(MANIFEST), quoted, carried, ""])

    assert manifest_from_log(log) == MANIFEST
    assert manifest_from_log(quoted) is None and manifest_from_log(carried) is None


def test_the_last_manifest_wins() -> None:
    earlier = {**MANIFEST, "rows_out": 0}
    log = manifest_log_line(earlier) + "\nretrying\n" + manifest_log_line(MANIFEST) + "\n"

    assert manifest_from_log(log) == MANIFEST


def test_no_manifest_gives_none() -> None:
    assert manifest_from_log("") is None
    assert manifest_from_log("line one\nRAYBATCH_MANIFEST\nline three") is None


# -- the failed-rows verdict ---------------------------------------------------------------------------


def run_manifest(rows_in: int, rows_failed: int, duplicates: int = 0, **reasons: int) -> dict:
    """A committed run's manifest: ``rows_failed`` error rows, ``duplicates`` of them duplicate ids."""
    errors_by_reason = {"duplicate id": duplicates} if duplicates else {}
    errors_by_reason.update({kind.replace("_", " "): count for kind, count in reasons.items()})
    return {
        "output_uri": "s3://b/out",
        "outputs_uri": "s3://b/out/versions/v1/outputs",
        "errors_uri": "s3://b/out/versions/v1/errors",
        "rows_in": rows_in,
        "rows_out": rows_in - rows_failed,
        "rows_failed": rows_failed,
        "rows_duplicate": duplicates,
        "errors_by_reason": errors_by_reason,
    }


def test_verdict_names_the_counts_the_threshold_the_reasons_and_the_committed_result() -> None:
    manifest = run_manifest(3000, 2400, missing_id=1200, preprocess_failed=900, bad_image=300)

    assert failed_rows_verdict(manifest, 0.1, None) == (
        "2,400 of 3,000 rows failed (80.0%, duplicate ids not counted), over max_failed_fraction=0.1. "
        "Most common reasons: 'missing id' 1,200; 'preprocess failed' 900; 'bad image' 300. "
        "Outputs and errors are committed: s3://b/out/versions/v1/outputs, s3://b/out/versions/v1/errors."
    )


def test_verdict_names_only_the_three_most_common_reasons_and_never_duplicate_ids() -> None:
    manifest = run_manifest(100, 60, duplicates=30, empty_prompt=10, missing_id=10, bad_image=7, b=3)

    verdict = failed_rows_verdict(manifest, 0.1, None)

    assert verdict is not None
    # 30 of the 70 distinct rows (a repeated id is neither a failure nor a row of its own)
    assert verdict.startswith("30 of 70 rows failed (42.9%, duplicate ids not counted)")
    # Ties in name order; duplicate ids are not failed rows, so not a reason either.
    assert "Most common reasons: 'empty prompt' 10; 'missing id' 10; 'bad image' 7." in verdict
    assert "duplicate" not in verdict.split("Most common reasons")[1]


@pytest.mark.parametrize(
    ("rows_in", "rows_failed", "fraction", "passes"),
    [
        (1000, 100, 0.1, True),  # at the threshold
        (1000, 101, 0.1, False),
        (100, 29, 0.29, True),  # 0.29 * 100 is 28.999...: compared as a share, 29 of 100 is at it
        (100, 30, 0.29, False),
        (10, 0, 0.0, True),
        (10, 1, 0.0, False),
        (10, 9, 1.0, True),
    ],
)
def test_verdict_fails_only_over_max_failed_fraction(
    rows_in: int, rows_failed: int, fraction: float, passes: bool
) -> None:
    verdict = failed_rows_verdict(run_manifest(rows_in, rows_failed), fraction, None)

    assert (verdict is None) is passes, verdict
    if not passes:
        assert f"over max_failed_fraction={fraction:g}." in str(verdict)


@pytest.mark.parametrize(("rows_failed", "passes"), [(5, True), (6, False)])
def test_verdict_fails_over_max_failed_rows(rows_failed: int, passes: bool) -> None:
    verdict = failed_rows_verdict(run_manifest(1000, rows_failed), 1.0, 5)

    assert (verdict is None) is passes, verdict
    if not passes:
        assert verdict == (
            "6 of 1,000 rows failed (0.6%, duplicate ids not counted), over max_failed_rows=5. "
            "Outputs and errors are committed: s3://b/out/versions/v1/outputs, s3://b/out/versions/v1/errors."
        )


def test_verdict_names_both_thresholds_when_both_are_passed() -> None:
    verdict = failed_rows_verdict(run_manifest(1000, 200), 0.1, 100)

    assert "(20.0%, duplicate ids not counted), over max_failed_fraction=0.1 and max_failed_rows=100." in str(
        verdict
    )


def test_duplicate_ids_are_not_failed_rows() -> None:
    """900 error rows, 850 of them duplicate ids whose id has an answer: 50 of the 150 distinct rows
    failed (33.3%; counted as failures, the duplicates would make it 90%)."""
    manifest = run_manifest(1000, 900, duplicates=850, missing_id=50)

    assert failed_rows(manifest) == 50
    assert failed_rows_verdict(manifest, 0.34, None) is None
    assert failed_rows_verdict(manifest, 0.33, None) is not None
    assert failed_rows_verdict(manifest, 0.34, 49) is not None


@pytest.mark.parametrize(("fraction", "rows"), [(1.0, None), (1.0, 1_000_000), (0.5, None)])
def test_a_run_whose_every_row_failed_always_fails(fraction: float, rows: int | None) -> None:
    verdict = failed_rows_verdict(run_manifest(40, 40, inference_failed=40), fraction, rows)

    assert verdict is not None
    assert verdict.startswith("40 of 40 rows failed (100.0%, duplicate ids not counted)")
    assert "; no row has an output, which fails a run whatever the thresholds." in verdict
    assert "Most common reasons: 'inference failed' 40." in verdict


@pytest.mark.parametrize(
    ("duplicates", "fraction", "passes"),
    [
        (0, 0.2, False),  # 15 of 50 rows, none repeated: 30%
        (50, 0.2, False),  # 15 of 100 rows, 50 of them a repeated id: still 15 of 50 distinct, 30%
        (50, 0.3, True),  # at the threshold
    ],
)
def test_the_failed_fraction_is_of_distinct_rows(duplicates: int, fraction: float, passes: bool) -> None:
    """Failed rows less duplicate ids over rows in less duplicate ids: a repeated id is neither."""
    manifest = run_manifest(50 + duplicates, 15 + duplicates, duplicates=duplicates, empty_prompt=15)

    verdict = failed_rows_verdict(manifest, fraction, None)

    assert (verdict is None) is passes
    if verdict is not None:
        assert verdict.startswith("15 of 50 rows failed (30.0%, duplicate ids not counted)")


def test_an_empty_input_passes() -> None:
    assert failed_rows_verdict(run_manifest(0, 0), 0.0, 0) is None
    assert failed_rows_verdict({"rows_in": 0, "rows_out": 0, "rows_failed": 0}, 0.1, None) is None


def test_verdict_reads_a_manifest_without_the_newer_keys() -> None:
    """A result taken from an older job: no rows_duplicate, errors_by_reason or URIs."""
    manifest = {"output_uri": "s3://b/out", "rows_in": 3, "rows_out": 2, "rows_failed": 1}

    assert failed_rows(manifest) == 1
    assert failed_rows_verdict(manifest, 0.1, None) == (
        "1 of 3 rows failed (33.3%, duplicate ids not counted), over max_failed_fraction=0.1."
    )
    assert failed_rows_verdict(manifest, 0.5, None) is None


def test_describe_timings_says_where_the_time_and_gpus_went() -> None:
    timings = {
        "job_wall_s": 110.5,
        "runtime_env_s": 3.25,
        "driver_start_s": 4.0,
        "read_and_prepare_s": 12.0,
        "engine_start_to_first_row_s": 32.0,
        "engine_build_s": 25.0,
        "generating_s": 54.25,
        "engine_stage_s": 87.0,
        "commit_s": 1.5,
        "replicas": 4,
        "gpus_per_replica": 0.25,
        "gpu_seconds_held": 87.0,
    }
    assert describe_timings(timings) == (
        "job 110.5 s; runtime env 3.2 s; driver start 4.0 s; read and prepare 12.0 s; "
        "engine start to first row 32.0 s; of which engine build 25.0 s; generating 54.2 s; commit 1.5 s; "
        "87.0 GPU-seconds held (4 replicas x 0.25 GPU)"
    )


def test_describe_timings_of_a_cpu_engine_says_no_gpu_was_held() -> None:
    """A CPU run's task log said '0.0 GPU-seconds held', which reads like a measuring fault."""
    timings = {
        "generating_s": 5.0,
        "replicas": 1,
        "gpus_per_replica": 0.0,
        "gpu_seconds_held": 0.0,
        "replica_seconds_held": 57.25,
    }

    assert describe_timings(timings) == "generating 5.0 s; no GPU held (1 CPU replica, 57.2 replica-seconds)"


@pytest.mark.parametrize(
    "timings", [None, "12 s", [], {}, {"generating_s": "54"}, {"commit_s": True, "gpu_seconds_held": None}]
)
def test_describe_timings_of_an_older_or_odd_manifest_says_nothing(timings: object) -> None:
    assert describe_timings(timings) is None


def test_describe_engine_pool_says_whether_the_run_found_its_engines_warm() -> None:
    pool = {"fingerprint": "8f26a2bb2cf787aa", "replicas": 2, "warm_replicas": 1, "keep_warm_seconds": 300.0}

    assert (
        describe_engine_pool(pool)
        == "engine pool 8f26a2bb2cf787aa: 1 of 2 replicas warm, kept warm 300 s after the job"
    )
    assert describe_engine_pool({**pool, "warm_replicas": 0}) == (
        "engine pool 8f26a2bb2cf787aa: 0 of 2 replicas warm (started cold), kept warm 300 s after the job"
    )
    # The build a cold job paid for: the slowest replica's (else it was only in engine_pool).
    built = [{"engine_build_seconds": 33.25}, {"engine_build_seconds": 79.7}, {"answered": False}]
    assert describe_engine_pool({**pool, "warm_replicas": 0, "replica_timings": built}) == (
        "engine pool 8f26a2bb2cf787aa: 0 of 2 replicas warm (started cold, engine built in 79.7 s), "
        "kept warm 300 s after the job"
    )


@pytest.mark.parametrize("pool", [None, "warm", {}, {"replicas": 1}, {"warm_replicas": "x", "replicas": 1}])
def test_describe_engine_pool_of_a_run_on_its_own_engines_says_nothing(pool: object) -> None:
    assert describe_engine_pool(pool) is None


def test_a_run_whose_rows_all_miss_their_id_names_the_id_column() -> None:
    """id_column='ticketID' (the file says ticket_id) read as 66 row errors."""
    reasons = {"missing id": 66, "malformed JSON": 1, "not a JSON object": 1}
    manifest = {
        "rows_in": 68,
        "rows_out": 0,
        "rows_failed": 68,
        "id_column": "ticketID",
        "errors_by_reason": reasons,
    }

    verdict = failed_rows_verdict(manifest, 0.1, None)

    assert verdict is not None
    assert "No row has a value in id_column='ticketID': is that the input's id column?" in verdict
    some_out = {**manifest, "rows_out": 2, "rows_failed": 66}  # some rows had one: the rows' fault
    assert "id_column" not in (failed_rows_verdict(some_out, 0.1, None) or "")
