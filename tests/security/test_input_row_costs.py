"""A row is charged what it costs once it is a record, not its bytes in Arrow.

Row data is untrusted (docs/security.md). Each Parquet row becomes Python values and then one JSON
text, and both can be far larger than the row's bytes: JSON writes a control character as six
characters, Python holds a whole string (and the row's JSON text) at four bytes a character once
one character is past U+FFFF, a struct's field names are written again in each of its values and
the columns' names in every row. Files of a few KiB to a few MiB that used each of these grew a
reader by 3 GiB (one 60 MiB value after an emoji: 1.4 GiB of JSON text; 4,000 structs whose field
name is 64 KiB of control characters) or made terabytes of rows (a column named 1 MiB of them, a
million rows). ``pipeline/read/row_costs.py`` charges each row what it will cost before it is made.
The sizes here are a third of those found, to keep the test's own memory and time small. Each file
is read by the cluster side's interpreter, whose pandas makes nanosecond times pandas objects.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from tests.security.test_input_parquet_pages import (
    PEAK_GROWTH_LIMIT_MIB,
    _read_in_a_fresh_process,
)

_MIB = 1 << 20


def _parquet(columns: dict[str, object]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.table(columns), sink, compression="zstd", use_dictionary=False, store_schema=False)
    return sink.getvalue()


def _row_too_large(report: dict[str, object]) -> None:
    errors = report["errors"]
    assert report["records"] == 1 and isinstance(errors, list) and len(errors) == 1, report
    assert errors[0].startswith("row too large: it takes up to "), errors[0]
    assert report["grown_mib"] < PEAK_GROWTH_LIMIT_MIB, report


@pytest.mark.timeout(300)
def test_a_value_of_control_characters_after_an_emoji_is_charged_as_its_json_text(tmp_path: Path) -> None:
    data = _parquet({"prompt": ["\U0001f600" + "\x01" * (20 * _MIB)]})
    assert len(data) < 10_000

    _row_too_large(_read_in_a_fresh_process(tmp_path, data))


@pytest.mark.timeout(300)
def test_struct_field_names_are_charged_in_every_value(tmp_path: Path) -> None:
    import pyarrow as pa

    name = "\x01" * 65_536
    items = pa.array([[{name: 0}] * 1_500], pa.list_(pa.struct([(name, pa.int8())])))
    data = _parquet({"p": items})
    assert len(data) < 200_000

    _row_too_large(_read_in_a_fresh_process(tmp_path, data))


def test_a_long_column_name_counts_at_each_row_toward_what_a_file_may_carry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import pyarrow as pa

    from airflow_provider_raybatch.pipeline.read import column_bound, parquet_plan, rows

    monkeypatch.setattr(parquet_plan, "MAX_INPUT_DECODED_BYTES", 64 * _MIB)
    monkeypatch.setattr(column_bound, "MAX_FILE_NAME_BYTES", 1 << 30)  # the bound tested here, not that one
    data = _parquet({"\x01" * _MIB: pa.array([0] * 200, pa.int8())})  # 6 MiB of JSON text a row

    records = list(rows.parse_file("names.parquet", data, "parquet"))

    assert [record["error"] for record in records[:-1]] == [None] * (len(records) - 1)
    assert 5 <= len(records) - 1 <= 11, len(records)
    assert records[-1]["source"] == "names.parquet:0"
    assert "JSON text takes more than 67,108,864 bytes" in str(records[-1]["error"])


def test_ordinary_rows_are_charged_at_least_what_they_become() -> None:
    import json

    import pyarrow as pa

    from airflow_provider_raybatch.pipeline.read import arrow_rows, records, row_costs

    table = pa.table(
        {
            "text": ["plain", 'a "quoted"\nline', "é中😀", None],
            "messages": [[{"role": "user", "content": "hi\t"}], [], None, [{"role": "a", "content": "😀"}]],
            "tags": pa.array([[("k", 1)], [], None, [("x", 2), ("y", 3)]], pa.map_(pa.string(), pa.int64())),
            "data": [b"\x00\x01", b"", None, b"abc"],
        }
    )
    costs = row_costs.row_costs(table)
    texts = [records.row_to_json(row) for row in arrow_rows.table_rows(table)]

    for text, length, held in zip(texts, costs.text.tolist(), costs.held.tolist(), strict=True):
        width = max(1, *(1 if ord(char) < 0x100 else 2 if ord(char) < 0x10000 else 4 for char in text))
        assert length >= len(text) * width and held >= 2 * len(text) * width, (text, length, held)
    assert json.loads(texts[0])["text"] == "plain"


@pytest.mark.timeout(300)
def test_nanosecond_durations_are_charged_what_pandas_makes_of_them(tmp_path: Path) -> None:
    # Where pandas is installed (Ray's workers), each becomes a pandas Timedelta: 641 bytes of file
    # grew a reader by 453 to 543 MiB when a duration was charged as a plain number.
    import pyarrow as pa
    import pyarrow.parquet as pq

    column = pa.array([[123_456_789_012_345] * 800] * 2048, pa.list_(pa.duration("ns")))
    sink = io.BytesIO()
    pq.write_table(pa.table({"d": column}), sink, compression="zstd")  # its Arrow schema stored: durations
    data = sink.getvalue()
    assert len(data) < 2_000

    report = _read_in_a_fresh_process(tmp_path, data)

    assert report["records"] == 2048 and report["errors"] == [], report
    assert report["grown_mib"] < PEAK_GROWTH_LIMIT_MIB, report
