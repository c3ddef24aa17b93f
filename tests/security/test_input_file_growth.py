"""An input file that grows after the job's start-up size check is read no further than the bound.

The job checks each input file's size on its listing at the start (``run._check_input_files``), but
Ray Data reads the files later. ``read_binary_files`` read each one whole (``f.readall()``), so a local
file extended meanwhile (``truncate -s``: instant, sparse, no disk) or an S3 object overwritten after
the listing was held whole in a Ray worker, twice over (1.25 GiB: +2,560 MiB), before any bound was
checked. ``run._read_records`` now reads through :mod:`.read.bounded_files`: at most the bound + 1
byte of a file, then the job fails naming it, as a file over the bound at the start does.

The bound is made small here (``rows.MAX_INPUT_FILE_BYTES`` in the driver, which the read takes with
it to the workers), and the files grow by a few MiB: the shape is the same at 1 GiB.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.unit.pipeline.ray_env import run_in_ray_env

BOUND = 4096
#: What a file grows to after the start-up check (sparse: no disk).
GROWN = 16 << 20

_HEAD = """
import json, os, tracemalloc
import ray
ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR")
ray.data.DataContext.get_current().enable_progress_bars = False
from airflow_provider_raybatch.pipeline.read import rows
rows.MAX_INPUT_FILE_BYTES = BOUND

def outcome(read):
    try:
        return {"rows": read(), "raised": None}
    except rows.InputFileTooLargeError as err:
        return {"rows": None, "raised": "InputFileTooLargeError: " + str(err)}

def held_by_read_task(datasource):
    # The read task run in this process, so that tracemalloc sees the bytes pyarrow reads into
    # Python bytes, and Arrow's pool any read-ahead buffer.
    import pyarrow as pa
    (task,) = datasource.get_read_tasks(1)
    arrow_before = pa.default_memory_pool().max_memory()
    tracemalloc.start()
    try:
        got = outcome(lambda: sum(block.num_rows for block in task()))
        got["peak"] = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    got["arrow_peak"] = max(0, pa.default_memory_pool().max_memory() - arrow_before)
    return got
"""

_LOCAL = """
from airflow_provider_raybatch.pipeline import run
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec
folder = FOLDER
spec = BatchInferenceSpec.build(model="m", input_uri=folder, output_uri=folder + "-out", input_format="jsonl",
                                user_template="{text}")

def records():
    return sorted(record["source"] for record in run._read_records(spec).take_all())

run._check_input_files(spec)  # the job's start: every file within the bound
out = {"before": outcome(records)}
os.truncate(folder + "/a.jsonl", GROWN)  # whoever writes the input folder, after the check
out["grown"] = outcome(records)

from pyarrow import fs
from airflow_provider_raybatch.pipeline.read import bounded_files
datasource = bounded_files.BoundedBinaryDatasource(folder, BOUND, filesystem=fs.LocalFileSystem(),
                                                   include_paths=True, file_extensions=["jsonl"])
out["read_task"] = held_by_read_task(datasource)
# Files within the bound: the rows read_binary_files gives (bytes, path; the extensions filter).
os.truncate(folder + "/a.jsonl", 15)
ours = bounded_files.read_input_files(folder, fs.LocalFileSystem(), ["jsonl"])
rays = ray.data.read_binary_files(folder, filesystem=fs.LocalFileSystem(), include_paths=True,
                                  file_extensions=["jsonl"])
by_path = lambda ds: sorted((row["path"], row["bytes"].decode()) for row in ds.take_all())
out["same_as_ray"] = by_path(ours) == by_path(rays)

class Trickle:  # a stream that returns fewer bytes than asked, as a stream may
    def __init__(self, size):
        self.left, self.closed = size, False
    def read(self, n=-1):
        got = min(3, self.left, n if n >= 0 else self.left)
        self.left -= got
        return b"x" * got
