"""Read a finished job's result: the manifest committed at ``output_uri``, else the driver log's.

The committed ``manifest.json`` is the truth and outlives the driver log; telling this job's
result from another run's, falling back to the log, and noticing a version that a later commit
replaced are questions of storage and manifests, not of the task's lifecycle, so they live here
apart from the operator. Plain functions that take the spec, the storage connection and a logger.
"""

from __future__ import annotations

from airflow_provider_raybatch.hooks.ray import RayHook
from airflow_provider_raybatch.jobs.committed_manifest import exists as committed_exists
from airflow_provider_raybatch.jobs.committed_manifest import is_result_of, read_committed_manifest
from airflow_provider_raybatch.shared.exceptions import (
    RayBatchRowsFailedError,
    RayHookError,
    RayJobFailedError,
)
from airflow_provider_raybatch.shared.json_types import JsonObject, TaskLog
from airflow_provider_raybatch.shared.manifest import (
    MANIFEST_FILE_NAME,
    dry_run_uri,
    failed_rows,
    failed_rows_verdict,
    manifest_from_log,
)
from airflow_provider_raybatch.shared.run_manifest import (
    DRY_RUN_STATUS,
    HELD_STATUS,
    DryRunManifest,
    ManifestJson,
    RunManifest,
)
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec
from airflow_provider_raybatch.utils.events import job_event, job_failed_error


def asset_extra(manifest: ManifestJson, job_id: str) -> JsonObject:
    """What a downstream DAG needs from the output Asset event to read this run's output."""
    run = RunManifest.of(manifest)
    output_uri = str(run.output_uri)
    return {
        "output_uri": output_uri,
        "manifest_uri": f"{output_uri.rstrip('/')}/{MANIFEST_FILE_NAME}",
        "outputs_uri": run.outputs_uri,
        "rows_in": run.rows_in,
        "rows_out": run.rows_out,
        "rows_failed": run.rows_failed,
        "version": run.version,
        "job_id": job_id,
    }


def storage_conn_id(aws_conn_id: str | None) -> str | None:
    """The connection Airflow reads ``output_uri`` with: ``aws_conn_id`` where set."""
    return None if not aws_conn_id or aws_conn_id == "None" else aws_conn_id


def job_result(
    hook: RayHook,
    job_id: str,
    spec: BatchInferenceSpec,
    conn_id: str | None,
    log: TaskLog,
) -> JsonObject:
    """The succeeded job's result: the manifest committed at ``output_uri``, else the driver log's.

    The committed ``manifest.json`` is the truth and outlives the driver log (lost with a head
    restart or a driver node scaled away); the log is read only when Airflow cannot reach
    ``output_uri`` or finds another run's manifest there.

    :param conn_id: the connection to read ``output_uri`` with (:func:`storage_conn_id`).
    """
    folder = dry_run_uri(spec.output_uri, spec.run_key) if spec.dry_run else spec.output_uri
    committed = read_committed_manifest(folder, conn_id, within=spec.output_uri)
    if committed.manifest is not None and _is_result(committed.manifest, job_id, spec):
        log.info("Result of Ray job %s read from its manifest at %s.", job_id, folder)
        return committed.manifest
    why_not = committed.why_not or "the manifest there is another run's"
    try:
        driver_log = hook.get_job_logs(job_id)
    except RayHookError as err:
        driver_log, why_not = "", f"{why_not}; the driver log cannot be read ({err})"
    manifest = manifest_from_log(driver_log, accept=lambda found: _is_printed_result(found, job_id, spec))
    if manifest is None and manifest_from_log(driver_log) is not None:
        why_not = f"{why_not}; the driver log's manifest is not this job's result"
    if manifest is not None and committed.manifest is not None:
        check_not_superseded(manifest, committed.manifest, job_id, conn_id)
    if manifest is None:
        message = (
            f"Ray job {job_id} succeeded, but its result cannot be found: {why_not}, and the "
            "driver log holds no run manifest (it printed none, or the log is gone)."
        )
        tail = "\n".join(driver_log.rstrip("\n").splitlines()[-40:])
        raise job_failed_error(job_event("error", job_id, message, "succeeded"), tail)
    if (
        reused := RunManifest.of(manifest).reused_result
    ) is not None:  # the committed manifest names the other job
        log.info(
            "Ray job %s took version %s, which Ray job %s committed for this run from the same input "
            "files, code and model: nothing was generated again (the numbers below are that job's).",
            job_id,
            reused.version,
            reused.job_id or "unknown",
        )
        return manifest
    log.info("Result of Ray job %s read from its driver log (%s).", job_id, why_not)
    return manifest


