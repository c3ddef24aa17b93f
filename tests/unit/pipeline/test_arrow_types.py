"""The Arrow types a file the job reads may hold (pipeline/read/arrow_types.py). The hostile files
themselves, read through each reader with Ray's pickled type registered, are in
tests/security/test_arrow_input_types.py."""

from __future__ import annotations

import base64
import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_raybatch.pipeline.read import arrow_types, rows
from airflow_provider_raybatch.pipeline.read.arrow_types import RefusedArrowTypeError


def _parquet(table: pa.Table, **options: bool) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer, **options)
    return buffer.getvalue()


def _uuids() -> pa.Array:
    return pa.ExtensionArray.from_storage(pa.uuid(), pa.array([b"\x00" * 16], pa.binary(16)))


ALLOWED = [
    pa.null(),
    pa.bool_(),
    pa.int8(),
    pa.uint64(),
    pa.float16(),
    pa.float32(),
    pa.float64(),
    pa.decimal128(38, 10),
    pa.decimal256(76, 0),
    pa.string(),
    pa.large_string(),
    pa.string_view(),
    pa.binary(),
    pa.large_binary(),
    pa.binary(4),
    pa.binary_view(),
    pa.date32(),
    pa.date64(),
    pa.time32("s"),
    pa.time64("ns"),
    pa.timestamp("ns", tz="Asia/Tokyo"),
    pa.duration("us"),
    pa.list_(pa.int64()),
    pa.large_list(pa.string()),
    pa.list_(pa.int8(), 3),
    pa.list_view(pa.int8()),
    pa.large_list_view(pa.int8()),
    pa.struct([("a", pa.struct([("b", pa.list_(pa.date32()))]))]),
    pa.map_(pa.string(), pa.list_(pa.float64())),
    pa.dictionary(pa.int32(), pa.string()),
]


@pytest.mark.parametrize("data_type", ALLOWED, ids=str)
def test_built_in_plain_and_nested_types_are_allowed(data_type: pa.DataType) -> None:
    arrow_types.check_schema(pa.schema([("c", data_type)]))


@pytest.mark.parametrize(
    ("data_type", "named"),
    [
        (pa.uuid(), "extension<arrow.uuid>"),
        (pa.list_(pa.json_()), "extension<arrow.json>"),
        (pa.struct([("ok", pa.int8()), ("bad", pa.bool8())]), "extension<arrow.bool8>"),
        (pa.map_(pa.string(), pa.uuid()), "extension<arrow.uuid>"),
        (pa.dictionary(pa.int8(), pa.json_()), "extension<arrow.json>"),
        (pa.month_day_nano_interval(), "month_day_nano_interval"),
        (pa.list_(pa.dense_union([pa.field("i", pa.int8())])), "dense_union<i: int8=0>"),
        (pa.run_end_encoded(pa.int32(), pa.string()), "run_end_encoded<run_ends: int32, values: string>"),
    ],
    ids=str,
)
def test_any_other_type_is_refused_naming_the_column_and_the_type(data_type: pa.DataType, named: str) -> None:
    schema = pa.schema([("fine", pa.int64()), ("c", data_type)])

    with pytest.raises(RefusedArrowTypeError) as raised:
        arrow_types.check_schema(schema)

    assert str(raised.value) == (
        f"column 'c' has Arrow type {named}, which a file the job reads may not use "
        f"(allowed: {arrow_types.ALLOWED_TYPES})"
    )


def test_an_unregistered_extension_type_is_refused_by_the_name_in_its_fields_metadata() -> None:
    metadata = {b"ARROW:extension:name": b"someone.elses", b"ARROW:extension:metadata": b""}
    nested = pa.field("inner", pa.large_binary(), metadata=metadata)

    with pytest.raises(RefusedArrowTypeError, match=r"column 'c' has Arrow type extension<someone\.elses>"):
        arrow_types.check_schema(pa.schema([("c", pa.list_(nested))]))


def test_a_long_name_or_type_from_the_file_is_cut_in_the_reason() -> None:
    metadata = {b"ARROW:extension:name": b"x" * 5000}
    schema = pa.schema([pa.field("n" * 5000, pa.binary(), metadata=metadata)])

    with pytest.raises(RefusedArrowTypeError) as raised:
        arrow_types.check_schema(schema)

    assert len(str(raised.value)) < 700


def test_the_schema_of_a_plain_file_is_the_one_pyarrow_reads_it_with() -> None:
    table = pa.table(
        {
            "id": [1, 2],
            "when": pa.array([0, None], pa.timestamp("ms", tz="UTC")),
            "tags": pa.array(["a", "b"]).dictionary_encode(),
            "nested": pa.array([{"x": [1.5]}, None]),
        }
    )
    for data in (_parquet(table), _parquet(table, store_schema=False)):
        assert arrow_types.checked_parquet_schema(data) == pq.read_schema(io.BytesIO(data))
        reader = pa.BufferReader(data)  # a pyarrow file, as a storage reader opens one
        assert arrow_types.checked_parquet_schema(reader) == pq.read_schema(io.BytesIO(data))


