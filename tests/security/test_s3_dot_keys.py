"""An object key with an empty, ``.`` or ``..`` step below an S3 folder is never read or deleted.

S3 keeps and lists such a key as written, but pyarrow's S3 client resolves the steps when it asks
for the object: ``in/sub/../../../secrets/keys/prod.jsonl`` under ``s3://inputs-a`` is read as
``secrets/keys/prod.jsonl``, another bucket on a path-style endpoint. Whoever could write an input
folder made the job read any object its credentials could (its rows came back as the input's), and
whoever could write an output folder made each commit's sweep of orphan files delete objects
outside it. It is the object store's form of a link below a folder: a listing leaves such a key out,
and an input file of such a key is that file's error record, none of its bytes read.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.unit.pipeline.ray_env import run_in_ray_env

_PROBE = """
import json
from pyarrow import fs
import boto3
from airflow_provider_raybatch.pipeline import storage, row_steps
from airflow_provider_raybatch.pipeline.read import bounded_files

client = boto3.client("s3", endpoint_url=ENDPOINT, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                      region_name="us-east-1")
for bucket in ("tenant", "secrets"):
    client.create_bucket(Bucket=bucket)
client.put_object(Bucket="secrets", Key="keys/prod.jsonl", Body=b'{"prompt": "PROD SECRET ROW"}\\n')
client.put_object(Bucket="tenant", Key="other-team/report.csv", Body=b"theirs")
client.put_object(Bucket="tenant", Key="in/a.jsonl", Body=b'{"prompt": "mine"}\\n')
# Planted by whoever writes the input folder and the output folder: resolved, they name the objects above.
planted = "in/sub/../../../secrets/keys/prod.jsonl"
client.put_object(Bucket="tenant", Key=planted, Body=b'{"prompt": "decoy"}\\n')
outputs = "out/versions/v1/outputs"
client.put_object(Bucket="tenant", Key=f"{outputs}/part-1.jsonl", Body=b"{}\\n")
client.put_object(Bucket="tenant", Key=f"{outputs}/../../../../other-team/report.csv", Body=b"x")
client.put_object(Bucket="tenant", Key=f"{outputs}/../../../../../secrets/keys/prod.jsonl", Body=b"x")

s3 = fs.S3FileSystem(access_key=KEY, secret_key=SECRET, region="us-east-1",
                     endpoint_override=ENDPOINT.split("://")[1], scheme="http")
storage.filesystem = lambda uri: (s3, uri.split("://", 1)[1])  # the job's S3 settings
out = {"listed": storage.list_files(f"s3://tenant/{outputs}")}
out["removed"] = storage.remove_files(f"s3://tenant/{outputs}", "s3://tenant/out", keep=lambda path: False)

def body(bucket, key):
    return client.get_object(Bucket=bucket, Key=key)["Body"].read().decode()

out["outside_after"] = [body("secrets", "keys/prod.jsonl"), body("tenant", "other-team/report.csv")]
import ray
ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR")
datasource = bounded_files.BoundedBinaryDatasource(
    "s3://tenant/in", 1 << 20, filesystem=s3, include_paths=True, file_extensions=["jsonl"]
)
(task,) = datasource.get_read_tasks(1)
files = [row for block in task() for row in block.to_pylist()]
out["records"] = sorted(
    (record["source"], record["row"], record["error"])
    for file_row in files
    for record in row_steps.parse_file_row(file_row, "s3://tenant/in", "jsonl")
)
out["bytes_read"] = {row["path"]: len(row["bytes"]) for row in files}
print(json.dumps(out))
"""


@pytest.mark.timeout(300)
def test_keys_that_resolve_outside_their_folder_are_neither_read_nor_deleted(
    s3_server: Any,  # Any: the S3Server fixture.
) -> None:
    settings = {
        "ENDPOINT": s3_server.endpoint_url,
        "KEY": s3_server.access_key,
        "SECRET": s3_server.secret_key,
    }
    out = run_in_ray_env(
        "".join(f"{name} = {json.dumps(value)}\n" for name, value in settings.items()) + _PROBE
    )

    assert out["listed"] == ["tenant/out/versions/v1/outputs/part-1.jsonl"]
    assert out["removed"] == 1  # the part no sidecar names: the planted keys are not deleted through
    assert out["outside_after"] == ['{"prompt": "PROD SECRET ROW"}\n', "theirs"]
    planted = "sub/../../../secrets/keys/prod.jsonl"
    (mine, refused) = sorted(out["records"], key=lambda record: record[0] != "a.jsonl:1")
    assert mine == ["a.jsonl:1", json.dumps({"prompt": "mine"}), None]  # the row as JSON text
    assert refused[0] == f"{planted}:0" and refused[1] is None
    assert "input file refused" in refused[2] and "'..' step" in refused[2]
    assert out["bytes_read"][f"tenant/in/{planted}"] == 0
    assert "PROD SECRET ROW" not in json.dumps(out["records"])
