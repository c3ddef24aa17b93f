"""Tests of airflow_provider_raybatch/shared/run_manifest.py: the manifest's model writes the keys it was
given and reads what an older or a newer job wrote."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from airflow_provider_raybatch.shared.run_manifest import (
    DryRunManifest,
    EarlierJob,
    FailedRowsCheck,
    RunManifest,
)

#: A manifest as a provider before ``binding``, ``layout`` and ``failed_rows_check`` wrote it, with a key
#: this provider does not know (a newer job's).
OLDER = {
    "status": "complete",
    "version": "v1",
    "output_uri": "s3://b/out",
    "rows_in": 3,
    "rows_out": 2,
    "rows_failed": 1,
    "timings": None,
    "from_a_newer_job": {"kept": [1, 2]},
}


def test_a_manifest_read_and_written_again_is_the_same_json() -> None:
    manifest = RunManifest.of(OLDER)

    assert (manifest.version, manifest.rows_in, manifest.rows_duplicate) == ("v1", 3, None)
    assert manifest.to_json() == OLDER
    assert json.loads(manifest.model_dump_json()) == OLDER


def test_only_the_keys_given_or_set_are_written() -> None:
    manifest = RunManifest(status="complete", rows_in=1, engine_pool=None)
    manifest.held_try = EarlierJob(job_id="j0", timings=None)
    manifest.failed_rows_check = FailedRowsCheck(passed=True, message=None)

    assert manifest.to_json() == {
        "status": "complete",
        "rows_in": 1,
        "engine_pool": None,
        "held_try": {"job_id": "j0", "timings": None},
        "failed_rows_check": {"passed": True, "message": None},
    }


def test_a_value_of_another_type_is_refused() -> None:
    with pytest.raises(ValidationError, match="rows_in"):
        RunManifest.of({**OLDER, "rows_in": "three"})


@pytest.mark.parametrize(
    "other_type",
    [{"version": 3}, {"wall_seconds": "fast"}, {"airflow_run": {"try_number": 1}}, {"held_try": "j0"}],
)
def test_a_value_of_another_type_outside_the_deciding_fields_is_read_as_unset_and_handed_on(
    other_type: dict,
) -> None:
    """Before the manifest had a model, the task read such a manifest key by key and took it; so it
    still does: the value reads as unset, and is written back as it came."""
    manifest = RunManifest.of({**OLDER, **other_type})
    (key,) = other_type

    assert getattr(manifest, key) is None and manifest.rows_in == 3
    assert manifest.to_json() == {**OLDER, **other_type}
    assert DryRunManifest.of(manifest).to_json() == {**OLDER, **other_type}


@pytest.mark.parametrize(
    "other_type", [{"status": 1}, {"job_id": 7}, {"rows_failed": "one"}, {"errors_by_reason": []}]
)
def test_a_value_of_another_type_in_a_deciding_field_is_refused(other_type: dict) -> None:
    with pytest.raises(ValidationError, match=next(iter(other_type))):
        RunManifest.of({**OLDER, **other_type})


def test_a_dry_run_manifest_reads_its_own_keys_and_a_run_manifest_as_one() -> None:
    dry = DryRunManifest.of({"status": "dry_run", "rows_in": 4, "prompt_tokens": 40, "rows_per_second": 2.5})
    assert (dry.prompt_tokens, dry.rows_per_second, dry.estimated_engine_seconds) == (40, 2.5, None)
    assert DryRunManifest.of(RunManifest.of(OLDER)).to_json() == OLDER
    assert RunManifest.of(dry) is dry


def test_a_manifest_read_is_handed_on_as_written_in_its_order_unless_set_since() -> None:
    """Values pydantic reads into their field's type (``"12"`` as 12, ``3`` as 3.0, ``"yes"`` as True)
    and keys out of the model's order are handed on as the job wrote them; a field set since is not."""
    written = {
        "rows_failed": 0,
        "wall_seconds": 3,
        "from_a_newer_job": 1,
        "rows_in": "12",
        "prepared_rows_reused": "yes",
        "errors_by_reason": {"engine": "1"},
        "status": "complete",
        "rows_out": 12,
    }
    manifest = RunManifest.of(written)

    assert (manifest.rows_in, manifest.wall_seconds, manifest.prepared_rows_reused) == (12, 3.0, True)
    assert list(manifest.to_json().items()) == list(written.items())
    assert list(DryRunManifest.of(manifest).to_json().items()) == list(written.items())
    manifest.rows_in, manifest.replaced_version = 13, "v0"
    assert manifest.to_json() == {**written, "rows_in": 13, "replaced_version": "v0"}
