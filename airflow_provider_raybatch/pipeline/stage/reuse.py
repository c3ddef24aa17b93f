"""Whether a try may take the version an earlier try of its run committed, instead of generating again.

A retry or clear of a run whose earlier try committed (``reuse_earlier_result``, the default) would
otherwise pay for every row again. The version is taken only when it is this run's: its ``run_key``,
and the Airflow run its job was submitted for (:data:`AIRFLOW_RUN_KEY`), ``run_after`` included, as
the operator attaches only to a job of this run. A manual run deleted and triggered again under the
same run id shares the run key, so the staging (one job writes it at a time), but is a new run that
asked to be run again; a scheduled run created again keeps its ``run_after`` and is the same run.
And its rows must have been made from what this try would make them from: the same parameters (the spec's
fingerprint) and the same :class:`.binding.RunBinding` (the input files, the code, the provider's
version, the model's files, the engine's libraries), as a staging and a held run must match. The
fingerprint alone misses a file rewritten in place, a preprocess fixed under the same name, new
weights in the model's folder. The check runs here, in the job, because only the cluster sees the
input files and the model as the job reads them.

It is checked against the version ``manifest.json`` names now, and only when nothing of the run was
staged or held since that commit: a later try that died (a rerun with ``reuse_earlier_result=False``)
left rows that a retry resumes, as it does any earlier try's, and a run another run of the date
replaced must run again to be current. Whether an earlier job of the run can be found in Ray's job
table does not matter: a cluster restarted since the commit has forgotten every job, and the committed
version still says which job made it and from what.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from airflow_provider_raybatch.pipeline import storage
from airflow_provider_raybatch.pipeline.stage import commit
from airflow_provider_raybatch.pipeline.stage.binding import RunBinding
from airflow_provider_raybatch.pipeline.storage import OutputLayout
from airflow_provider_raybatch.shared.json_types import JsonObject
from airflow_provider_raybatch.shared.manifest import REUSED_RESULT_KEY
from airflow_provider_raybatch.shared.run_manifest import COMPLETE_STATUS, EarlierJob, RunManifest
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

log = logging.getLogger("airflow_provider_raybatch.pipeline")

#: The committed manifest's key naming what its rows were made from (:meth:`.binding.RunBinding.as_dict`).
BINDING_KEY = commit.BINDING_KEY
#: The committed manifest's key naming the Airflow run its job was submitted for (:func:`airflow_run`).
AIRFLOW_RUN_KEY = "airflow_run"
#: What names an Airflow run, as a job's metadata gives it (without ``airflow_``; the try left out).
_RUN_NAMES = ("dag_id", "task_id", "run_id", "map_index", "run_after")


def airflow_run(job_run: Mapping[str, str]) -> dict[str, str] | None:
    """The Airflow run a job was submitted for (from its metadata, keys without ``airflow_``: the
    staging owner's :attr:`.ownership.Owner.run`), or None when its metadata names no whole run."""
    if not all(isinstance(job_run.get(key), str) for key in _RUN_NAMES):
        return None
    return {key: job_run[key] for key in _RUN_NAMES}


def committed_result(
    layout: OutputLayout, spec: BatchInferenceSpec, binding: RunBinding, run: dict[str, str] | None
) -> JsonObject | None:
    """The manifest of this run's committed version when this try may take it, else None; a version of
    this run and parameters that is not taken gets one log line saying what changed since.

    :param run: the Airflow run this job was submitted for (:func:`airflow_run`); None takes nothing.
    """
    try:
        manifest = commit.current_manifest(layout)
        current = RunManifest.of(manifest) if isinstance(manifest, dict) else None
    except ValueError:  # not JSON, not UTF-8, not a manifest: no version this try could take
        return None
    if manifest is None or current is None or current.status != COMPLETE_STATUS:  # None: not an object
        return None
    if run is None or current.run_key != spec.run_key or current.airflow_run != run:
        # No version of this run is current: another run of the date published since, or the run
        # was deleted and triggered again (another run_after).
        return None
    if current.spec_fingerprint != spec.fingerprint():
        return None  # another spec's: the operator stops at other parameters, and says so
    version = current.version
    if storage.exists(commit.held_manifest_uri(layout), within=layout.output_uri) or (
        storage.exists(layout.staged_spec_uri, within=layout.output_uri)
        and isinstance(version, str)
        and commit.staged_data_uri(layout) != layout.version_uri(version)
    ):
        return None  # a later try of the run staged or held rows: this try resumes or takes them
    changes = binding.changes_from(RunBinding.from_dict(current.binding))
    if changes:
        log.warning(
            "Not taking version %s, which Ray job %s committed for %s: changed since: %s. Generating again.",
            version,
            current.job_id or "unknown",
            layout.run_key,
            ", ".join(changes),
        )
        return None
    return manifest


def taken(manifest: JsonObject, job_id: str | None) -> JsonObject:
    """The manifest of a job that took ``manifest``'s committed version, as ``job_id``'s result: the
    version's counts and places, with what it cost under :data:`REUSED_RESULT_KEY` (this job generated
    nothing: the committing job's timings as its own would read as a second run paid for)."""
    earlier = RunManifest.of(manifest)
    reused = EarlierJob(
        job_id=earlier.job_id,
        version=earlier.version,
        finished_at=earlier.finished_at,
        timings=earlier.timings,
        engine_pool=earlier.engine_pool,
    )
    again = {"job_id": job_id, "timings": None, "engine_pool": None, REUSED_RESULT_KEY: reused}
    own = earlier.model_copy(update=again)
    # Nor did it replace a version: the committing job did, and said so.
    return own.model_dump(mode="json", exclude={"replaced_version"})
