"""Tests of airflow_provider_raybatch/pipeline/rows.py: one record per input row, never a lost row.

The JSONL reader and the unreadable-file path always run here; CSV and Parquet need pyarrow, so
their tests skip where it is not installed. Every error reason starts with a stable kind and a colon
(``commit.reason_kind`` counts them by it).
"""

from __future__ import annotations

import json
import re
from datetime import date, datetime
from decimal import Decimal

import pytest

from airflow_provider_raybatch.pipeline.rows import parse_file, row_to_json


def rows_of(data: bytes, name: str = "part/in.jsonl") -> list[dict]:
    return list(parse_file(name, data, "jsonl"))


def test_good_jsonl_rows() -> None:
    records = rows_of(b'{"Company": "Acme", "n": 1}\n{"Company": "Umbrella", "n": null}\n')

    assert [r["source"] for r in records] == ["part/in.jsonl:1", "part/in.jsonl:2"]
    assert [r["error"] for r in records] == [None, None]
    assert [json.loads(r["row"]) for r in records] == [
        {"Company": "Acme", "n": 1},
        {"Company": "Umbrella", "n": None},
    ]


def test_records_have_exactly_source_row_error() -> None:
    for record in rows_of(b'{"a": 1}\nnot json\n'):
        assert set(record) == {"source", "row", "error"}


def test_blank_lines_are_skipped_but_numbering_follows_the_file() -> None:
    records = rows_of(b'\n{"a": 1}\n\n   \n\t\r\n{"a": 2}\n\n')

    assert [r["source"] for r in records] == ["part/in.jsonl:2", "part/in.jsonl:6"]
    assert all(r["error"] is None for r in records)


def test_crlf_line_endings() -> None:
    records = rows_of(b'{"a": 1}\r\n{"a": 2}\r\n')

    assert [json.loads(r["row"]) for r in records] == [{"a": 1}, {"a": 2}]
    assert [r["source"] for r in records] == ["part/in.jsonl:1", "part/in.jsonl:2"]


def test_no_trailing_newline_keeps_the_last_row() -> None:
    assert len(rows_of(b'{"a": 1}\n{"a": 2}')) == 2


def test_malformed_json_becomes_an_error_record_with_its_line_number() -> None:
    records = rows_of(b'{"a": 1}\n{"a": 2,,}\n{"a": 3}\n')

    assert [r["source"] for r in records] == ["part/in.jsonl:1", "part/in.jsonl:2", "part/in.jsonl:3"]
    bad = records[1]
    assert bad["row"] is None
    assert bad["error"].startswith("malformed JSON: line 2, column ")
    assert re.fullmatch(r"malformed JSON: line 2, column \d+: .+", bad["error"]), bad["error"]
    assert records[0]["error"] is None and records[2]["error"] is None


@pytest.mark.parametrize(
    ("line", "kind"), [(b"[1, 2]", "list"), (b'"text"', "str"), (b"42", "int"), (b"null", "NoneType")]
)
def test_non_object_line_is_an_error(line: bytes, kind: str) -> None:
    [record] = rows_of(line + b"\n", name="x.jsonl")

    assert record == {
        "source": "x.jsonl:1",
        "row": None,
        "error": f"not a JSON object: line 1 is a JSON {kind}",
    }


def test_invalid_utf8_is_an_error_for_that_line_only() -> None:
    records = rows_of(b'{"a": "ok"}\n{"a": "\xff\xfe"}\n{"a": "fine"}\n')

    assert records[1]["row"] is None
    assert re.fullmatch(r"invalid UTF-8: byte \d+ of line 2", records[1]["error"]), records[1]["error"]
    assert [r["error"] is None for r in records] == [True, False, True]


def test_non_ascii_text_is_kept_as_is() -> None:
    [record] = rows_of('{"Company": "Société Générale", "emoji": "🚀"}\n'.encode())

    assert "Société Générale" in record["row"]
    assert json.loads(record["row"]) == {"Company": "Société Générale", "emoji": "🚀"}


def test_row_to_json_handles_non_json_cells() -> None:
    text = row_to_json(
        {
            "when": datetime(2026, 1, 2, 3, 4, 5),
            "day": date(2026, 1, 2),
            "price": Decimal("1.10"),
            "blob": b"caf\xc3\xa9",
            "other": frozenset(),
        }
    )

    assert json.loads(text) == {
        "when": "2026-01-02T03:04:05",
        "day": "2026-01-02",
        "price": "1.10",
        "blob": "café",
        "other": "frozenset()",
    }


