"""An input file's size bounds what it holds on disk, not what it decodes to.

``MAX_INPUT_FILE_BYTES`` (1 GiB) is checked on the file's bytes. A dictionary-encoded column of one
long value repeated is a few KiB on disk: 85 KiB here decodes to 800 MB of text. Decoding the whole
table and turning every cell into a Python object at once took a worker to about 870 MiB for it, and
the same ratio lets a file far under the cap take a node's memory (the Ray worker, and whatever else
Ray's OOM killer picks on that node: other tenants' tasks too). Row data is untrusted
(docs/security.md): the reader decodes a batch of rows at a time and hands each row on as it goes
(pipeline/read/parquet_plan.py), so what a worker holds is one batch, whatever the file
decodes to.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: Decoded bytes above which a few-KiB file has clearly not been bounded.
PEAK_GROWTH_LIMIT_MIB = 300

_READ_BOMB = """
import io, json, resource
import pyarrow as pa, pyarrow.parquet as pq
from airflow_provider_raybatch.pipeline.read import rows

n, value = 400_000, "A" * 2000  # 800 MB of text once decoded
indices = pa.array([0] * n, pa.int32())
table = pa.table({"prompt": pa.DictionaryArray.from_arrays(indices, pa.array([value]))})
sink = io.BytesIO()
pq.write_table(table, sink, compression="zstd", use_dictionary=True, row_group_size=n)
data = sink.getvalue()
del table, indices
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
count, first, errors = 0, None, []
for record in rows.parse_file("bomb.parquet", data, "parquet"):  # as Ray Data takes them: one by one
    count += 1
    first = first or record
    if record.get("error"):
        errors.append(record["error"])
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024
print(json.dumps({"file_bytes": len(data), "rows": count, "first": first.get("source"),
                  "errors": errors[:3], "grown_mib": grown}))
"""


@pytest.mark.timeout(300)
def test_a_small_parquet_file_that_decodes_to_gigabytes_is_read_a_batch_at_a_time() -> None:
    result = subprocess.run([sys.executable, "-c", _READ_BOMB], capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])

    assert report["file_bytes"] < 200_000
    # every row read, none lost, and the worker never held the file's 800 MB of text at once
    assert (report["rows"], report["first"], report["errors"]) == (400_000, "bomb.parquet:1", []), report
    assert report["grown_mib"] < PEAK_GROWTH_LIMIT_MIB, report


@pytest.mark.parametrize(
    ("limit", "reason"),
    [
        ("MAX_INPUT_FILE_ROWS", "declares 20 rows"),
        ("MAX_INPUT_DECODED_BYTES", "its pages decompress to more than 10 bytes"),
    ],
)
def test_a_parquet_file_that_declares_more_than_a_file_may_hold_is_its_error_row(
    limit: str, reason: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A few bytes of Parquet can declare a hundred million rows (a null column) or gigabytes of pages;
    the footer and the page headers say so before anything is decoded (the limits lowered here to keep
    the file small)."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_provider_raybatch.pipeline.read import parquet_plan, rows

    sink = io.BytesIO()
    pq.write_table(pa.table({"prompt": [f"row {index}" for index in range(20)]}), sink)
    monkeypatch.setattr(parquet_plan, limit, 10)

    records = list(rows.parse_file("big.parquet", sink.getvalue(), "parquet"))

    assert [record["source"] for record in records] == ["big.parquet:0"]
    assert reason in records[0]["error"] and "split it into several files" in records[0]["error"]
