"""A batch of Parquet rows is bounded in bytes, not in rows alone.

The reader decodes ``PARQUET_BATCH_ROWS`` (1,024) rows at a time, which bounds a file of many short
values repeated. One long dictionary value repeated is the same bomb turned around: a file of about
500 bytes whose one 1 MiB value repeats decodes to 1 GiB in its first batch (3 MiB: 3 GiB from under
600 bytes), and a few MiB more per value takes a node's memory. Either the rows leave a few at a time,
or the file is its error row before it is decoded; the worker never holds gigabytes for it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: As tests/security/test_input_decoded_size.py.
PEAK_GROWTH_LIMIT_MIB = 300

_READ_LONG_VALUE_BOMB = """
import io, json, resource
import pyarrow as pa, pyarrow.parquet as pq
from airflow_provider_raybatch.pipeline.read import rows

n = 2048
column = pa.DictionaryArray.from_arrays(pa.array([0] * n, pa.int32()), pa.array(["A" * (1 << 20)]))
sink = io.BytesIO()
pq.write_table(pa.table({"prompt": column}), sink, compression="zstd")
data = sink.getvalue()
del column
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
count, errors = 0, []
for record in rows.parse_file("bomb.parquet", data, "parquet"):  # as Ray Data takes them: one by one
    count += 1
    if record.get("error"):
        errors.append(record["error"][:200])
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024
print(json.dumps({"file_bytes": len(data), "rows": count, "errors": errors[:3], "grown_mib": grown}))
"""


@pytest.mark.timeout(300)
def test_a_tiny_parquet_file_of_one_long_value_repeated_never_decodes_a_gigabyte_batch() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _READ_LONG_VALUE_BOMB], capture_output=True, text=True, timeout=280
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])

    assert report["file_bytes"] < 2_000
    # every row read, or the file refused as one error row; never a gigabyte held for it
    assert (report["rows"], report["errors"]) == (2048, []) or (report["rows"], len(report["errors"])) == (
        1,
        1,
    )
    assert report["grown_mib"] < PEAK_GROWTH_LIMIT_MIB, report