def test_a_parquet_file_with_an_extension_column_is_refused() -> None:
    with pytest.raises(RefusedArrowTypeError, match="column 'u' has Arrow type extension<arrow.uuid>"):
        arrow_types.checked_parquet_schema(_parquet(pa.table({"id": [1], "u": _uuids()})))


def test_parquets_own_uuid_and_json_columns_written_without_an_arrow_schema_are_read_as_data() -> None:
    """Spark and DuckDB write UUID and JSON as Parquet's own logical types, with no Arrow schema: they
    are read as their storage types (16 bytes, text), not refused as pyarrow's extension types."""
    json_text = pa.ExtensionArray.from_storage(pa.json_(), pa.array(['{"k": 1}']))
    data = _parquet(pa.table({"id": ["a"], "u": _uuids(), "j": json_text}), store_schema=False)

    schema = arrow_types.checked_parquet_schema(data)

    assert (schema.field("u").type, schema.field("j").type) == (pa.binary(16), pa.string())
    [record] = rows.parse_file("duckdb.parquet", data, "parquet")
    assert record["error"] is None and json.loads(record["row"] or "")["j"] == '{"k": 1}'


def test_a_footer_with_a_second_arrow_schema_is_refused() -> None:
    # A schema's own metadata may carry an ARROW:schema key: the writer then stores two, and pyarrow
    # reads the first (here, the planted one with an extension type) while a dict of the footer's
    # metadata keeps the last.
    planted = base64.b64encode(pa.schema([("u", pa.uuid())]).serialize().to_pybytes())
    table = pa.table({"u": pa.array([b"\x00" * 16], pa.binary(16))})
    data = _parquet(table.replace_schema_metadata({b"ARROW:schema": planted}))
    assert isinstance(pq.read_schema(io.BytesIO(data)).field("u").type, pa.BaseExtensionType)

    with pytest.raises(RefusedArrowTypeError, match="more than one Arrow schema"):
        arrow_types.checked_parquet_schema(data)


def test_a_footer_with_an_arrow_schema_under_the_checks_own_hidden_name_is_refused() -> None:
    # While the footer is opened for the check, ARROW:schema is renamed ARROW:SCHEMA: a file that has
    # both would have its planted ARROW:SCHEMA checked and its own ARROW:schema read.
    planted = base64.b64encode(pa.schema([("u", pa.binary(16))]).serialize().to_pybytes())
    data = _parquet(pa.table({"u": _uuids()}).replace_schema_metadata({b"ARROW:SCHEMA": planted}))

    with pytest.raises(RefusedArrowTypeError, match="more than one Arrow schema"):
        arrow_types.checked_parquet_schema(data)


@pytest.mark.parametrize("text", ["zzz ARROW:schema", "zzz ARROW:SCHEMA"])
def test_a_cell_reading_like_the_schema_key_is_a_value_not_a_key(text: str) -> None:
    # The footer holds each column's min/max statistics, which are row values: an input cell (or a
    # generated answer in a staged part) with this text is read, not taken for a second schema.
    data = _parquet(pa.table({"id": ["a", "b"], "text": ["aaa", text]}))
    assert text.encode() in data  # in the footer's statistics

    assert arrow_types.checked_parquet_schema(data).field("text").type == pa.string()
    records = list(rows.parse_file("tickets.parquet", data, "parquet"))
    assert [record["error"] for record in records] == [None, None]
    assert json.loads(records[1]["row"] or "")["text"] == text


def test_a_stored_arrow_schema_that_is_not_strict_base64_is_refused() -> None:
    data = _parquet(pa.table({"id": [1]}))
    stored = base64.b64encode(pa.schema([("id", pa.int64())]).serialize().to_pybytes())
    at = data.rindex(stored[:16])
    patched = data[:at] + b"!" + data[at + 1 :]  # the same length: the footer stays valid Thrift

    with pytest.raises(ValueError, match="not valid base64"):
        arrow_types.checked_parquet_schema(patched)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "too short"),
        (b"PAR1\x00\x00\x00PAR1", "too short"),
        (b"not parquet at all, not even its end", "does not end with Parquet's footer"),
        (b"PAR1" + b"\x00" * 8 + b"\xff\xff\x00\x00PAR1", "more than the file holds"),
        (b"PAR1" + bytes(range(256)) + b"\x00\x01\x00\x00PAR1", "deserialize thrift"),
        (b"PAR1\x00\x00\x00\x00PAR1", "deserialize thrift"),
    ],
)
def test_a_file_without_a_readable_footer_is_an_error_not_a_crash(data: bytes, reason: str) -> None:
    with pytest.raises((ValueError, OSError), match=reason):
        arrow_types.checked_parquet_schema(data)
