"""A commit of many staged parts on a real S3 server (moto over loopback): in place, nothing lost.

CI's size of bench/commit_s3.py (issue 19: a 2M-row run's ~15,000 parts, bench/RESULTS.md 7b): 600
parts staged straight into the version folder, as engine replicas do (1,200 keys with their sidecars;
one S3 listing page holds 1,000); the replicas reported all but the last 60 (a replica that died
before reporting), whose sidecars the commit reads back. Every row is committed once, every part file
is in the version, the staging is gone, and the published manifest names the version. (800 and 80
would cost ~30 s more of CI.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.conftest import S3Server

PARTS, ROWS_PER_PART, UNREPORTED = 600, 8, 60


def _rows(first: int, count: int) -> list[dict[str, Any]]:  # Any: row values.
    """Rows as a replica stages them (bench/commit_s3.py's): an output record each."""
    return [
        {
            "source": f"customers.csv:{i + 2}",
            "ok": True,
            "record": json.dumps(
                {
                    "Customer Id": f"C{i:08d}",
                    "generated_text": "Technology",
                    "num_input_tokens": 64,
                    "num_generated_tokens": 2,
                }
            ),
            "label": "Technology",
        }
        for i in range(first, first + count)
    ]


@pytest.fixture
def s3_storage(s3_server: S3Server) -> Iterator[str]:
    from airflow_provider_raybatch.pipeline import storage

    bucket = "commit-many-parts"
    s3_server.client().create_bucket(Bucket=bucket)
    before = storage._s3_options
    storage._s3_options = storage.S3Options(
        endpoint_url=s3_server.endpoint_url,
        region="us-east-1",
        access_key=s3_server.access_key,
        secret_key=s3_server.secret_key,
    )
    try:
        yield bucket
    finally:
        storage._s3_options = before


def test_a_commit_of_many_parts_on_s3_keeps_every_row_once_in_place(s3_storage: str) -> None:
    from airflow_provider_raybatch.pipeline import storage
    from airflow_provider_raybatch.pipeline.stage import commit
    from airflow_provider_raybatch.pipeline.stage.parts import PartWriter
    from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

    spec = BatchInferenceSpec.build(
        model="m",
        input_uri=f"s3://{s3_storage}/in/customers.csv",
        output_uri=f"s3://{s3_storage}/out",
        user_template="{Company}",
        run_key="many-parts",
        output_format="parquet",
    )
    layout = storage.OutputLayout(spec.output_uri, spec.run_key)
    commit.open_staging(layout, spec)
    writer = PartWriter(
        layout.staging_uri, "parquet", count_labels=True, data_uri=commit.staged_data_uri(layout)
    )
    writer.create_folders()
    with ThreadPoolExecutor(16) as pool:
        staged = list(
            pool.map(lambda i: writer.write_part(_rows(i * ROWS_PER_PART, ROWS_PER_PART)), range(PARTS))
        )
    rows = PARTS * ROWS_PER_PART

    run = commit.write_version(layout, spec, rows, rewriter=writer, known_parts=staged[:-UNREPORTED])
    commit.publish(layout, {"version": run.version, "status": "complete"}, keep_versions=False)

    assert (run.rows_out, run.rows_failed) == (rows, 0)
    outputs = storage.list_files(run.outputs_uri)
    assert len(outputs) == PARTS  # each part's file where it was staged: nothing copied, nothing lost
    assert (
        json.loads(storage.read_text(storage.join(spec.output_uri, "manifest.json")))["version"]
        == run.version
    )
    assert storage.list_files(layout.staging_uri) == []  # the staging is gone once committed
    assert run.version in run.outputs_uri
