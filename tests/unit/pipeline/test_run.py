"""Tests of airflow_provider_raybatch/pipeline/run.py: the committed version's manifest, key for key.

The manifest is a contract with the operator and with downstream readers (docs/downstream-contract.md):
``golden_manifests.json`` holds two manifests as this module wrote them (every key a plain run writes,
and the keys a run adds when it commits a held try's rows, counts labels and answers OpenAI lines), and
the manifest made from the same inputs now must be the same JSON, key for key and value for value.
The clock's two readings (``finished_at``, ``wall_seconds``) are fixed. run.py imports Ray: the manifest
is made in the cluster's environment.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.unit.pipeline.ray_env import run_in_ray_env

GOLDEN = Path(__file__).with_name("golden_manifests.json")

_MAKE = """
import json, os
from datetime import UTC, datetime
from airflow_provider_raybatch.pipeline import run, storage
from airflow_provider_raybatch.pipeline.generate.default_layout import LayoutChoice
from airflow_provider_raybatch.pipeline.read.prepared_cache import PreparedRows
from airflow_provider_raybatch.pipeline.reporting.timings import RunClock
from airflow_provider_raybatch.pipeline.stage import commit, ownership
from airflow_provider_raybatch.pipeline.stage.binding import RunBinding
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

os.environ["RAY_JOB_CONFIG_JSON_ENV_VAR"] = json.dumps({"metadata": {"job_submission_id": "raybatch-job-1"}})
run.time.perf_counter = lambda: 112.5

class _Clock(datetime):
    @classmethod
    def now(cls, tz=None):
        return datetime(2024, 5, 1, 6, 30, tzinfo=UTC)

run.datetime = _Clock

def manifest(openai):
    params = dict(model="m", input_uri="s3://in/d=2024-05-01/", input_format="jsonl")
    params.update(output_uri="s3://out/classify", run_key="classify-1")
    if openai:
        params.update(openai_endpoint="/v1/chat/completions", output_format="jsonl")
    else:
        params.update(user_template="{Company}", id_column="company_id")
    spec = BatchInferenceSpec.build(**params)
    started = datetime(2024, 5, 1, 6, 0, tzinfo=UTC)
    airflow = {"dag_id": "d", "task_id": "t", "run_id": "r", "map_index": "-1", "run_after": "2024-05-01"}
    airflow["try"] = "1"
    owned = run._OwnedRun(
        spec, storage.OutputLayout(spec.output_uri, spec.run_key),
        ownership.Owner("raybatch-job-1", airflow, 0.0), "m", started, 100.0,
        RunClock(started=started.timestamp()),
    )
    binding = RunBinding(spec.fingerprint(), input="in-1", code="code-1", model="model-1", engine="e-1")
    layout = LayoutChoice(2, "the default rule", "short answers", 1 << 30)
    bound = run._Bound(spec, layout, "in-1", binding)
    held_try = {"job_id": "raybatch-job-0", "version": "v0", "timings": {"generating_s": 4.5}}
    held_try["engine_pool"] = None
    staging = run._Staging(openai, held_try if openai else None, [], {"a", "b"}, None)
    rows = run._Rows(PreparedRows(None, 10, 2, 1, 1, reused=openai), 8, None, 2, None)
    committed = commit.CommittedRun(
        version="v1", outputs_uri="s3://out/classify/versions/v1/outputs",
        errors_uri="s3://out/classify/versions/v1/errors", rows_out=7, rows_failed=3, rows_duplicate=1,
        tokens_in=120, tokens_out=35, errors_by_reason={"duplicate id": 1, "missing id": 2},
        generated_text_counts={"no": 3, "yes": 4} if openai else None,
        report_uri="s3://out/classify/versions/v1/report.html",
        json_columns={"outputs": ["n"], "errors": []},
        failed_rows_message="3 of 9 rows failed." if openai else None,
    )
    timings = {"job_wall_s": 60.0, "generating_s": 30.25, "replicas": 2}
    pool = {"fingerprint": "8f26a2bb2cf787aa", "warm_replicas": 1, "replicas": 2} if openai else None
    versions = {"ray": "2.60.0", "vllm": "0.32.0"}
    made = run._manifest(owned, bound, staging, rows, committed, versions, lambda: timings, pool)
    return made.model_dump(mode="json")

print(json.dumps({"plain": manifest(False), "held_try_labels_openai": manifest(True)}))
"""


def test_the_manifest_is_the_golden_one_key_for_key() -> None:
    made = run_in_ray_env(_MAKE)
    golden = json.loads(GOLDEN.read_text())
    assert set(made) == set(golden)
    for case, manifest in made.items():
        assert sorted(manifest) == sorted(golden[case]), case
        assert json.dumps(manifest, sort_keys=True) == json.dumps(golden[case], sort_keys=True), case
