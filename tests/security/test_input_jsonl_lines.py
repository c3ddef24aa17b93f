"""A JSONL line is bounded before it is parsed, as a CSV record and a Parquet row are.

Row data is untrusted (docs/security.md). ``json.loads`` built a line's whole value before the reader
looked at it: a 60 MiB line of ``{},`` grew a reader by 1,666 MiB (21M dicts) and was read as a good
row, and a 500 MB line of one string by 1,907 MiB. Now a line's bytes, and a count of the values it
can hold (each charged as a Parquet value is), are checked first (pipeline/read/raw_records.py), so
such a line is its error row, unparsed. The bound (``records.RECORD_BYTES``) is lowered here so that a
small file shows each case.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pyarrow")

from airflow_provider_raybatch.pipeline.read import records, rows  # noqa: E402


@pytest.fixture
def small_bound(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(records, "RECORD_BYTES", 64 << 10, raising=False)  # as on code before it
    return 64 << 10


def _records(data: bytes) -> list[records.Record]:
    return list(rows.parse_file("f.jsonl", data, "jsonl"))


def test_a_line_of_many_small_values_is_its_error_row_unparsed(small_bound: int) -> None:
    # 3 bytes a value in the file, about 80 B once Python: 2,000 of them cost 256 KiB, not 6 KiB
    for values in (b"{}," * 2_000 + b"{}", b"[]," * 2_000 + b"[]", b"0," * 3_000 + b"0"):
        data = b'{"a":[' + values + b']}\n{"b":1}\n'
        records = _records(data)

        assert [record["source"] for record in records] == ["f.jsonl:1", "f.jsonl:2"]
        assert str(records[0]["error"]).startswith("row too large: line 1 "), records[0]["error"]
        assert records[1] == {"source": "f.jsonl:2", "row": '{"b": 1}', "error": None}


def test_an_object_of_many_keys_is_its_error_row(small_bound: int) -> None:
    data = b"{" + b",".join(b'"k%d":0' % index for index in range(2_000)) + b"}\n"

    assert str(_records(data)[0]["error"]).startswith("row too large: line 1 ")


def test_a_line_longer_than_the_bound_is_its_error_row(small_bound: int) -> None:
    data = b'{"a":"' + b"x" * small_bound + b'"}\n'

    (record,) = _records(data)

    assert str(record["error"]).startswith(f"row too large: line 1 (over {small_bound:,} bytes)")
    assert len(str(record["row"])) < records.RAW_LINE_KEPT_CHARS + 16  # the line's start, not all of it


def test_commas_inside_strings_are_not_values(small_bound: int) -> None:
    # 2,000 commas, all in a string: charged as text, the line is a row
    text = "a, " * 2_000
    (record,) = _records(json.dumps({"a": text}).encode() + b"\n")

    assert record["error"] is None and json.loads(str(record["row"])) == {"a": text}


def test_a_text_is_charged_at_the_width_python_holds_it(small_bound: int) -> None:
    # 20,000 ASCII characters are 20 KB as a str; one emoji makes every character 4 bytes (80 KB)
    ascii_only = json.dumps({"a": "x" * 20_000}).encode() + b"\n"
    with_emoji = json.dumps({"a": "x" * 20_000 + "\U0001f600"}, ensure_ascii=False).encode() + b"\n"
    escaped_emoji = json.dumps({"a": "x" * 20_000 + "\U0001f600"}).encode() + b"\n"

    assert _records(ascii_only)[0]["error"] is None
    assert str(_records(with_emoji)[0]["error"]).startswith("row too large: ")
    assert str(_records(escaped_emoji)[0]["error"]).startswith("row too large: ")


def test_a_lone_surrogate_escape_is_a_row_whose_text_is_utf8() -> None:
    # "\ud800" without its pair decodes to text with no UTF-8 form: in a record's JSON text, Ray Data's
    # Arrow block of records could not hold it. The row keeps it as its escape (the same JSON).
    import pyarrow as pa

    (record,) = _records(b'{"a":"\\ud800x","b":"\xc3\xa9"}\n')

    assert record["error"] is None
    assert pa.array([record["row"]]).to_pylist() == [record["row"]]
    assert json.loads(str(record["row"])) == {"a": "\ud800x", "b": "é"}
