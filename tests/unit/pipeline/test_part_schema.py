"""Tests of airflow_provider_raybatch/pipeline/part_schema.py: a part's schema from all its rows, one per output."""

from __future__ import annotations

import io
import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_raybatch.pipeline import part_schema


def _round_trip(records: list[dict]) -> list[dict]:
    return part_schema.decode_parquet(part_schema.encode_parquet(part_schema.table_of(records)))


def test_columns_come_from_every_row_not_the_first() -> None:
    table = part_schema.table_of([{"a": 1}, {"a": 2, "late": "x"}])

    assert table.column_names == ["a", "late"]
    assert table.column("late").to_pylist() == [None, "x"]


@pytest.mark.parametrize(
    "values",
    [
        ["Acme", {"nested": 1}],  # cannot mix struct and non-struct
        [1, "two"],  # Expected bytes, got a 'int' object
        [{"a": 1}, {"b": 2}],  # Arrow would add the missing keys as nulls: not what was written
        [2**64, 1],  # past uint64
        [True, 1],
        [{}],  # a struct without fields cannot be written to Parquet
        [{"anyOf": [{"type": "string", "enum": ["a"]}, {"type": "null"}]}],  # list elements unified
    ],
)
def test_values_arrow_cannot_hold_exactly_are_json_text(values: list) -> None:
    records = [{"c": value} for value in values]
    table = part_schema.table_of(records)

    assert part_schema.column_types(table) == {"c": "json"}
    assert [row["c"] for row in _round_trip(records)] == values


def test_uint64_values_keep_their_type() -> None:
    table = part_schema.table_of([{"n": 2**64 - 1}, {"n": 2**63}])

    assert part_schema.column_types(table) == {"n": "uint64"}


def test_nan_survives_in_a_float_column_and_is_null_in_json_text() -> None:
    assert math.isnan(_round_trip([{"x": float("nan")}, {"x": 1.5}])[0]["x"])
    assert part_schema.json_text({"x": float("inf")}) == '{"x": null}'


def test_unify_and_conform_give_every_part_one_schema() -> None:
    parts = [
        part_schema.table_of([{"id": "1", "n": 1, "s": None}]),
        part_schema.table_of([{"id": "2", "n": 2.5, "s": "x", "extra": [1]}]),
        part_schema.table_of([{"id": "3", "n": "three", "s": "y"}]),
    ]
    target = part_schema.unify(part_schema.column_types(table) for table in parts)

    assert target == {"id": "string", "n": "json", "s": "string", "extra": "list<item: int64>"}
    arrow_types = {"id": pa.string(), "s": pa.string(), "extra": pa.list_(pa.int64())}
    conformed = [part_schema.conform(table, target, arrow_types) for table in parts]
    assert len({table.schema for table in conformed}) == 1
    buffers = []
    for table in conformed:
        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        buffers.append(pa.BufferReader(buffer.getvalue()))
    rows = pa.concat_tables(pq.read_table(b) for b in buffers).to_pylist()
    assert [json.loads(row["n"]) for row in rows] == [1, 2.5, "three"]
    assert [row["extra"] for row in rows] == [None, [1], None]


def test_int_beside_double_widens_to_double() -> None:
    assert part_schema.unify([{"n": "int64"}, {"n": "double"}, {"n": "null"}]) == {"n": "double"}


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.dictionaries(st.sampled_from(["a", "b", "c"]), JSON, min_size=1, max_size=3),
        min_size=1,
        max_size=8,
    )
)
def test_any_json_rows_are_written_and_read_back_as_written(records: list[dict]) -> None:
    back = _round_trip(records)

    for written, read in zip(records, back, strict=True):
        for key, value in written.items():
            assert part_schema._same(value, read[key]), (key, value, read[key])
