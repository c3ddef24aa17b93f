"""Tests of airflow_provider_raybatch/pipeline/stage/part_schema.py: a part's schema from all its
rows, one per output."""

from __future__ import annotations

import io
import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_raybatch.pipeline.stage import footer_width, part_schema
from airflow_provider_raybatch.shared.json_numbers import unsafe_number


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


# -- unsafe_number: what may not go to the engine as a number ------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"max_tokens": 10**20}, ("p.max_tokens", "p.max_tokens: 100000000000000000000 is out of range")),
        ({"seed": -(2**63) - 1}, ("p.seed", "p.seed: -9223372036854775809 is out of range")),
        ({"a": [1, {"b c": float("nan")}]}, ("p.a[1]['b c']", "p.a[1]['b c']: nan is not a finite number")),
        ([float("-inf")], ("p[0]", "p[0]: -inf is not a finite number")),
        (
            {"n": 10**500},
            ("p.n", "p.n: 100000000000000000...000000000000000000 (501 digits) is out of range"),
        ),
    ],
)
def test_unsafe_number_names_the_first_bad_number_by_its_path(
    value: object, expected: tuple[str, str]
) -> None:
    path, reason = unsafe_number(value, "p")

    assert (path, reason[: len(expected[1])]) == expected


@pytest.mark.parametrize(
    "value", [None, True, "text", 2**63 - 1, -(2**63), 1.5e308, {"a": [0, -1.0, "NaN"]}, [], {}]
)
def test_unsafe_number_passes_what_int64_and_finite_floats_hold(value: object) -> None:
    assert unsafe_number(value, "p") is None


def test_unsafe_number_walks_a_value_nested_past_the_recursion_limit() -> None:
    value = inner = []
    for _ in range(50_000):
        inner.append([])
        inner = inner[0]
    inner.append(2**64)

    path, reason = unsafe_number(value, "p")

    assert path == "p[0][0][0][0][...][0][0][0][0]" and "out of range" in reason


@settings(max_examples=200, deadline=None)
@given(JSON | st.integers() | st.floats())
def test_unsafe_number_agrees_with_what_int64_and_finite_floats_hold(value: object) -> None:
    def numbers(item: object) -> list[object]:
        if isinstance(item, dict):
            return [n for child in item.values() for n in numbers(child)]
        if isinstance(item, list):
            return [n for child in item for n in numbers(child)]
        return [item] if isinstance(item, int | float) and not isinstance(item, bool) else []

    bad = [
        n for n in numbers(value) if not (math.isfinite(n) if isinstance(n, float) else -(2**63) <= n < 2**63)
    ]
    assert (unsafe_number(value, "p") is None) == (not bad)


def test_a_part_of_long_texts_is_written_in_pages_commit_reads_back() -> None:
    """1,024 rows of 80 KiB of text (an engine flush of long documents): written with pyarrow's
    default batches, one 84 MB dictionary page, over the 64 MiB a page read back may be."""
    text = "".join(chr(ord("a") + (n * 7919) % 26) for n in range(80 << 10))
    records = [{"id": n, "text": text[n:] + text[:n]} for n in range(1024)]

    rows = part_schema.decode_parquet(part_schema.encode_parquet(part_schema.table_of(records)), "p")

    assert rows == records


def _footer_length(table: pa.Table) -> int:
    data = part_schema.encode_parquet(table)
    return int.from_bytes(data[-8:-4], "little")


@pytest.mark.parametrize(
    "records",
    [
        [{f"{key:x}": 1 for key in range(500)}],  # short names
        [{f"{key:05d}".ljust(100, "k"): 1 for key in range(500)}],  # long names
        [{f"{key:05d}".ljust(30, "k"): value for key in range(300)} for value in ("abcde", 1.5, True, None)],
        [{"s" * 115: {f"k{key:05d}": 1 for key in range(500)}}],  # a struct's name in each leaf's path
        [{"a": {"b" * 50: {"c" * 50: {f"k{key}": 1 for key in range(300)}}}}],
        [{f"l{key:04d}": [1, 2] for key in range(300)}],
        [{f"l{key:04d}": [{"x": 1, "y": "s"}] for key in range(200)}],
        [{f"j{key:04d}": value for key in range(300)} for value in (1, "s")],  # JSON text columns
        [{f"{key:05d}".ljust(30, "k"): row for key in range(300)} for row in range(100)],
    ],
    ids=["short", "long", "scalars", "struct", "deep", "lists", "list-of-structs", "json", "rows"],
)
def test_footer_width_is_at_least_the_footer_pyarrow_writes(records: list[dict]) -> None:
    table = part_schema.table_of(records)

    real = _footer_length(table)
    assert real <= footer_width.schema_bytes(table.schema) <= 2 * real


def test_ten_thousand_columns_of_ordinary_names_fit_a_footer() -> None:
    fields = [pa.field(f"c{key:05d}".ljust(30, "k"), pa.string()) for key in range(10_000)]

    assert footer_width.schema_bytes(fields) < footer_width.MAX_FOOTER_SCHEMA_BYTES


def test_a_struct_counts_its_name_once_for_each_leaf() -> None:
    leaves = pa.struct([pa.field(f"k{key}", pa.int64()) for key in range(100)])

    longer = footer_width.field_bytes(pa.field("s" * 1_000, leaves)) - footer_width.field_bytes(
        pa.field("s", leaves)
    )
    assert longer > 100 * 999


def test_a_table_of_columns_past_the_footer_bound_is_refused_before_any_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(footer_width, "MAX_FOOTER_SCHEMA_BYTES", 10_000)
    monkeypatch.setattr(part_schema, "typed_array", lambda values: pytest.fail("built"))

    with pytest.raises(
        footer_width.OutputTooWideError, match=r"a part's rows have 40 columns .* keep_columns"
    ):
        part_schema.table_of([{f"c{key:02d}".ljust(100, "k"): key for key in range(40)}])


def test_a_table_whose_columns_pass_the_footer_bound_once_built_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(footer_width, "MAX_FOOTER_SCHEMA_BYTES", 10_000)
    nested = {"s" * 100: {f"k{key}": 1 for key in range(15)}}  # 15 leaves: a name is cheap, its paths are not

    assert part_schema.table_of([nested]).num_columns == 1
    with pytest.raises(footer_width.OutputTooWideError, match=r"a part's rows have 2 columns"):
        part_schema.table_of([nested, {"t" * 100: nested["s" * 100]}])
