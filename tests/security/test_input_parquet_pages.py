"""What an input Parquet file makes the reader hold is bounded by its pages, whatever its footer says.

Row data is untrusted (docs/security.md). pyarrow decompresses each page to the size its own header
states and decodes a whole batch of rows before the reader sees one; the footer's totals are the
writer's word only. Each file here is a few KiB to a few MiB written by hand (``parquet_forge``, its
footer declaring little) and decodes to hundreds of MiB:

* plain (not dictionary) pages of long values: 1,024 rows of 1 MiB each in one page, and a struct
  of 16 MiB strings, decoded a whole batch at a time, grew a reader by about twice their size;
* one large dictionary page of distinct values, each used once, read as an Arrow dictionary,
  grew it by about five times its size;
* a footer of many one-row row groups costs pyarrow about 12x its bytes each time it is parsed (the
  reader parsed it four times over).

Now a page past ``PARQUET_PAGE_BYTES`` or a footer past ``MAX_FOOTER_BYTES`` makes the file its
one error row, and the rows of pages within the bounds are read in batches sized by their pages' bytes
(pipeline/read/parquet_plan.py): the reader grows by under :data:`PEAK_GROWTH_LIMIT_MIB` either way.
The sizes here are half or a quarter of those found (the same ratios), to keep the test's own memory
and time small.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import RAY_PYTHON, ROOT
from tests.security import parquet_forge as forge

#: As tests/security/test_input_decoded_size.py.
PEAK_GROWTH_LIMIT_MIB = 300
_MIB = 1 << 20

_MEASURE = """
import json, resource, sys
import pyarrow, pyarrow.parquet, pyarrow.compute  # imported before the baseline: not the file's cost
from airflow_provider_raybatch.pipeline.read import rows

with open(sys.argv[1], "rb") as source:
    data = source.read()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