def _is_result(manifest: JsonObject, job_id: str, spec: BatchInferenceSpec) -> bool:
    """Whether the manifest found is ``job_id``'s: a dry run's names its job, a commit is checked in full."""
    try:
        found = RunManifest.of(manifest)
    except (TypeError, ValueError):  # not an object, or values of other types: not a manifest of ours
        return False
    if spec.dry_run:
        return found.status == DRY_RUN_STATUS and found.job_id == job_id
    return is_result_of(found, job_id, spec.run_key, spec.fingerprint())


def _is_printed_result(manifest: JsonObject, job_id: str, spec: BatchInferenceSpec) -> bool:
    """Whether a manifest in ``job_id``'s driver log is its result: as :func:`_is_result`, and naming
    the job. Every job of this provider prints its id in its manifest; one without (the run key and
    fingerprint an older committed manifest is matched by are public) is a line another process put
    in the log."""
    return (
        isinstance(manifest, dict) and manifest.get("job_id") == job_id and _is_result(manifest, job_id, spec)
    )


def committed_result_of(job_id: str, spec: BatchInferenceSpec, conn_id: str | None) -> JsonObject | None:
    """The manifest committed at ``output_uri`` if it is ``job_id``'s result, else None."""
    committed = read_committed_manifest(spec.output_uri, conn_id).manifest
    if committed is not None and is_result_of(committed, job_id, spec.run_key, spec.fingerprint()):
        return committed
    return None


def held_result_of(hook: RayHook, job_id: str, spec: BatchInferenceSpec) -> JsonObject | None:
    """The manifest a failed job printed when it held its run for its failed rows, else None.

    Such a job wrote its version but did not commit it (``pipeline/stage/commit.hold``): it exits
    non-zero, so a retry submits a job again, which finds every row staged and, with looser
    thresholds, commits them. The log is the one place its manifest reaches Airflow.
    """
    try:
        return manifest_from_log(
            hook.get_job_logs(job_id), accept=lambda found: _is_held(found, job_id, spec)
        )
    except RayHookError:
        return None


def _is_held(manifest: JsonObject, job_id: str, spec: BatchInferenceSpec) -> bool:
    """Whether a manifest in ``job_id``'s driver log is that job's held run of ``spec``."""
    try:
        held = RunManifest.of(manifest)
    except (TypeError, ValueError):  # not an object, or values of other types: not a manifest of ours
        return False
    return (
        held.status == HELD_STATUS
        and held.job_id == job_id
        and held.run_key == spec.run_key
        and held.spec_fingerprint == spec.fingerprint()
    )


def check_not_superseded(
    manifest: JsonObject,
    committed: JsonObject,
    job_id: str,
    conn_id: str | None,
) -> None:
    """Fail when another job's commit at the same ``output_uri`` deleted this job's version.

    Two runs writing one ``output_uri`` (two runs of one date, two deployments) replace each
    other's versions unless ``keep_versions``: this job's manifest would point at nothing.
    """
    mine, current = RunManifest.of(manifest), RunManifest.of(committed)
    if not mine.outputs_uri or mine.version == current.version:
        return
    if committed_exists(mine.outputs_uri, conn_id) is False:
        raise RayJobFailedError(
            f"Ray job {job_id} committed version {mine.version} at {mine.output_uri}, "
            f"but a later commit there (version {current.version}, job "
            f"{current.job_id or 'unknown'}) replaced it and its outputs are gone. Two runs "
            "write to one output_uri: give each its own, or set keep_versions=True.",
            job_id=job_id,
            status="superseded",
        )


def check_failed_rows(manifest: ManifestJson, spec: BatchInferenceSpec, job_id: str) -> None:
    """Fail the task (RayBatchRowsFailedError) when more rows failed than the spec's thresholds allow.

    Judged here from the counts, with the thresholds as they are now, rather than read from the
    manifest's own ``failed_rows_check``: a result taken from an earlier job may predate that
    key, and a retry with loosened thresholds must pass on the same committed result.
    """
    run = DryRunManifest.of(manifest)
    verdict = failed_rows_verdict(run, spec.max_failed_fraction, spec.max_failed_rows)
    if verdict is not None and spec.dry_run:
        verdict = f"Dry run: the real run would fail: {verdict} Report: {run.dry_run_uri}"
    if verdict is not None:
        raise RayBatchRowsFailedError(
            verdict, rows_in=run.rows_in, rows_failed=failed_rows(run), job_id=job_id
        )
