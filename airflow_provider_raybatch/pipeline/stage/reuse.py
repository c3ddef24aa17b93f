"""Whether a try may take the version an earlier try of its run committed, instead of generating again.

A retry or clear of a run whose earlier try committed (``reuse_earlier_result``, the default) would
otherwise pay for every row again. The version is taken only when it is this run's (its ``run_key``)
and its rows were made from what this try would make them from: the same parameters (the spec's
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
from typing import Any

from airflow_provider_raybatch.manifest import REUSED_RESULT_KEY
from airflow_provider_raybatch.pipeline import storage
from airflow_provider_raybatch.pipeline.stage import commit
from airflow_provider_raybatch.pipeline.stage.binding import RunBinding
from airflow_provider_raybatch.pipeline.storage import OutputLayout
from airflow_provider_raybatch.specs import BatchInferenceSpec

log = logging.getLogger("airflow_provider_raybatch.pipeline")

#: The committed manifest's key naming what its rows were made from (:meth:`.binding.RunBinding.as_dict`).
BINDING_KEY = commit.BINDING_KEY


def committed_result(
    layout: OutputLayout, spec: BatchInferenceSpec, binding: RunBinding
) -> dict[str, Any] | None:  # Any: JSON values
    """The manifest of this run's committed version when this try may take it, else None; a version of
    this run and parameters that is not taken gets one log line saying what changed since."""
    try:
        manifest = commit.current_manifest(layout)
    except ValueError:  # not JSON, not UTF-8: no version this try could take
        return None
    if not isinstance(manifest, dict) or manifest.get("status") != "complete":
        return None
    if manifest.get("run_key") != spec.run_key:
        return None  # no version of this run is current (another run of the date published since)
    if manifest.get("spec_fingerprint") != spec.fingerprint():
        return None  # another spec's: the operator stops at other parameters, and says so
    version = manifest.get("version")
    if storage.exists(commit.held_manifest_uri(layout)) or (
        storage.exists(layout.staged_spec_uri)
        and isinstance(version, str)
        and commit.staged_data_uri(layout) != layout.version_uri(version)
    ):
        return None  # a later try of the run staged or held rows: this try resumes or takes them
    changes = binding.changes_from(RunBinding.from_dict(manifest.get(BINDING_KEY)))
    if changes:
        log.warning("Not taking version %s, which Ray job %s committed for %s: changed since: %s. "
                    "Generating again.", version, manifest.get("job_id") or "unknown", layout.run_key,
                    ", ".join(changes))  # fmt: skip
        return None
    return manifest


def taken(manifest: dict[str, Any], job_id: str | None) -> dict[str, Any]:  # Any: JSON values
    """The manifest of a job that took ``manifest``'s committed version, as ``job_id``'s result: the
    version's counts and places, with what it cost under :data:`REUSED_RESULT_KEY` (this job generated
    nothing: the committing job's timings as its own would read as a second run paid for)."""
    reused = {
        key: manifest.get(key) for key in ("job_id", "version", "finished_at", "timings", "engine_pool")
    }
    # Nor did it replace a version: the committing job did, and said so.
    own = {
        key: value
        for key, value in manifest.items()
        if key not in ("timings", "engine_pool", "replaced_version")
    }
    return {**own, "job_id": job_id, "timings": None, "engine_pool": None, REUSED_RESULT_KEY: reused}