count, errors = 0, []
for record in rows.parse_file("hostile.parquet", data, "parquet"):  # as Ray Data takes them: one by one
    count += 1
    if record["error"]:
        errors.append(record["error"][:400])
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024
print(json.dumps({"file_bytes": len(data), "records": count, "errors": errors[:3], "grown_mib": grown}))
"""


def _read_in_a_fresh_process(tmp_path: Path, data: bytes) -> dict[str, object]:
    """Parse ``data`` in a new interpreter of the cluster side (its peak memory is the reader's alone);
    what it reports."""
    path = tmp_path / "hostile.parquet"
    path.write_bytes(data)
    # The cluster side's interpreter: its pandas makes some values other Python objects than without.
    result = subprocess.run(
        [str(RAY_PYTHON), "-c", _MEASURE, str(path)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


def _refused(report: dict[str, object], reason: str) -> None:
    errors = report["errors"]
    assert report["records"] == 1 and isinstance(errors, list) and len(errors) == 1, report
    assert errors[0].startswith("unreadable file: not valid parquet: ") and reason in errors[0], errors[0]
    assert report["grown_mib"] < PEAK_GROWTH_LIMIT_MIB, report


@pytest.mark.timeout(300)
def test_a_plain_page_of_long_values_is_refused_by_its_header_not_decoded(tmp_path: Path) -> None:
    # 512 rows of 1 MiB in one zstd page: 512 MiB decompressed from 25 KB, the footer declaring 25 KB.
    column = forge.ForgedColumn(["prompt"], [forge.plain_page(b"A" * _MIB, 512)], declared_uncompressed=1)

    report = _read_in_a_fresh_process(tmp_path, forge.parquet([column], rows=512))

    assert report["file_bytes"] < 100_000
    _refused(report, "column 'prompt' has a page of 536,872,960 bytes decompressed, more than a page may")


@pytest.mark.timeout(300)
def test_a_struct_of_long_strings_in_one_page_is_refused(tmp_path: Path) -> None:
    # 32 rows of a struct holding a 16 MiB string: one 512 MiB page.
    column = forge.ForgedColumn(["message", "content"], [forge.plain_page(b"B" * (16 * _MIB), 32)])

    report = _read_in_a_fresh_process(tmp_path, forge.parquet([column], rows=32))

    _refused(report, "column 'message.content' has a page of 536,871,040 bytes decompressed")


@pytest.mark.timeout(300)
def test_long_values_in_small_pages_are_all_read_a_few_pages_at_a_time(tmp_path: Path) -> None:
    # 1,024 rows of 1 MiB in pages of 16: each page within the cap, the batch of 1,024 rows 1 GiB.
    pages = [forge.plain_page(bytes([65 + index % 26]) * _MIB, 16) for index in range(64)]
    column = forge.ForgedColumn(["prompt"], pages, declared_uncompressed=1)

    report = _read_in_a_fresh_process(tmp_path, forge.parquet([column], rows=1024))

    assert (report["records"], report["errors"]) == (1024, []), report
    assert report["grown_mib"] < PEAK_GROWTH_LIMIT_MIB, report


@pytest.mark.timeout(300)
def test_a_large_dictionary_page_of_distinct_values_is_refused(tmp_path: Path) -> None:
    # 65,536 distinct 4 KiB values, each used once: a 256 MiB dictionary page from 400 KB.
    column = forge.ForgedColumn(["prompt"], forge.dictionary_pages(65_536, 4096), declared_uncompressed=1)

    report = _read_in_a_fresh_process(tmp_path, forge.parquet([column], rows=65_536))

    assert report["file_bytes"] < 1_000_000
    _refused(report, "column 'prompt' has a dictionary page of 268,697,600 bytes decompressed")


@pytest.mark.timeout(300)
def test_a_footer_of_many_one_row_row_groups_is_refused_before_pyarrow_parses_it(tmp_path: Path) -> None:
    # 300,000 one-row row groups (all the same chunk): an 11 MB footer.
    column = forge.ForgedColumn(["prompt"], [forge.plain_page(b"x", 1)])

    report = _read_in_a_fresh_process(tmp_path, forge.parquet([column], rows=1, row_groups=300_000))

    _refused(report, "its footer is 11,100,047 bytes, more than a file's may be (8,388,608)")


def _list_of_structs(items: int, depth: int) -> bytes:
    """One row: a list of ``items`` structs nested ``depth`` deep around a bool, in a few hundred bytes."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    values: pa.Array = pa.repeat(False, items)
    for level in range(depth):
        values = pa.StructArray.from_arrays([values], names=[f"s{level}"])
    column = pa.ListArray.from_arrays(pa.array([0, items], pa.int32()), values)
    sink = io.BytesIO()
    pq.write_table(pa.table({"x": column}), sink, compression="zstd", data_page_size=64 * _MIB)
    return sink.getvalue()


@pytest.mark.timeout(300)
def test_a_row_of_a_million_nested_structs_is_refused_by_what_python_makes_of_it(tmp_path: Path) -> None:
    # A bool leaf is a few bytes in Arrow, but each struct around it is a dict (about 210 B) once the
    # row is Python: 1M items two structs deep grew the reader by about 450 MiB from a 650-byte file.
    data = _list_of_structs(1_000_000, 2)

    report = _read_in_a_fresh_process(tmp_path, data)

    assert report["file_bytes"] < 2_000
    _refused(report, "row 1 of its row group 0 is in pages that decode to")


@pytest.mark.timeout(300)
def test_a_row_of_many_nested_structs_within_the_bound_is_read(tmp_path: Path) -> None:
    report = _read_in_a_fresh_process(tmp_path, _list_of_structs(100_000, 2))

    assert (report["records"], report["errors"]) == (1, []), report
    assert report["grown_mib"] < PEAK_GROWTH_LIMIT_MIB, report


def _list_in_a_hidden_page(items: int, created_by: bytes | None) -> bytes:
    """One row, a list of ``items`` structs, dictionary-encoded: a dictionary page, then a data page of
    a few dozen bytes; the footer says the column chunk is its dictionary page alone."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    values = pa.StructArray.from_arrays([pa.repeat(pa.scalar(7, pa.int8()), items)], names=["s0"])
    column = pa.ListArray.from_arrays(pa.array([0, items], pa.int32()), values)
    sink = io.BytesIO()
    pq.write_table(pa.table({"x": column}), sink, compression="zstd", write_statistics=False)
    data = sink.getvalue()
    chunk = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(0).column(0)
    return forge.rewritten_footer(data, chunk.data_page_offset - chunk.dictionary_page_offset, created_by)


@pytest.mark.timeout(300)
def test_a_page_in_the_padding_pyarrow_reads_past_an_old_parquet_mr_chunk_is_charged(tmp_path: Path) -> None:
    # For parquet-mr 1.2.8 and older, pyarrow reads up to 100 bytes past each chunk (PARQUET-816): a
    # data page hidden there was decoded and never charged (3M items grew the reader by about 700 MiB).
    data = _list_in_a_hidden_page(3_000_000, created_by=b"parquet-mr version 1.2.8")

    report = _read_in_a_fresh_process(tmp_path, data)

    assert report["file_bytes"] < 1_000
    _refused(report, "row 1 of its row group 0 is in pages that decode to")


@pytest.mark.timeout(300)
def test_a_chunk_whose_pages_hold_fewer_values_than_its_footer_states_is_refused(tmp_path: Path) -> None:
    report = _read_in_a_fresh_process(tmp_path, _list_in_a_hidden_page(1_000, created_by=None))

    _refused(report, "whose pages hold 0 values where its footer states 1,000")


def test_an_old_parquet_mr_chunk_that_leaves_out_its_dictionary_header_is_read_as_pyarrow_reads_it() -> None:
    """parquet-mr 1.2.8 left the dictionary page's header out of a chunk's size; pyarrow's padding
    reads the chunk's last bytes all the same, and so does the walk."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_provider_raybatch.pipeline.read import rows

    sink = io.BytesIO()
    pq.write_table(pa.table({"x": [["a", "b"], ["a"]] * 50}), sink, write_statistics=False)
    data = sink.getvalue()
    chunk = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(0).column(0)
    short = forge.rewritten_footer(data, chunk.total_compressed_size - 20, b"parquet-mr version 1.2.8")

    records = list(rows.parse_file("old.parquet", short, "parquet"))

    assert [record["error"] for record in records] == [None] * 100
    assert [json.loads(str(record["row"])) for record in records[:2]] == [{"x": ["a", "b"]}, {"x": ["a"]}]


def test_a_dictionary_value_repeated_past_what_a_file_may_decode_to_ends_the_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A 2.5 KB file of one 40 MiB value used by 200 rows decoded to 8 GB of rows (437 MiB of reader
    # and 75 s): its pages are within every bound, its rows are not. The file's bound, lowered here.
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_provider_raybatch.pipeline.read import parquet_plan, rows

    monkeypatch.setattr(parquet_plan, "MAX_INPUT_DECODED_BYTES", 8 * _MIB)
    value = "x" * _MIB
    indices = pa.array([0] * 20, pa.int32())
    sink = io.BytesIO()
    table = pa.table({"prompt": pa.DictionaryArray.from_arrays(indices, pa.array([value]))})
    pq.write_table(table, sink, compression="zstd")
    assert len(sink.getvalue()) < 16_000

    records = list(rows.parse_file("repeated.parquet", sink.getvalue(), "parquet"))

    assert [record["source"] for record in records] == ["repeated.parquet:0"]
    assert "takes more than 8,388,608 bytes" in records[0]["error"]
    assert "only its first 0 rows were read; split it" in records[0]["error"]
