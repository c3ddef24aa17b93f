"""A file's rows may name at most ``MAX_FILE_COLUMNS`` columns, each row and all of them together.

Row data is untrusted (docs/security.md). Unless ``keep_columns`` picks some, every key of an input row
becomes a column of the output: a JSONL line of 150,000 keys (1.9 MiB, far inside a line's bound) made
a staged part that took 1 GiB to write, a CSV 100,000 columns wide ran its writer out of memory, and
rows of 20 keys of their own each made the commit (which gives every part the columns of all) cost the
square of the file. A row that would pass the bound is its own error row; a CSV header or a Parquet
schema over it is the file's.
"""

from __future__ import annotations

import io
import json

import pytest

from airflow_provider_raybatch.pipeline.read import column_bound, rows


def _line(keys: list[str]) -> bytes:
    return json.dumps(dict.fromkeys(keys, 1)).encode() + b"\n"


def test_a_jsonl_row_of_more_keys_than_a_file_may_name_is_its_error_row_and_the_next_is_read() -> None:
    data = _line([f"k{n}" for n in range(column_bound.MAX_FILE_COLUMNS + 1)]) + _line(["prompt"])

    records = list(rows.parse_file("wide.jsonl", data, "jsonl"))

    assert [record["source"] for record in records] == ["wide.jsonl:1", "wide.jsonl:2"]
    assert str(records[0]["error"]).startswith(
        f"too many columns: its row alone has at least {column_bound.MAX_FILE_COLUMNS + 1:,} columns, more"
    )
    assert records[1]["error"] is None


def test_jsonl_rows_each_of_keys_of_their_own_are_read_until_the_file_would_name_too_many(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(column_bound, "MAX_FILE_COLUMNS", 100)
    data = b"".join(_line(["prompt", *(f"r{row}_{n}" for n in range(19))]) for row in range(8))

    records = list(rows.parse_file("unique.jsonl", data, "jsonl"))

    # 1 + 19 x 5 = 96 names fit; the sixth row would make 115.
    assert [record["error"] is None for record in records] == [True] * 5 + [False] * 3
    assert "with this row, the file's rows would name 115 columns" in str(records[5]["error"])
    assert json.loads(str(records[5]["row"])).startswith('{"prompt"')  # the line as read, kept


def test_rows_that_repeat_the_file_s_columns_are_never_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(column_bound, "MAX_FILE_COLUMNS", 3)
    data = _line(["a", "b", "c"]) * 50 + _line(["c", "a"])

    assert all(record["error"] is None for record in rows.parse_file("same.jsonl", data, "jsonl"))


def test_a_csv_header_or_a_parquet_schema_of_more_columns_is_the_file_s_error_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setattr(column_bound, "MAX_FILE_COLUMNS", 10)
    csv_data = (",".join(f"c{n}" for n in range(11)) + "\n" + ",".join("1" * 11) + "\n").encode()
    sink = io.BytesIO()
    pq.write_table(pa.table({f"c{n}": [1] for n in range(11)}), sink)

    for name, data, input_format, what in (
        ("wide.csv", csv_data, "csv", "its header names 11 columns"),
        ("wide.parquet", sink.getvalue(), "parquet", "its schema has 11 columns"),
    ):
        records = list(rows.parse_file(name, data, input_format))  # type: ignore[arg-type]

        assert [record["source"] for record in records] == [f"{name}:0"]
        assert f"too many columns: {what}, more than a file's rows may name together (10" in str(
            records[0]["error"]
        )


def test_a_nested_object_s_keys_count_as_columns_so_one_row_cannot_fail_the_commit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A nested object's keys become a struct column's fields: a row of one object of 60,000 keys (649 KB)
    made a part whose footer the commit refused, failing the job. They count, by their path, in lists too."""
    monkeypatch.setattr(column_bound, "MAX_FILE_COLUMNS", 50)
    nested = {"id": 1, "s": {f"k{n}": {"deep": n} for n in range(30)}}  # 2 + 30 + 30 (s.kN.deep) columns
    in_a_list = {"id": 2, "items": [{f"a{n}": 1} for n in range(60)]}
    data = b"".join(json.dumps(row).encode() + b"\n" for row in (nested, in_a_list, {"id": 3, "s": {}}))

    records = list(rows.parse_file("nested.jsonl", data, "jsonl"))

    assert [record["error"] is None for record in records] == [False, False, True]
    assert "its row alone has at least 51 columns" in str(records[0]["error"])
    assert "its row alone has at least 51 columns" in str(records[1]["error"])


def test_rows_of_nested_objects_that_repeat_their_keys_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(column_bound, "MAX_FILE_COLUMNS", 10)
    row = {"id": 1, "meta": {"a": 1, "b": [{"c": 2}, {"c": 3, "d": 4}]}}  # id, meta, a, b, c, d
    data = (json.dumps(row) + "\n").encode() * 100

    assert all(record["error"] is None for record in rows.parse_file("same.jsonl", data, "jsonl"))


def test_a_parquet_schema_s_struct_fields_count_as_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setattr(column_bound, "MAX_FILE_COLUMNS", 20)
    struct = pa.struct([(f"f{n}", pa.int8()) for n in range(12)])
    table = pa.table({"id": [1], "s": pa.array([None], pa.list_(struct)), "t": pa.array([None], struct)})
    sink = io.BytesIO()
    pq.write_table(table, sink)

    (record,) = rows.parse_file("wide.parquet", sink.getvalue(), "parquet")

    assert record["source"] == "wide.parquet:0"
    assert "too many columns: its schema has 27 columns" in str(record["error"])
