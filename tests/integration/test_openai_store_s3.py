"""The OpenAI API's file store on S3: the same files, output files and batch records as on local disk.

Against a real S3-compatible server on loopback (moto in server mode), through an Airflow AWS
connection, the way ``[raybatch] openai_files_uri = s3://...`` with ``openai_files_conn_id`` runs.
"""

from __future__ import annotations

import json
import uuid

import pytest

from airflow_provider_raybatch.openai_api.store import NotFoundError, OpenAIStore, public

pytestmark = pytest.mark.integration

CONN_ID = "raybatch_openai_s3"


@pytest.fixture
def s3_store(s3_server, monkeypatch) -> tuple[OpenAIStore, object, str, str]:
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", s3_server.connection_json())
    client = s3_server.client()
    bucket = f"openai-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    return OpenAIStore(f"s3://{bucket}/openai", conn_id=CONN_ID), client, bucket, "openai"


def _keys(client, bucket: str) -> set[str]:
    return {item["Key"] for item in client.list_objects_v2(Bucket=bucket).get("Contents", [])}


def test_upload_read_list_and_delete_on_s3(s3_store) -> None:
    store, client, bucket, prefix = s3_store
    record = store.add_file(iter([b'{"a": 1}\n', b'{"b": 2}\n']), "in.jsonl", "batch")

    # What the Ray job is given: an s3:// URI of the upload's bytes, which are really in the bucket.
    assert record["uri"] == f"s3://{bucket}/{prefix}/files/{record['id']}.jsonl"
    body = client.get_object(Bucket=bucket, Key=f"{prefix}/files/{record['id']}.jsonl")["Body"].read()
    assert body == b'{"a": 1}\n{"b": 2}\n'
    assert f"{prefix}/files/{record['id']}.json" in _keys(client, bucket)
    assert record["bytes"] == 18 and "uri" not in public(record)

    assert b"".join(store.file_content(record["id"])) == body
    assert [r["id"] for r in store.files()] == [record["id"]]
    store.delete_file(record["id"])
    with pytest.raises(NotFoundError):
        store.file(record["id"])
    assert _keys(client, bucket) == set()


def test_a_batch_output_written_by_the_run_is_served_from_s3(s3_store) -> None:
    store, client, bucket, prefix = s3_store
    store.save_batch({"id": "batch_a", "created_at": 5})
    store.save_batch({"id": "batch_b", "created_at": 9})
    assert [b["id"] for b in store.batches()] == ["batch_b", "batch_a"]
    output_uri = store.output_uri("batch_b")
    assert output_uri == f"s3://{bucket}/{prefix}/batches/batch_b/output"

    # The run (a Ray job) writes its version's part files and manifest under the output URI.
    run = f"{prefix}/batches/batch_b/output"
    client.put_object(Bucket=bucket, Key=f"{run}/versions/v1/outputs/part-b.jsonl", Body=b"2\n")
    client.put_object(Bucket=bucket, Key=f"{run}/versions/v1/outputs/part-a.jsonl", Body=b"1\n")
    client.put_object(Bucket=bucket, Key=f"{run}/manifest.json", Body=json.dumps({"rows_out": 2}).encode())
    client.put_object(Bucket=bucket, Key=f"{run}/_staging/k/parts/p1.json", Body=b'{"rows_out": 1}')

    assert store.read_json(f"{output_uri}/manifest.json") == {"rows_out": 2}
    assert store.read_json(f"{output_uri}/absent.json") is None
    parts = f"{output_uri}/_staging/k/parts"
    assert store.glob(parts, "*.json") == [f"{parts}/p1.json"]
    outputs = f"{output_uri}/versions/v1/outputs"
    store.add_output_file("file-b-output", outputs, "batch_b_output.jsonl", store.size_of(outputs))
    assert store.file("file-b-output")["bytes"] == 4
    assert b"".join(store.file_content("file-b-output")) == b"1\n2\n"  # part files in name order

    store.delete_file("file-b-output")  # the output lines stay with their run's version
    assert f"{run}/versions/v1/outputs/part-a.jsonl" in _keys(client, bucket)
    store.delete_batch("batch_a")
    assert [b["id"] for b in store.batches()] == ["batch_b"]