import pyarrow as pa
trickles = [pa.PythonFile(Trickle(size), mode="r") for size in (5, 10, 100)]
out["trickle"] = [len(bounded_files.read_within(trickle, 10)) for trickle in trickles]
out["schema"] = [str(ours.schema()), str(rays.schema())]
print(json.dumps(out))
"""


def _snippet(body: str, **values: Any) -> str:  # Any: JSON values.
    settings = "".join(f"{name} = {json.dumps(value)}\n" for name, value in values.items())
    return settings + _HEAD + body


@pytest.fixture(scope="module")
def local_read(tmp_path_factory: pytest.TempPathFactory) -> Any:  # Any: the snippet's JSON.
    folder = tmp_path_factory.mktemp("grow") / "in"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.jsonl").write_bytes(b'{"text": "hi"}\n')
    (folder / "b.jsonl").write_bytes(b'{"text": "yo"}\n')
    (folder / "sub" / "C.JSONL").write_bytes(b'{"text": "up"}\n')
    (folder / "notes.txt").write_bytes(b"x" * (2 * BOUND))  # not an input file: never read
    (folder / "_hidden.jsonl").write_bytes(b"x" * (2 * BOUND))  # skipped by Ray's listing
    return run_in_ray_env(_snippet(_LOCAL, BOUND=BOUND, GROWN=GROWN, FOLDER=str(folder)))


@pytest.mark.timeout(300)
def test_a_local_file_grown_after_the_start_check_fails_the_job_naming_it_from_the_read(local_read) -> None:
    assert local_read["before"] == {"rows": ["a.jsonl:1", "b.jsonl:1", "sub/C.JSONL:1"], "raised": None}
    raised = local_read["grown"]["raised"]
    # Raised by the read itself, one byte past the bound: before, the worker read all 16 MiB and
    # parsed them (its own bound was the 1 GiB default), or failed only after holding them.
    assert raised and "InputFileTooLargeError: input file 'a.jsonl' grew after" in raised, raised
    assert f"over the {BOUND} bytes one input file may have" in raised and "Split it" in raised
    assert str(GROWN) not in raised


@pytest.mark.timeout(300)
def test_the_read_holds_at_most_the_bound_of_a_grown_file(local_read) -> None:
    read_task = local_read["read_task"]
    assert read_task["raised"] and "'a.jsonl' grew after" in read_task["raised"]
    assert read_task["peak"] < 4 * BOUND + (64 << 10), read_task["peak"]  # readall: over GROWN
    assert read_task["arrow_peak"] < 4 * BOUND + (64 << 10), read_task["arrow_peak"]


@pytest.mark.timeout(300)
def test_files_within_the_bound_read_as_read_binary_files_reads_them(local_read) -> None:
    assert local_read["same_as_ray"]
    assert local_read["schema"][0] == local_read["schema"][1]
    assert local_read["trickle"] == [5, 10, 11]  # short reads add up to the bound + 1, never past it


_S3 = """
from pyarrow import fs
from airflow_provider_raybatch.pipeline.read import bounded_files
import boto3
client = boto3.client("s3", endpoint_url=ENDPOINT, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                      region_name="us-east-1")
client.create_bucket(Bucket="grow")
client.put_object(Bucket="grow", Key="in/a.jsonl", Body=b'{"text": "hi"}\\n')
s3 = fs.S3FileSystem(access_key=KEY, secret_key=SECRET, region="us-east-1",
                     endpoint_override=ENDPOINT.split("://")[1], scheme="http")
datasource = bounded_files.BoundedBinaryDatasource("s3://grow/in", BOUND, filesystem=s3, include_paths=True,
                                                   file_extensions=["jsonl"])  # the listing: 15 bytes
out = {"before": outcome(lambda: bounded_files.read_input_files("s3://grow/in", s3, ["jsonl"]).count())}
client.put_object(Bucket="grow", Key="in/a.jsonl", Body=b"x" * GROWN)  # overwritten after the listing
out["read_task"] = held_by_read_task(datasource)
print(json.dumps(out))
"""


@pytest.mark.timeout(300)
def test_an_s3_object_overwritten_after_the_listing_is_read_no_further_than_the_bound(
    s3_server: Any,  # Any: the S3Server fixture.
) -> None:
    out = run_in_ray_env(
        _snippet(
            _S3,
            BOUND=BOUND,
            GROWN=GROWN,
            ENDPOINT=s3_server.endpoint_url,
            KEY=s3_server.access_key,
            SECRET=s3_server.secret_key,
        )
    )
    assert out["before"] == {"rows": 1, "raised": None}
    read_task = out["read_task"]
    assert read_task["raised"] and "input file 'a.jsonl' grew after" in read_task["raised"]
    assert read_task["peak"] < 4 * BOUND + (64 << 10), read_task["peak"]  # a ranged GET of BOUND + 1
    assert read_task["arrow_peak"] < 4 * BOUND + (64 << 10), read_task["arrow_peak"]
