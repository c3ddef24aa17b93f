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


# A record is sized from its bytes before ``csv`` reads it (pipeline/read/raw_records.py): ``csv``
# built a 200 MB quoted field (1,717 MiB of growth) or a line of 50M empty fields (620 MiB) whole
# before the reader could refuse it. The bound (``records.RECORD_BYTES``) is lowered so that a small file
# shows each case; the records are counted, so ``csv.reader`` reading one unbounded fails the test.


@pytest.fixture
def small_bound(monkeypatch: pytest.MonkeyPatch) -> int:
    pytest.importorskip("pyarrow")
    from airflow_provider_raybatch.pipeline.read import records

    monkeypatch.setattr(records, "RECORD_BYTES", 64 << 10, raising=False)  # as on code before it
    return 64 << 10


def _records(data: bytes) -> list[dict[str, str | None]]:
    from airflow_provider_raybatch.pipeline.read import rows

    return list(rows.parse_file("f.csv", data, "csv"))


def _widest_record_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The cells and characters of each record Python's ``csv`` hands the reader, as a list."""
    from airflow_provider_raybatch.pipeline.read import csv_rows

    seen: list[int] = []
    real = csv_rows._csv_reader

    def counting(data: bytes):  # type: ignore[no-untyped-def]
        for cells in real(data):
            seen.append(len(cells) + sum(map(len, cells)))
            yield cells

    monkeypatch.setattr(csv_rows, "_csv_reader", counting)
    return seen


def test_a_long_quoted_field_is_its_error_row_unread(
    small_bound: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _widest_record_read(monkeypatch)
    data = b'a,b\n1,"' + b"x\n" * small_bound + b'"\n2,y\n'

    records = _records(data)

    assert [record["source"] for record in records] == ["f.csv:1", "f.csv:2"]
    assert str(records[0]["error"]).startswith("row too large: row 1 "), records[0]["error"]
    assert records[1]["error"] is None and json.loads(str(records[1]["row"])) == {"a": 2, "b": "y"}
    assert max(seen) < 100  # the long record never reached csv


def test_a_line_of_many_fields_is_its_error_row_unread(
    small_bound: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _widest_record_read(monkeypatch)
    data = b"a\n" + b"," * 2_000 + b"\n1\n"

    records = _records(data)

    assert str(records[0]["error"]).startswith("malformed CSV: row 1 has over 1 fields"), records[0]["error"]
    assert records[1]["error"] is None
    assert max(seen) < 100


def test_a_wide_record_within_the_bound_is_a_row(small_bound: int) -> None:
    # commas inside quotes are no cells: the record is read, at its true width
    data = b'a,b\n"' + b"," * 2_000 + b'",1\n'

    (record,) = _records(data)

    assert record["error"] is None and json.loads(str(record["row"])) == {"a": "," * 2_000, "b": 1}


def test_a_cell_is_charged_its_utf8_bytes_not_two_a_character(small_bound: int) -> None:
    # 40 KiB of ASCII in a 64 KiB bound: a row (it was charged 80 KiB, 2 bytes a character)
    data = b'a\n"' + b"x" * (40 << 10) + b'"\n'
    wide = b'a\n"' + b"x" * (40 << 10) + "\U0001f600".encode() + b'"\n'  # 4 bytes a character in a str

    assert _records(data)[0]["error"] is None
    assert str(_records(wide)[0]["error"]).startswith("row too large: ")