def test_unreadable_file_becomes_one_error_record() -> None:
    records = list(parse_file("part/in.parquet", b"\x00\x01 definitely not parquet \xff", "parquet"))

    # Without pyarrow or with a corrupt file alike, the whole file is one error row.
    assert records == [
        {"source": "part/in.parquet:0", "row": None, "error": records[0]["error"]},
    ]
    assert records[0]["error"].startswith("unreadable file: not valid parquet: ")


# -- CSV and Parquet (pyarrow) ------------------------------------------------------------------


def test_csv_rows_are_numbered_from_one() -> None:
    pytest.importorskip("pyarrow")

    records = list(parse_file("in.csv", b"Company,n\nAcme,1\nUmbrella,2\n", "csv"))

    assert [r["source"] for r in records] == ["in.csv:1", "in.csv:2"]
    assert [json.loads(r["row"]) for r in records] == [
        {"Company": "Acme", "n": 1},
        {"Company": "Umbrella", "n": 2},
    ]
    assert all(r["error"] is None for r in records)


def test_ragged_csv_is_one_unreadable_file_record() -> None:
    pytest.importorskip("pyarrow")

    [record] = parse_file("in.csv", b"a,b\n1,2\n3,4,5\n", "csv")

    assert record["source"] == "in.csv:0"
    assert record["error"].startswith("unreadable file: not valid csv: ")


def test_parquet_rows() -> None:
    pa = pytest.importorskip("pyarrow")
    import io

    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.table({"Company": ["Acme", "Umbrella"], "day": [date(2026, 1, 2), None]}), buffer)

    records = list(parse_file("p/in.parquet", buffer.getvalue(), "parquet"))

    assert [r["source"] for r in records] == ["p/in.parquet:1", "p/in.parquet:2"]
    assert [json.loads(r["row"]) for r in records] == [
        {"Company": "Acme", "day": "2026-01-02"},
        {"Company": "Umbrella", "day": None},
    ]


# -- binary columns (image_column) ----------------------------------------------------------------


def _parquet(table: "pa.Table") -> bytes:  # noqa: F821 - pyarrow is imported by the caller
    import io

    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def test_binary_columns_keep_their_bytes_exactly() -> None:
    """Image bytes (here not UTF-8, and empty) survive the row's JSON; other bytes columns become text."""
    import base64

    pa = pytest.importorskip("pyarrow")
    from airflow_provider_raybatch.pipeline.rows import BYTES_DATA_URL_PREFIX

    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table(
        {
            "image": pa.array(
                [{"bytes": b"\x89PNG\xff\x00", "path": "a.png"}, {"bytes": b"", "path": None}, None], image_type
            ),
            "raw": pa.array([b"\xff", b"ok", None], pa.binary()),
            "note": ["a", "b", "c"],
        }
    )

    rows = [json.loads(r["row"]) for r in parse_file("in.parquet", _parquet(table), "parquet", ("image", "raw"))]
    plain = [json.loads(r["row"]) for r in parse_file("in.parquet", _parquet(table), "parquet")]

    encoded = rows[0]["image"]["bytes"]
    assert encoded.startswith(BYTES_DATA_URL_PREFIX)
    assert base64.b64decode(encoded.removeprefix(BYTES_DATA_URL_PREFIX)) == b"\x89PNG\xff\x00"
    assert rows[0]["image"]["path"] == "a.png"
    assert rows[1]["image"] == {"bytes": BYTES_DATA_URL_PREFIX, "path": None}
    assert rows[2]["image"] is None
    assert rows[0]["raw"] == BYTES_DATA_URL_PREFIX + base64.b64encode(b"\xff").decode()
    assert rows[2]["raw"] is None and rows[0]["note"] == "a"
    assert plain[0]["raw"] == "\ufffd"  # without binary_columns: text, as before


def test_binary_columns_leave_text_values_alone() -> None:
    data = b'{"image": "photos/a.png"}\n'

    assert json.loads(next(iter(parse_file("in.jsonl", data, "jsonl", ("image",))))["row"]) == {"image": "photos/a.png"}
