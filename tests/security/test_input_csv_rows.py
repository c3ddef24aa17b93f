"""What a CSV file makes the reader hold is bounded by a chunk of its records, not by the file.

Row data is untrusted (docs/security.md). The reader turned a whole CSV file into Python at once: its
records as lists of cells, written out and read again by pyarrow for the columns' types, then a dict
a row, before the first row left. A record costs about 450 B so, whatever its few bytes in the file:
2M one-character rows (4 MB) grew a reader by 888 MiB, and the 1 GiB a file may be by far more than a
node has. Now a file is read a chunk of ``CSV_CHUNK_BYTES`` at a time (pipeline/read/rows.py), twice
over: once to infer each column's type over the whole file, once to hand its rows on.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

#: As tests/security/test_input_decoded_size.py.
PEAK_GROWTH_LIMIT_MIB = 300

_MEASURE = """
import json, resource, sys
import pyarrow, pyarrow.csv  # imported before the baseline: not the file's cost
from airflow_provider_raybatch.pipeline.read import rows

with open(sys.argv[1], "rb") as source:
    data = source.read()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
count, errors, last = 0, [], None
for record in rows.parse_file("hostile.csv", data, "csv"):  # as Ray Data takes them: one by one
    count += 1
    last = record
    if record["error"]:
        errors.append(record["error"][:400])
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024
print(json.dumps({"file_bytes": len(data), "records": count, "errors": errors[:3], "last": last,
                  "grown_mib": grown}))
"""


@pytest.mark.timeout(300)
def test_a_csv_file_of_a_million_tiny_rows_is_read_a_chunk_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "hostile.csv"
    path.write_text("a\n" + "1\n" * 1_000_000)

    result = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(path)], capture_output=True, text=True, timeout=280
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])

    # every row read, typed as over the whole file, and never the whole file in Python at once
    assert (report["records"], report["errors"]) == (1_000_000, []), report
    assert report["last"] == {"source": "hostile.csv:1000000", "row": '{"a": 1}', "error": None}
    assert report["grown_mib"] < PEAK_GROWTH_LIMIT_MIB, report
