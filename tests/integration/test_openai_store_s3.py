"""The OpenAI API's file store on S3: the same files, output files and batch records as on local disk.

Against a real S3-compatible server on loopback (moto in server mode), through an Airflow AWS
connection, the way ``[raybatch] openai_files_uri = s3://...`` with ``openai_files_conn_id`` runs.
"""

from __future__ import annotations

import json
import uuid

import pytest

from airflow_provider_raybatch.openai_api.store import NotFoundError, OpenAIStore, new_id, public

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
    record = store.add_file(iter([b'{"a": 1}\n', b'{"b": 2}\n']), "in.jsonl", "batch", owner="alice")

    # What the Ray job is given: an s3:// URI of the upload's bytes, which are really in the bucket.
    assert store.upload_uri(record["id"]) == f"s3://{bucket}/{prefix}/files/{record['id']}.jsonl"
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
    older, newer = new_id("batch"), new_id("batch")
    store.save_batch({"id": older, "created_at": 5, "owner": "alice"})
    store.save_batch({"id": newer, "created_at": 9, "owner": "alice"})
    assert [b["id"] for b in store.batches()] == [newer, older]
    output_uri = store.output_uri(newer)
    assert output_uri == f"s3://{bucket}/{prefix}/batches/{newer}/output"

    # The run (a Ray job) writes its version's part files and manifest under the output URI.
    run = f"{prefix}/batches/{newer}/output"
    client.put_object(Bucket=bucket, Key=f"{run}/versions/v1/outputs/part-b.jsonl", Body=b"2\n")
    client.put_object(Bucket=bucket, Key=f"{run}/versions/v1/outputs/part-a.jsonl", Body=b"1\n")
    client.put_object(Bucket=bucket, Key=f"{run}/_staging/k/parts/p1.json", Body=b'{"rows_out": 1}')
    assert store.staged_sidecars(newer) == [{"rows_out": 1}]
    manifest = {
        "outputs_uri": f"{output_uri}/versions/v1/outputs",
        "errors_uri": f"{output_uri}/versions/v1/errors",
        "request_counts": {"completed": 2, "failed": 0},
    }
    client.put_object(Bucket=bucket, Key=f"{run}/manifest.json", Body=json.dumps(manifest).encode())
    assert store.read_json(f"{output_uri}/manifest.json") == manifest
    assert store.read_json(f"{output_uri}/absent.json") is None

    file_id = store.output_file_id(newer, "output")
    assert store.file(file_id)["bytes"] == 4 and store.file(file_id)["owner"] == "alice"
    assert b"".join(store.file_content(file_id)) == b"1\n2\n"  # part files in name order
    store.delete_file(file_id)  # the output lines stay with their run's version
    assert f"{run}/versions/v1/outputs/part-a.jsonl" in _keys(client, bucket)
    with pytest.raises(NotFoundError):
        store.file(file_id)
    store.delete_batch(older)
    assert [b["id"] for b in store.batches()] == [newer]
