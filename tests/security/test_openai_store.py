"""The Batch API's file store reads or deletes only its own objects (it once reached any object or file).

s3fs cuts a key at ``?versionId=``, so the id ``<fid>.jsonl?versionId=`` read the uploader's own
*upload* as if it were a file record, and that record's ``uri`` was then trusted: an uploaded line
``{"id": "x", "object": "file", "purpose": "batch", "uri": "s3://other-bucket/payroll.jsonl"}``
served (and DELETE deleted) that object, and ``"uri": "/etc/hostname"`` a file of the API server.
Here against a real S3-compatible server on loopback (moto) and a local folder, through the store;
the same ids through the HTTP API are in test_openai_api.py.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from airflow_provider_raybatch.openai_api.store import NotFoundError, OpenAIStore, new_id

CONN_ID = "raybatch_security_s3"


def _forged_record(uri: str) -> bytes:
    return json.dumps({"id": "x", "object": "file", "purpose": "batch", "uri": uri}).encode() + b"\n"


def _tricks(file_id: str) -> list[str]:
    """Ids that once reached the upload's bytes as a record, or walked out of the files folder."""
    return [
        f"{file_id}.jsonl?versionId=",
        f"{file_id}.jsonl%3FversionId%3D",
        f"{file_id}.jsonl#",
        f"{file_id}.jsonl",
        f"{file_id}/../{file_id}",
        f"{file_id}\x00",
        f"{file_id.upper()}",
        "../files/" + file_id,
        "file-" + "0" * 31,
        "batch_" + "0" * 32,
        "",
    ]


@pytest.fixture
def s3_store(s3_server, monkeypatch) -> tuple[OpenAIStore, object]:
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", s3_server.connection_json())
    client = s3_server.client()
    bucket = f"openai-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    client.create_bucket(Bucket="payroll")
    client.put_object(Bucket="payroll", Key="payroll.jsonl", Body=b"salary: 1\n")
    return OpenAIStore(f"s3://{bucket}/openai", conn_id=CONN_ID), client


@pytest.mark.integration
def test_an_upload_read_as_a_record_reaches_no_other_bucket_on_s3(s3_store) -> None:
    store, client = s3_store
    upload = store.add_file(
        iter([_forged_record("s3://payroll/payroll.jsonl")]), "x.jsonl", "batch", owner="eve"
    )
    for trick in _tricks(upload["id"]):
        with pytest.raises(NotFoundError):
            b"".join(store.file_content(trick))
        with pytest.raises(NotFoundError):
            store.delete_file(trick)
        with pytest.raises(NotFoundError):
            store.file(trick)
    assert client.get_object(Bucket="payroll", Key="payroll.jsonl")["Body"].read() == b"salary: 1\n"
    # The upload itself is still served as what it is: its own bytes.
    assert b"".join(store.file_content(upload["id"])) == _forged_record("s3://payroll/payroll.jsonl")


def test_an_upload_read_as_a_record_reaches_no_local_file(tmp_path: Path) -> None:
    store = OpenAIStore(str(tmp_path / "store"))
    upload = store.add_file(iter([_forged_record("/etc/hostname")]), "x.jsonl", "batch", owner="eve")
    for trick in _tricks(upload["id"]):
        with pytest.raises(NotFoundError):
            b"".join(store.file_content(trick))
    assert Path("/etc/hostname").exists()


def test_a_record_whose_path_was_tampered_with_is_not_followed(tmp_path: Path) -> None:
    """Even a record file rewritten by someone with write access to the store names no path we read."""
    store = OpenAIStore(str(tmp_path / "store"))
    upload = store.add_file(iter([b'{"a": 1}\n']), "in.jsonl", "batch", owner="eve")
    record_path = tmp_path / "store" / "files" / f"{upload['id']}.json"
    record_path.write_text(json.dumps({**upload, "uri": "/etc/passwd"}))
    assert b"".join(store.file_content(upload["id"])) == b'{"a": 1}\n'


@pytest.mark.parametrize(
    "outputs_uri",
    [
        "/etc",
        "{output}/../../../files",
        "{output}/versions/v1/outputs?versionId=",
        "s3://payroll/",
        "{root}/files",
        "{output}/versions/../../../x",
    ],
)
def test_a_manifest_naming_a_folder_outside_its_batch_serves_nothing(
    tmp_path: Path, outputs_uri: str
) -> None:
    store = OpenAIStore(str(tmp_path / "store"))
    batch = {"id": new_id("batch"), "created_at": 1, "owner": "eve"}
    store.save_batch(batch)
    output = Path(store.output_uri(batch["id"]))
    output.mkdir(parents=True)
    uri = outputs_uri.format(output=output, root=tmp_path / "store")
    manifest = {"outputs_uri": uri, "errors_uri": uri, "request_counts": {"completed": 1, "failed": 1}}
    (output / "manifest.json").write_text(json.dumps(manifest))
    for kind in ("output", "errors"):
        with pytest.raises(NotFoundError):
            b"".join(store.file_content(store.output_file_id(batch["id"], kind)))


def test_foreign_files_in_the_store_folders_are_no_records(tmp_path: Path) -> None:
    """A ``manifest.json`` or junk written into files/ or batches/ breaks no listing."""
    store = OpenAIStore(str(tmp_path / "store"))
    good = store.add_file(iter([b"{}\n"]), "in.jsonl", "batch", owner="eve")
    batch = {"id": new_id("batch"), "created_at": 1, "owner": "eve"}
    store.save_batch(batch)
    (tmp_path / "store" / "files" / "manifest.json").write_text('{"committed": true}')
    (tmp_path / "store" / "batches" / "manifest.json").write_text("[1, 2")
    (tmp_path / "store" / "batches" / f"batch_{'a' * 32}.json").write_text("not json")
    assert [r["id"] for r in store.files()] == [good["id"]]
    assert [b["id"] for b in store.batches()] == [batch["id"]]
