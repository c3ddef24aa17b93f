"""One row's shape may not fail the job or cost the replica gigabytes (``pipeline/read/column_bound.py``).

Row data is untrusted (docs/security.md). Every input column goes to the output, which the replica
writes as Parquet parts (Arrow infers each column's type from the part's rows) and the commit reads
back. Before these bounds, the reader took any row json.loads takes, and:

* a ~250-byte JSONL row of lists of objects 34 deep made a part nothing could read ("Parquet schema
  too deeply nested"): the commit failed, and every retry alike; 300 deep grew the writer by 568 MiB;
* a 67 KB row of a list of 4,090 objects of one key each of their own made Arrow build a struct of
  4,090 fields for 4,090 items: +670 MiB in the writer for one row;
* a row of 100 keys of 40,000 characters (or a CSV header of them) made a part whose footer was
  13 MB, which the commit refuses (8 MiB): the job failed.

Now each is the row's error row (a CSV header's or Parquet schema's: the file's), and a row just inside
each bound goes through the replica's part writer, the commit and a downstream reader.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_raybatch.pipeline import row_steps
from airflow_provider_raybatch.pipeline.read import column_bound, records, rows
from airflow_provider_raybatch.pipeline.stage import part_schema
from airflow_provider_raybatch.pipeline.stage.parts import PartWriter
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

DEPTH = column_bound.MAX_NESTING_DEPTH


def _nested(shape: str, depth: int) -> Any:  # Any: a JSON value
    """A value ``depth`` lists and objects deep: objects, lists, or lists of objects."""
    value: Any = 1  # Any: a JSON value
    for level in range(depth):
        if shape == "objects" or (shape == "lists of objects" and level % 2 == 0):
            value = {"a": value}
        else:
            value = [value]
    return value


def _records(name: str, *lines: dict[str, Any]) -> list[records.Record]:  # Any: JSON values
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    return list(rows.parse_file(name, data, "jsonl"))


def _through_the_commit(root: Path, row: dict[str, Any]) -> None:  # Any: JSON values
    """Stage ``row`` in a part beside another part without its columns (so the commit rewrites it), as
    the replica does, conform the parts as the commit does, and read every part back as the commit and
    a downstream reader do."""
    import pyarrow.parquet as pq

    writer = PartWriter(str(root / "staging"), "parquet", count_labels=False)

    def staged(number: int, columns: dict[str, Any]) -> dict[str, Any]:  # Any: JSON values
        record = {"row_id": f"f:{number}", **columns, "generated_text": "g"}
        return {"source": f"f:{number}", "ok": True, "record": json.dumps(record), "tokens": [1, 1]}

    parts = [
        writer.write_part([staged(0, {"text": "t"})]),  # type: ignore[list-item]
        writer.write_part([staged(1, row)]),  # type: ignore[list-item]
    ]
    writer.conform_parts(parts)
    files = sorted((root / "staging").rglob("outputs/*.parquet"))
    assert len(files) == 2
    for file in files:
        data = file.read_bytes()
        assert len(part_schema.decode_parquet(data, file.name)) == 1
        assert pq.read_table(io.BytesIO(data)).num_rows == 1


# -- nesting depth --------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["objects", "lists", "lists of objects"])
def test_a_jsonl_row_nested_past_the_bound_is_its_error_row_and_the_next_is_read(shape: str) -> None:
    records = _records("deep.jsonl", {"text": "hi", "d": _nested(shape, DEPTH + 1)}, {"text": "next"})

    assert [record["source"] for record in records] == ["deep.jsonl:1", "deep.jsonl:2"]
    assert str(records[0]["error"]).startswith(f"too deeply nested: its values nest more than {DEPTH} lists")
    assert records[1]["error"] is None


@pytest.mark.parametrize("shape", ["objects", "lists", "lists of objects"])
def test_a_row_nested_as_deep_as_the_bound_goes_through_the_part_writer_and_the_commit(
    shape: str, tmp_path: Path
) -> None:
    (record,) = _records("deep.jsonl", {"text": "hi", "d": _nested(shape, DEPTH)})
    assert record["error"] is None

    _through_the_commit(tmp_path, json.loads(str(record["row"])))


def test_a_parquet_schema_nested_past_the_bound_is_the_file_s_error_row() -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    kind = pa.int8()
    for _ in range(DEPTH + 1):
        kind = pa.list_(kind)
    sink = io.BytesIO()
    pq.write_table(pa.table({"text": ["hi"], "d": pa.array([None], kind)}), sink)

    (record,) = rows.parse_file("deep.parquet", sink.getvalue(), "parquet")

    assert record["source"] == "deep.parquet:0"
    assert "too deeply nested: its schema's columns nest more than" in str(record["error"])


# -- cells that lists of objects leave empty --------------------------------------------------------


def test_a_list_of_objects_each_of_keys_of_its_own_is_its_error_row() -> None:
    """1,100 objects of one key each: 1,100 x 1,100 cells once Arrow gives each object every key."""
    sparse = {"text": "t", "d": [{f"k{n}": n} for n in range(1100)]}
    # One wide object among many items: its struct has a slot for each item too.
    wide_among_many = {"text": "t", "d": [{"e": {f"k{n}": n for n in range(1100)}}, *[{}] * 1100]}

    records = _records("sparse.jsonl", sparse, wide_among_many, {"text": "next"})

    for record in records[:2]:
        assert str(record["error"]).startswith("too many empty cells: its objects would leave 1,2"), record
    assert records[2]["error"] is None


def test_lists_of_objects_with_the_same_keys_are_read_however_long() -> None:
    dense = {"text": "t", "d": [{"a": n, "b": str(n), "c": [n]} for n in range(50_000)]}

    (record,) = _records("dense.jsonl", dense)

    assert record["error"] is None


def test_a_row_just_inside_the_empty_cell_bound_goes_through_the_part_writer_and_the_commit(
    tmp_path: Path,
) -> None:
    items = 1024  # 1,024 x 1,024 cells, 1,024 of them filled: just under the bound
    assert items * items - items <= column_bound.MAX_ROW_EMPTY_CELLS < (items + 1) ** 2 - items - 1
    (record,) = _records("sparse.jsonl", {"text": "t", "d": [{f"k{n}": n} for n in range(items)]})
    assert record["error"] is None

    _through_the_commit(tmp_path, json.loads(str(record["row"])))


# -- the length of column names -----------------------------------------------------------------------


def _keys(count: int, length: int) -> dict[str, int]:
    return {f"{n:06d}".ljust(length, "k"): 1 for n in range(count)}


@pytest.mark.parametrize("nested", [False, True])
def test_a_jsonl_row_of_long_key_names_is_its_error_row(nested: bool) -> None:
    keys = _keys(100, 6000)  # 600,000 bytes of names, within the column bound
    row = {"text": "t", "d": keys} if nested else {"text": "t", **keys}

    records = _records("names.jsonl", row, {"text": "next"})

    assert str(records[0]["error"]).startswith("column names too long: "), records[0]["error"]
    assert f"({column_bound.MAX_FILE_NAME_BYTES:,} bytes" in str(records[0]["error"])
    assert records[1]["error"] is None


def test_rows_of_long_key_names_of_their_own_are_read_until_the_file_would_name_too_many() -> None:
    rows_of_own_keys = [{"text": "t", f"r{row}".ljust(150_000, "k"): 1} for row in range(5)]

    records = _records("names.jsonl", *rows_of_own_keys)

    assert [record["error"] is None for record in records] == [True] * 3 + [False] * 2
    assert "with this row, the file's rows would name 600,0" in str(records[3]["error"])


def test_a_csv_header_or_parquet_schema_of_long_names_is_the_file_s_error_row() -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = list(_keys(100, 6000))
    csv_data = (",".join([*names, "text"]) + "\n" + ",".join(["1"] * 100 + ["hi"]) + "\n").encode()
    sink = io.BytesIO()
    pq.write_table(
        pa.table({"text": ["hi"], "s": pa.array([None], pa.struct([(n, pa.int8()) for n in names]))}), sink
    )

    for name, data, input_format, what in (
        ("names.csv", csv_data, "csv", "its header has 600,004 bytes"),
        ("names.parquet", sink.getvalue(), "parquet", "its schema has 600,"),
    ):
        records = list(rows.parse_file(name, data, input_format))  # type: ignore[arg-type]

        assert [record["source"] for record in records] == [f"{name}:0"]
        assert f"column names too long: {what}" in str(records[0]["error"])


def test_a_row_just_inside_the_name_bound_goes_through_the_part_writer_and_the_commit(tmp_path: Path) -> None:
    length = (column_bound.MAX_FILE_NAME_BYTES - len("text")) // 100
    (record,) = _records("names.jsonl", {"text": "t", **_keys(100, length)})
    assert record["error"] is None

    _through_the_commit(tmp_path, json.loads(str(record["row"])))


# -- a preprocess's returned row ----------------------------------------------------------------------


def unpack_payload(row: dict[str, Any]) -> dict[str, Any]:  # Any: JSON values
    """A preprocess that turns a cell's JSON text into values, as authors do."""
    return {"payload": json.loads(row["payload"]), "prompt": "p"}


def test_a_preprocess_that_returns_a_row_nested_past_the_bound_fails_that_row(tmp_path: Path) -> None:
    spec = BatchInferenceSpec.build(
        model="m",
        input_uri=str(tmp_path / "in.jsonl"),
        output_uri=str(tmp_path / "out"),
        preprocess=f"{__name__}.unpack_payload",
    )
    deep = {
        "source": "in.jsonl:1",
        "row": json.dumps({"payload": json.dumps(_nested("lists", 40))}),
        "error": None,
    }
    flat = {"source": "in.jsonl:2", "row": json.dumps({"payload": "[1, [2]]"}), "error": None}

    failed, prepared = (row_steps.prepare_row(record, spec) for record in (deep, flat))

    assert str(failed["error"]).startswith("too deeply nested: its values nest more than")
    assert str(failed["error"]).endswith(f"(the row {__name__}.unpack_payload returned)")
    assert prepared["error"] is None
