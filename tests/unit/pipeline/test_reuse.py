"""Whether a try takes the version an earlier try of its run committed (pipeline/stage/reuse.py), on
local disk: a version taken only when made from what this try would make its rows from."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest

from airflow_provider_raybatch.pipeline.stage import commit, reuse
from airflow_provider_raybatch.pipeline.stage.binding import RunBinding
from airflow_provider_raybatch.pipeline.storage import OutputLayout
from airflow_provider_raybatch.shared.manifest import REUSED_RESULT_KEY
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

RUN_KEY = "daily-2026-11-20"
#: The Airflow run the jobs below were submitted for (their metadata, without ``airflow_``).
RUN = {
    "dag_id": "daily",
    "task_id": "classify",
    "run_id": "manual__2026-11-21",
    "map_index": "-1",
    "run_after": "2026-11-21T08:00:00+00:00",
}


def _spec(tmp_path: Path, **params: object) -> BatchInferenceSpec:
    paths = {"input_uri": str(tmp_path / "in.jsonl"), "output_uri": str(tmp_path / "out")}
    return BatchInferenceSpec.build(model="m", run_key=RUN_KEY, user_template="{a}", **paths, **params)


def _binding(spec: BatchInferenceSpec) -> RunBinding:
    return RunBinding(spec=spec.fingerprint(), input="i1", code="c1", model="m1", engine="vllm==0.32.0")


def _commit(layout: OutputLayout, spec: BatchInferenceSpec, **overrides: object) -> dict[str, object]:
    """What run.py commits: a manifest naming the version, the run and what its rows were made from."""
    manifest = {
        "status": "complete",
        "version": "v1",
        "run_key": layout.run_key,
        "job_id": "job-1",
        "spec_fingerprint": spec.fingerprint(),
        "binding": _binding(spec).as_dict(),
        "rows_in": 3,
        "rows_out": 3,
        "rows_failed": 0,
        "timings": {"job_wall_s": 60.0},
        "engine_pool": None,
        "replaced_version": "v0",
        "output_uri": layout.output_uri,
        "airflow_run": RUN,
        **overrides,
    }
    Path(layout.version_uri("v1")).mkdir(parents=True)
    Path(layout.manifest_uri).write_text(json.dumps(manifest))
    return manifest


@pytest.fixture
def spec(tmp_path: Path) -> BatchInferenceSpec:
    return _spec(tmp_path)


@pytest.fixture
def layout(spec: BatchInferenceSpec) -> OutputLayout:
    return OutputLayout(spec.output_uri, RUN_KEY)


def test_a_version_made_from_the_same_is_taken_as_this_jobs_result(
    spec: BatchInferenceSpec, layout: OutputLayout
) -> None:
    committed = _commit(layout, spec)

    earlier = reuse.committed_result(layout, spec, _binding(spec), RUN)
    assert earlier == committed
    taken = reuse.taken(earlier, "job-2")
    assert (taken["job_id"], taken["version"], taken["rows_out"]) == ("job-2", "v1", 3)
    assert taken[REUSED_RESULT_KEY] == {
        "job_id": "job-1",
        "version": "v1",
        "finished_at": None,
        "timings": {"job_wall_s": 60.0},
        "engine_pool": None,
    }
    # This job generated nothing and replaced nothing: what the committing job paid is under reused_result.
    assert taken["timings"] is None and "replaced_version" not in taken


@pytest.mark.parametrize(
    ("field", "words"),
    [
        ("input", "the input files"),
        ("code", "the code"),
        ("model", "the model's files"),
        ("engine", "the engine's libraries"),
    ],
)
def test_a_version_made_from_anything_else_is_not_taken_and_the_log_says_what_changed(
    spec: BatchInferenceSpec, layout: OutputLayout, caplog: pytest.LogCaptureFixture, field: str, words: str
) -> None:
    """An input rewritten in place, a preprocess fixed under its name or the provider upgraded, new
    weights in the model's folder, vLLM upgraded on the cluster: the parameters are the same, the rows
    would not be."""
    _commit(layout, spec)
    now = dataclasses.replace(_binding(spec), **{field: "changed"})

    with caplog.at_level(logging.WARNING, logger="airflow_provider_raybatch.pipeline"):
        assert reuse.committed_result(layout, spec, now, RUN) is None

    [line] = [record.getMessage() for record in caplog.records]
    assert line.startswith(
        f"Not taking version v1, which Ray job job-1 committed for {RUN_KEY}: changed since: "
    )
    assert words in line and line.endswith("Generating again.") and "\n" not in line


@pytest.mark.parametrize(
    "overrides",
    [
        {"binding": None},  # committed by a provider that recorded no binding
        {"binding": {"spec": 1, "input": ["i1"]}},  # a hostile or broken record
        {"binding": "i1"},
        {"run_key": "daily-manual-2026-11-20"},  # another run of the date published since
        # the run deleted and triggered again under its run id: the same run key, another run_after
        {"airflow_run": {**RUN, "run_after": "2026-11-21T07:00:00+00:00"}},
        {"airflow_run": None},  # committed by a job Airflow did not submit
        {"spec_fingerprint": "0123456789abcdef"},  # other parameters
        {"status": "held"},
        {"status": None},
    ],
    ids=[
        "not-recorded",
        "malformed",
        "not-a-dict",
        "another-run",
        "run-created-again",
        "no-airflow-run",
        "other-parameters",
        "held",
        "no-status",
    ],
)
def test_a_version_of_another_run_or_parameters_or_an_unreadable_binding_is_not_taken(
    spec: BatchInferenceSpec, layout: OutputLayout, overrides: dict[str, object]
) -> None:
    _commit(layout, spec, **overrides)
    assert reuse.committed_result(layout, spec, _binding(spec), RUN) is None


@pytest.mark.parametrize(
    "manifest", [b"[1, 2]", b"{not json", b"\xff\xfe"], ids=["list", "not-json", "not-utf8"]
)
def test_a_manifest_no_version_can_be_read_from_is_nothing_to_take(
    spec: BatchInferenceSpec, layout: OutputLayout, manifest: bytes
) -> None:
    Path(layout.manifest_uri).parent.mkdir(parents=True)
    Path(layout.manifest_uri).write_bytes(manifest)
    assert reuse.committed_result(layout, spec, _binding(spec), RUN) is None


def test_nothing_is_taken_once_a_later_try_staged_or_held_rows(
    spec: BatchInferenceSpec, layout: OutputLayout
) -> None:
    """A later try (a rerun with reuse_earlier_result=False that died, or was held) left rows: a retry
    resumes or takes those, as it does any earlier try's, rather than the version before them."""
    _commit(layout, spec)
    staging = Path(layout.staging_uri)
    staging.mkdir(parents=True)
    # The committing try's own staging, left by a job stopped between its publish and its cleanup.
    Path(layout.staged_spec_uri).write_text(json.dumps({commit.STAGED_VERSION_KEY: "v1"}))
    assert reuse.committed_result(layout, spec, _binding(spec), RUN) is not None

    Path(layout.staged_spec_uri).write_text(json.dumps({commit.STAGED_VERSION_KEY: "v2"}))
    assert reuse.committed_result(layout, spec, _binding(spec), RUN) is None

    Path(layout.staged_spec_uri).unlink()
    Path(commit.held_manifest_uri(layout)).write_text(json.dumps({"status": "held"}))
    assert reuse.committed_result(layout, spec, _binding(spec), RUN) is None


def test_a_job_whose_metadata_names_no_whole_run_takes_nothing(
    spec: BatchInferenceSpec, layout: OutputLayout
) -> None:
    _commit(layout, spec)
    partial = {key: value for key, value in RUN.items() if key != "run_after"}

    assert reuse.airflow_run({**RUN, "try_number": "2"}) == RUN  # the try is no part of the run
    assert reuse.airflow_run(partial) is None
    assert reuse.committed_result(layout, spec, _binding(spec), reuse.airflow_run(partial)) is None
