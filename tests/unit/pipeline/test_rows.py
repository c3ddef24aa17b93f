"""Tests of airflow_provider_raybatch/pipeline/read/rows.py: one record per input row, never a lost row.

The JSONL reader and the unreadable-file path always run here; CSV and Parquet need pyarrow, so
their tests skip where it is not installed. Every error reason starts with a stable kind and a colon
(``commit.reason_kind`` counts them by it).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from datetime import date, datetime, time
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_raybatch.pipeline.read.csv_rows import _csv_line
from airflow_provider_raybatch.pipeline.read.records import (
    BYTES_DATA_URL_PREFIX,
    RAW_LINE_KEPT_CHARS,
    row_to_json,
)
from airflow_provider_raybatch.pipeline.read.rows import (
    MAX_INPUT_FILE_BYTES,
    InputFileTooLargeError,
    check_input_file_size,
    input_file_over_bound,
    parse_file,
)


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


def test_a_bare_cr_is_part_of_its_line_not_a_line_break() -> None:
    """Lines end at \n only, as the API counts requests (shared/jsonl.py); splitlines() split here."""
    records = rows_of(b'{"a":\r1}\n{"q": "x\ry"}\n\r\n{"b": 2}\r\n')

    assert [r["source"] for r in records] == ["part/in.jsonl:1", "part/in.jsonl:2", "part/in.jsonl:4"]
    assert json.loads(records[0]["row"]) == {"a": 1}  # between tokens: whitespace
    assert records[1]["error"].startswith("malformed JSON: line 2, column 9: Invalid control character")
    assert json.loads(records[1]["row"]) == '{"q": "x\ry"}'  # the line as written, in the error row
    assert json.loads(records[2]["row"]) == {"b": 2}


def test_no_trailing_newline_keeps_the_last_row() -> None:
    assert len(rows_of(b'{"a": 1}\n{"a": 2}')) == 2


def test_malformed_json_becomes_an_error_record_with_its_line_number() -> None:
    records = rows_of(b'{"a": 1}\n{"a": 2,,}\n{"a": 3}\n')

    assert [r["source"] for r in records] == ["part/in.jsonl:1", "part/in.jsonl:2", "part/in.jsonl:3"]
    bad = records[1]
    assert bad["row"] == json.dumps('{"a": 2,,}')  # the line as written, for the error row's input
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
        "row": json.dumps(line.decode()),
        "error": f"not a JSON object: line 1 is a JSON {kind}",
    }


def test_invalid_utf8_is_an_error_for_that_line_only() -> None:
    records = rows_of(b'{"a": "ok"}\n{"a": "\xff\xfe"}\n{"a": "fine"}\n')

    assert json.loads(records[1]["row"]) == '{"a": "\ufffd\ufffd"}'  # the line, bad bytes replaced
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
            "at": time(9, 30),
            "big": Decimal("12345678901234567890.000000000000000001"),
            "buffer": bytearray(b"ok"),
        }
    )

    assert json.loads(text) == {
        "when": "2026-01-02T03:04:05",
        "day": "2026-01-02",
        "price": "1.10",
        "blob": BYTES_DATA_URL_PREFIX + "Y2Fmw6k=",
        "other": [],
        "at": "09:30:00",
        "big": "12345678901234567890.000000000000000001",
        "buffer": BYTES_DATA_URL_PREFIX + "b2s=",
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


def _parquet(table: pa.Table) -> bytes:  # noqa: F821 - pyarrow is imported by the caller
    import io

    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def test_binary_columns_keep_their_bytes_exactly() -> None:
    """Image bytes (here not UTF-8, and empty) survive the row's JSON; other bytes columns become text."""
    import base64

    pa = pytest.importorskip("pyarrow")
    from airflow_provider_raybatch.pipeline.read.records import BYTES_DATA_URL_PREFIX

    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table(
        {
            "image": pa.array(
                [{"bytes": b"\x89PNG\xff\x00", "path": "a.png"}, {"bytes": b"", "path": None}, None],
                image_type,
            ),
            "raw": pa.array([b"\xff", b"ok", None], pa.binary()),
            "note": ["a", "b", "c"],
        }
    )

    rows = [
        json.loads(r["row"]) for r in parse_file("in.parquet", _parquet(table), "parquet", ("image", "raw"))
    ]
    plain = [json.loads(r["row"]) for r in parse_file("in.parquet", _parquet(table), "parquet")]

    encoded = rows[0]["image"]["bytes"]
    assert encoded.startswith(BYTES_DATA_URL_PREFIX)
    assert base64.b64decode(encoded.removeprefix(BYTES_DATA_URL_PREFIX)) == b"\x89PNG\xff\x00"
    assert rows[0]["image"]["path"] == "a.png"
    assert rows[1]["image"] == {"bytes": BYTES_DATA_URL_PREFIX, "path": None}
    assert rows[2]["image"] is None
    assert rows[0]["raw"] == BYTES_DATA_URL_PREFIX + base64.b64encode(b"\xff").decode()
    assert rows[2]["raw"] is None and rows[0]["note"] == "a"
    assert plain[0]["raw"] == BYTES_DATA_URL_PREFIX + "/w=="  # bytes are kept exactly everywhere


def test_binary_columns_leave_text_values_alone() -> None:
    data = b'{"image": "photos/a.png"}\n'

    assert json.loads(next(iter(parse_file("in.jsonl", data, "jsonl", ("image",))))["row"]) == {
        "image": "photos/a.png"
    }


# -- JSONL: numbers, nesting, line separators, control characters ----------------------------------


def test_byte_order_mark_is_skipped() -> None:
    records = rows_of(b'\xef\xbb\xbf{"a": 1}\r\n{"a": 2}\r\n')

    assert [json.loads(r["row"]) for r in records] == [{"a": 1}, {"a": 2}]


def test_mixed_line_endings_number_every_line() -> None:
    records = rows_of(b'{"a": 1}\r\n{"a": 2}\n\r\n{"a": 3}\r\n')

    assert [r["source"] for r in records] == ["part/in.jsonl:1", "part/in.jsonl:2", "part/in.jsonl:4"]


def test_huge_integers_survive_exactly() -> None:
    [record] = rows_of(b'{"n": 12345678901234567890123, "m": -98765432109876543210}\n')

    assert json.loads(record["row"]) == {"n": 12345678901234567890123, "m": -98765432109876543210}
    assert "12345678901234567890123" in record["row"]


def test_an_integer_past_pythons_digit_limit_is_an_error_row_not_an_exception() -> None:
    """json.loads raises ValueError (not JSONDecodeError) for an int of over 4,300 digits."""
    records = rows_of(b'{"n": ' + b"9" * 5000 + b'}\n{"n": 1}\n')

    assert json.loads(records[0]["row"]) == '{"n": ' + "9" * 5000 + "}"  # the line, kept for the error row
    assert records[0]["error"].startswith("unsupported JSON: line 1: ValueError: ")
    assert records[1] == {"source": "part/in.jsonl:2", "row": '{"n": 1}', "error": None}


def test_deeply_nested_values() -> None:
    """Nested as deep as a value may be (column_bound.MAX_NESTING_DEPTH, 32: the innermost object is at
    2 + 2 x 15), and one level past it (tests/security/test_input_row_shape.py)."""
    value: dict = {"leaf": [1, {"x": None}]}
    for depth in range(15):
        value = {f"level{depth}": [value]}

    [record, deeper] = rows_of(
        json.dumps(value).encode() + b"\n" + json.dumps([value]).join(['{"d": ', "}\n"]).encode()
    )

    assert record["error"] is None
    assert json.loads(record["row"]) == value
    assert deeper["error"].startswith("too deeply nested: ")


def test_nesting_past_the_recursion_limit_is_an_error_row_not_an_exception() -> None:
    deep = b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"

    records = rows_of(deep + b'\n{"a": 2}\n')

    assert len(json.loads(records[0]["row"])) == RAW_LINE_KEPT_CHARS  # the line, cut to a bound
    assert records[0]["error"].startswith("unsupported JSON: line 1: RecursionError: ")
    assert json.loads(records[1]["row"]) == {"a": 2}


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\u0085"])
def test_unicode_line_separators_inside_strings_stay_in_their_row(separator: str) -> None:
    """str.splitlines would split at these; JSON Lines (and bytes.splitlines) split at \\n only."""
    line = json.dumps({"text": f"one{separator}two"}, ensure_ascii=False).encode()
    assert separator.encode() in line  # written raw: JSON allows them unescaped

    records = rows_of(line + b'\n{"n": 2}\n')

    assert [r["source"] for r in records] == ["part/in.jsonl:1", "part/in.jsonl:2"]
    assert json.loads(records[0]["row"]) == {"text": f"one{separator}two"}


def test_escaped_control_characters_inside_strings_are_kept() -> None:
    [record] = rows_of(b'{"t": "tab\\there\\u0000nul\\u001fus\\r\\nend"}\n')

    assert json.loads(record["row"]) == {"t": "tab\there\x00nul\x1fus\r\nend"}


@pytest.mark.parametrize("control", [b"\x00", b"\x01", b"\t", b"\x0b", b"\x0c", b"\x1c", b"\x1e", b"\x1f"])
def test_a_raw_control_character_inside_a_string_is_one_malformed_row(control: bytes) -> None:
    """JSON forbids them raw; \\x0b, \\x0c, \\x1c-\\x1e (line breaks to str.splitlines) end no line."""
    records = rows_of(b'{"t": "a' + control + b'b"}\n{"t": "next"}\n')

    assert [r["source"] for r in records] == ["part/in.jsonl:1", "part/in.jsonl:2"]
    assert re.fullmatch(
        r"malformed JSON: line 1, column 9: Invalid control character at", records[0]["error"]
    )
    assert records[1]["error"] is None


def test_nan_and_infinity_tokens_are_carried() -> None:
    """Inside the pipeline rows are read back with json.loads; a later stage writes strict JSON."""
    [record] = rows_of(b'{"a": NaN, "b": Infinity, "c": -Infinity}\n')

    row = json.loads(record["row"])
    assert math.isnan(row["a"]) and row["b"] == math.inf and row["c"] == -math.inf


# -- row_to_json: numpy values and sets ------------------------------------------------------------


def test_sets_become_sorted_lists_and_unsortable_sets_lists() -> None:
    row = json.loads(row_to_json({"s": {3, 1, 2}, "f": frozenset({"b", "a"}), "mixed": {1, "a"}}))

    assert row["s"] == [1, 2, 3]
    assert row["f"] == ["a", "b"]
    assert sorted(row["mixed"], key=str) == [1, "a"]


def test_tuples_and_unknown_objects() -> None:
    class Thing:
        def __str__(self) -> str:
            return "a thing"

    assert json.loads(row_to_json({"t": (1, (2, 3)), "o": Thing()})) == {"t": [1, [2, 3]], "o": "a thing"}


def test_a_numpy_value_is_converted_by_tolist_never_by_str() -> None:
    """Runs without numpy: a stand-in whose type says module "numpy", as numpy's do."""

    class FakeArray:
        __module__ = "numpy"

        def tolist(self) -> list[int]:
            return list(range(2000))

        def __str__(self) -> str:
            return "[0 1 2 ... 1997 1998 1999]"

    assert json.loads(row_to_json({"a": FakeArray()})) == {"a": list(range(2000))}


def test_numpy_scalars_and_arrays() -> None:
    np = pytest.importorskip("numpy")

    row = json.loads(
        row_to_json(
            {
                "i": np.int64(7),
                "u": np.uint64(2**64 - 1),
                "f": np.float32(1.5),
                "b": np.bool_(True),
                "s": np.str_("x"),
                "long": np.arange(2000),
                "grid": np.arange(6).reshape(2, 3),
                "objects": np.array([np.arange(2), {1, 0}], dtype=object),
                "when": np.datetime64("2026-01-02T03:04:05.123456789"),
                "times": np.array(["2026-01-02", "NaT"], dtype="datetime64[D]"),
                "span": np.timedelta64(90, "s"),
            }
        )
    )

    assert (
        row["i"] == 7 and row["u"] == 2**64 - 1 and row["f"] == 1.5 and row["b"] is True and row["s"] == "x"
    )
    assert row["long"] == list(range(2000))
    assert row["grid"] == [[0, 1, 2], [3, 4, 5]]
    assert row["objects"] == [[0, 1], [0, 1]]
    assert row["when"] == "2026-01-02T03:04:05.123456789"
    assert row["times"] == ["2026-01-02", "NaT"]
    assert row["span"] == "90 seconds"


def test_a_row_json_cannot_write_becomes_an_error_record_not_an_exception() -> None:
    from airflow_provider_raybatch.pipeline.read.records import ok as _ok

    looped: dict = {}
    looped["self"] = looped

    record = _ok("in.parquet:3", {"a": looped})

    assert record["row"] is None and record["source"] == "in.parquet:3"
    assert record["error"].startswith("unserializable row: ValueError: Circular reference")


# -- CSV: ids, structure, encodings ----------------------------------------------------------------


def csv_rows(data: bytes, id_column: str | None = None, name: str = "in.csv") -> list[dict]:
    pytest.importorskip("pyarrow")
    return list(parse_file(name, data, "csv", id_column=id_column))


def test_csv_id_column_is_the_text_as_written() -> None:
    data = b'Customer Id,n,note\n007,1,a\n1e3,2,b\nNaN,3,c\n,4,d\n" 42 ",5,e\nnull,6,f\n'

    records = csv_rows(data, id_column="Customer Id")

    rows = [json.loads(r["row"]) for r in records]
    assert [row["Customer Id"] for row in rows] == ["007", "1e3", "NaN", "", " 42 ", "null"]
    assert [row["n"] for row in rows] == [1, 2, 3, 4, 5, 6]  # the other columns keep inference
    assert [r["source"] for r in records] == [f"in.csv:{n}" for n in range(1, 7)]


def test_csv_columns_other_than_the_id_keep_pyarrows_types() -> None:
    data = b"id,i,f,b,d,empty,text\n1,7,1e3,true,2026-01-02,,x\n2,-3,NaN,false,2026-01-03,,007\n"

    rows = [json.loads(r["row"]) for r in csv_rows(data, id_column="id")]

    assert rows[0] == {
        "id": "1",
        "i": 7,
        "f": 1000.0,
        "b": True,
        "d": "2026-01-02",
        "empty": None,
        "text": "x",
    }
    assert rows[1]["f"] is None  # pyarrow reads NaN as null (only the id column keeps "NaN")
    assert rows[1]["i"] == -3 and rows[1]["text"] == "007"


def test_csv_without_an_id_column_infers_every_column() -> None:
    rows = [json.loads(r["row"]) for r in csv_rows(b"a,b,c\n7,x,1.5\n8,y,2\n")]

    assert rows == [{"a": 7, "b": "x", "c": 1.5}, {"a": 8, "b": "y", "c": 2.0}]


@pytest.mark.parametrize(
    ("cells", "kept"),
    [
        (["02134", "00501"], ["02134", "00501"]),  # zip codes: leading zeros are part of the value
        (["12", "007"], ["12", "007"]),  # one such cell keeps the whole column as text
        (["99999999999999999999999", "1"], ["99999999999999999999999", "1"]),  # past a float's digits
        (["2026-01-01 10:00:00", "2026-01-02"], ["2026-01-01 10:00:00", "2026-01-02"]),  # as written
    ],
)
def test_csv_columns_whose_type_would_change_what_was_written_stay_text(
    cells: list[str], kept: list[str]
) -> None:
    data = ("v\n" + "\n".join(cells) + "\n").encode()
    assert [json.loads(r["row"])["v"] for r in csv_rows(data)] == kept


def test_csv_numbers_that_their_type_holds_exactly_keep_it() -> None:
    data = b"n,f,b\n0,1.50,TRUE\n-12,1e3,false\n"
    assert [json.loads(r["row"]) for r in csv_rows(data)] == [
        {"n": 0, "f": 1.5, "b": True},
        {"n": -12, "f": 1000.0, "b": False},
    ]


def test_csv_id_column_missing_from_the_header_changes_nothing() -> None:
    rows = [json.loads(r["row"]) for r in csv_rows(b"a\n1\n", id_column="id")]

    assert rows == [{"a": 1}]


def test_csv_positional_arguments_still_work() -> None:
    pytest.importorskip("pyarrow")

    [record] = parse_file("in.csv", b"a\n1\n", "csv", ())

    assert json.loads(record["row"]) == {"a": 1}


def test_a_csv_column_of_numbers_then_words_is_text_not_a_failed_file() -> None:
    """Past pyarrow's 1 MiB block: a word after 1.1 MB of ints must not fail the file."""
    data = b"id,n\n" + b"1,1\n" * 280_000 + b"2,x\n"

    records = csv_rows(data, id_column="id")

    assert len(records) == 280_001 and all(r["error"] is None for r in records)
    assert json.loads(records[0]["row"]) == {"id": "1", "n": "1"}
    assert json.loads(records[-1]["row"]) == {"id": "2", "n": "x"}


def test_a_text_column_keeps_every_cell_as_written_as_ray_datas_read_csv_does() -> None:
    """README said `N/A` becomes null, but in a column of numbers and words it stayed
    "n/a". Null markers are null only in a column of numbers or bools; in a text column, as in Ray Data's
    ``read_csv`` (pyarrow's ``strings_can_be_null=False``), `n/a`, `NA` and an empty cell stay text."""
    pa_csv = pytest.importorskip("pyarrow.csv")
    data = b"amount,name,count\n5,a,1\nn/a,,N/A\ntwelve,NA,\n,b,3\n"

    rows = [json.loads(r["row"]) for r in csv_rows(data)]

    assert [row["amount"] for row in rows] == ["5", "n/a", "twelve", ""]  # numbers and words: text
    assert [row["name"] for row in rows] == ["a", "", "NA", "b"]
    assert [row["count"] for row in rows] == [1, None, None, 3]  # numbers: N/A and empty are null
    assert rows == pa_csv.read_csv(io.BytesIO(data)).to_pylist()  # Ray Data's reader gives the same


def test_when_pyarrow_cannot_type_the_columns_they_stay_text(monkeypatch: pytest.MonkeyPatch) -> None:
    pa_csv = pytest.importorskip("pyarrow.csv")

    def fail(*args: object, **kwargs: object) -> None:
        raise ValueError("CSV conversion error to int64: invalid value 'x'")

    monkeypatch.setattr(pa_csv, "read_csv", fail)

    records = csv_rows(b"id,n\n1,2\n3,x\n", id_column="id")

    assert [json.loads(r["row"]) for r in records] == [{"id": "1", "n": "2"}, {"id": "3", "n": "x"}]


def test_csv_quoted_newlines_stay_inside_their_field() -> None:
    data = b'id,text\n1,"line one\nline two"\n2,"crlf\r\ninside"\n3,plain\n'

    records = csv_rows(data, id_column="id")

    assert [r["source"] for r in records] == ["in.csv:1", "in.csv:2", "in.csv:3"]
    assert [json.loads(r["row"]) for r in records] == [
        {"id": "1", "text": "line one\nline two"},
        {"id": "2", "text": "crlf\r\ninside"},
        {"id": "3", "text": "plain"},
    ]


def test_csv_quotes_inside_fields() -> None:
    [record] = csv_rows(b'id,text\n1,"He said ""hi"", then left"\n', id_column="id")

    assert json.loads(record["row"]) == {"id": "1", "text": 'He said "hi", then left'}


def test_csv_duplicate_header_names_keep_every_column() -> None:
    data = b"Name,Name,Name.1,Name,id\nA,B,C,D,1\n"

    [record] = csv_rows(data, id_column="id")

    assert json.loads(record["row"]) == {"Name": "A", "Name.2": "B", "Name.1": "C", "Name.3": "D", "id": "1"}


def test_a_ragged_csv_row_fails_alone() -> None:
    data = b"a,b,c\n1,2,3\n4,5,6,7\n8,9\n10,11,12\n"

    records = csv_rows(data)

    assert [r["source"] for r in records] == ["in.csv:1", "in.csv:2", "in.csv:3", "in.csv:4"]
    assert [r["error"] for r in records] == [
        None,
        "malformed CSV: row 2 has 4 fields, the header has 3",
        "malformed CSV: row 3 has 2 fields, the header has 3",
        None,
    ]
    assert [json.loads(records[i]["row"]) for i in (1, 2)] == ["4,5,6,7", "8,9"]  # the records as read
    assert [json.loads(records[i]["row"]) for i in (0, 3)] == [
        {"a": 1, "b": 2, "c": 3},
        {"a": 10, "b": 11, "c": 12},
    ]


def test_csv_row_numbers_count_records_not_lines() -> None:
    data = b'a,b\n1,"x\ny\nz"\n2,w,extra\n3,v\n'

    records = csv_rows(data)

    assert [r["source"] for r in records] == ["in.csv:1", "in.csv:2", "in.csv:3"]
    assert records[1]["error"] == "malformed CSV: row 2 has 3 fields, the header has 2"


def test_csv_blank_lines_are_skipped_and_not_counted() -> None:
    records = csv_rows(b"\na,b\n\n1,2\n\n\n3,4\n\n")

    assert [r["source"] for r in records] == ["in.csv:1", "in.csv:2"]
    assert [json.loads(r["row"]) for r in records] == [{"a": 1, "b": 2}, {"a": 3, "b": 4}]


@pytest.mark.parametrize("data", [b"", b"\n\n", b"\xef\xbb\xbf", b"a,b", b"a,b\n", b"a,b\r\n\r\n"])
def test_an_empty_or_header_only_csv_has_no_rows(data: bytes) -> None:
    assert csv_rows(data) == []


def test_csv_byte_order_mark_is_not_part_of_the_first_name() -> None:
    [record] = csv_rows(b"\xef\xbb\xbfid,n\r\n007,1\r\n", id_column="id")

    assert json.loads(record["row"]) == {"id": "007", "n": 1}


def test_csv_invalid_utf8_fails_only_its_row() -> None:
    data = b"id,name\n1,Acme\n2,Soci\xe9t\xe9\n3,Umbrella\n"

    records = csv_rows(data, id_column="id")

    assert [r["error"] for r in records] == [None, "invalid UTF-8: row 2, column 'name'", None]
    assert json.loads(records[2]["row"]) == {"id": "3", "name": "Umbrella"}


@pytest.mark.parametrize("data", [b"id,n\xe9\n1,2\n", b"\xff\xfei\x00d\x00\n\x001\x00\n\x00"])
def test_a_csv_header_that_is_not_utf8_is_one_unreadable_file_record(data: bytes) -> None:
    [record] = csv_rows(data)

    assert record == {
        "source": "in.csv:0",
        "row": None,
        "error": "unreadable file: not valid csv: its header is not valid UTF-8",
    }


def test_a_csv_field_longer_than_the_csv_modules_default_limit() -> None:
    text = "word " * 60_000  # 300 KB, past csv's 128 KiB field limit
    [record] = csv_rows(f'id,text\n1,"{text}"\n'.encode(), id_column="id")

    assert json.loads(record["row"]) == {"id": "1", "text": text}


def test_csv_unicode_is_kept() -> None:
    [record] = csv_rows("id,Company\n1,Société Générale 🚀\n".encode(), id_column="id")

    assert json.loads(record["row"]) == {"id": "1", "Company": "Société Générale 🚀"}


# -- Parquet: every cell converts, or becomes its text --------------------------------------------

_FAR = 253402300799000000  # 9999-12-31T23:59:59 UTC in microseconds: year 10000 east of UTC


def test_parquet_cells_python_cannot_hold_become_their_text() -> None:
    pa = pytest.importorskip("pyarrow")
    tokyo = pa.timestamp("us", tz="Asia/Tokyo")
    table = pa.table(
        {
            "id": [1, 2, 3],
            "when": pa.array([_FAR, 0, None], tokyo),
            "day": pa.array([2**31 - 1, 0, None], pa.date32()),
            "nested": pa.array(
                [{"at": _FAR, "n": 1}, {"at": 0, "n": 2}, None], pa.struct([("at", tokyo), ("n", pa.int64())])
            ),
            "many": pa.array([[_FAR, 0], [], None], pa.list_(tokyo)),
        }
    )

    records = list(parse_file("in.parquet", _parquet(table), "parquet"))

    assert [r["source"] for r in records] == ["in.parquet:1", "in.parquet:2", "in.parquet:3"]
    assert all(r["error"] is None for r in records)
    first, second, third = (json.loads(r["row"]) for r in records)
    assert first["id"] == 1
    assert first["when"] == "10000-01-01 08:59:59.000000+0900"  # Arrow's text of the value
    assert isinstance(first["day"], str) and "2147483647" in first["day"]
    assert first["nested"] == {"at": "10000-01-01 08:59:59.000000+0900", "n": 1}  # only the bad leaf is text
    assert first["many"] == ["10000-01-01 08:59:59.000000+0900", "1970-01-01T09:00:00+09:00"]
    assert second == {
        "id": 2,
        "when": "1970-01-01T09:00:00+09:00",
        "day": "1970-01-01",
        "nested": {"at": "1970-01-01T09:00:00+09:00", "n": 2},
        "many": [],
    }
    assert third == {"id": 3, "when": None, "day": None, "nested": None, "many": None}


def test_parquet_values_of_many_types() -> None:
    pa = pytest.importorskip("pyarrow")
    table = pa.table(
        {
            "u64": pa.array([2**64 - 1, 2**63, 0, None], pa.uint64()),
            "dec": pa.array(
                [Decimal("12345678901234567890.0123456789"), Decimal("-0.1"), None, Decimal(0)],
                pa.decimal128(38, 10),
            ),
            "dec256": pa.array([Decimal("1" * 60), None, None, None], pa.decimal256(76, 0)),
            "struct": pa.array(
                [{"a": {"b": [1, 2]}}, {"a": None}, None, {"a": {"b": []}}],
                pa.struct([("a", pa.struct([("b", pa.list_(pa.int64()))]))]),
            ),
            "bin": pa.array([b"caf\xc3\xa9", b"\xff", None, b""], pa.binary()),
            "big_text": pa.array(["x" * 100_000, "", None, "é"], pa.large_string()),
            "category": pa.array(["a", "b", "a", None]).dictionary_encode(),
            "f": pa.array([1.5, float("nan"), None, -0.0]),
        }
    )

    rows = [json.loads(r["row"]) for r in parse_file("in.parquet", _parquet(table), "parquet")]

    assert [row["u64"] for row in rows] == [2**64 - 1, 2**63, 0, None]
    assert [row["dec"] for row in rows] == ["12345678901234567890.0123456789", "-0.1000000000", None, "0E-10"]
    assert rows[0]["dec256"] == "1" * 60
    assert [row["struct"] for row in rows] == [{"a": {"b": [1, 2]}}, {"a": None}, None, {"a": {"b": []}}]
    assert [row["bin"] for row in rows] == [
        BYTES_DATA_URL_PREFIX + "Y2Fmw6k=",
        BYTES_DATA_URL_PREFIX + "/w==",
        None,
        BYTES_DATA_URL_PREFIX,
    ]
    assert [row["big_text"] for row in rows] == ["x" * 100_000, "", None, "é"]
    assert [row["category"] for row in rows] == ["a", "b", "a", None]
    assert rows[0]["f"] == 1.5 and math.isnan(rows[1]["f"]) and rows[2]["f"] is None


def test_parquet_repeated_column_names_keep_every_column() -> None:
    pa = pytest.importorskip("pyarrow")
    table = pa.Table.from_arrays([pa.array([1]), pa.array(["x"]), pa.array([True])], names=["a", "a", "a.1"])

    [record] = parse_file("in.parquet", _parquet(table), "parquet")

    assert json.loads(record["row"]) == {"a": 1, "a.2": "x", "a.1": True}


def test_a_table_with_rows_and_no_columns_keeps_its_rows() -> None:
    pa = pytest.importorskip("pyarrow")
    from airflow_provider_raybatch.pipeline.read.arrow_rows import table_rows as _table_rows

    assert _table_rows(pa.table({"a": [1, 2, 3]}).drop_columns(["a"])) == [{}, {}, {}]


# -- properties (hypothesis) ----------------------------------------------------------------------

_ID = "Customer Id"
_CELL = st.text(st.characters(codec="utf-8"), max_size=12) | st.sampled_from(
    ["", ",", '"', '""', "\n", "\r\n", "\r", " ", "007", "1e3", "NaN", "null", "a,b", 'say "hi"', "\u2028"]
)


@st.composite
def csv_tables(draw: st.DrawFn) -> tuple[list[str], int, list[list[str]]]:
    """A header with the id column somewhere, and rows of random cells, some ragged."""
    others = draw(st.lists(_CELL.filter(lambda name: name.lstrip("\ufeff") != _ID), max_size=4))
    position = draw(st.integers(0, len(others)))
    header = [*others[:position], _ID, *others[position:]]
    width = len(header)
    lengths = st.integers(1, width + 1) | st.just(width)
    rows = draw(st.lists(lengths.flatmap(lambda n: st.lists(_CELL, min_size=n, max_size=n)), max_size=8))
    return header, position, rows


@given(csv_tables())
@settings(max_examples=200, deadline=None)
def test_csv_property_one_record_per_row_in_order_with_the_id_as_written(
    table: tuple[list[str], int, list[list[str]]],
) -> None:
    header, position, rows = table
    buffer = io.StringIO()
    csv.writer(buffer).writerows([header, *rows])

    records = list(parse_file("t.csv", buffer.getvalue().encode(), "csv", id_column=_ID))

    assert [r["source"] for r in records] == [f"t.csv:{n}" for n in range(1, len(rows) + 1)]
    for record, cells in zip(records, rows, strict=True):
        if len(cells) != len(header):
            assert json.loads(record["row"]) == _csv_line(cells)  # the record as read
            assert record["error"] == (
                f"malformed CSV: row {record['source'].split(':')[1]} has {len(cells)} fields, "
                f"the header has {len(header)}"
            )
            continue
        assert record["error"] is None, record
        row = json.loads(record["row"])
        assert row[_ID] == cells[position]
        assert len(row) == len(header)  # repeated names are renamed, never merged


_JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
_JSON_VALUES = st.recursive(
    _JSON_SCALARS,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=8,
)
_LINE_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=16)
_LINES = st.one_of(
    st.dictionaries(st.text(max_size=4), _JSON_VALUES, max_size=4).map(
        lambda value: ("object", json.dumps(value, ensure_ascii=False).encode(), value)
    ),
    (_JSON_SCALARS | st.lists(_JSON_VALUES, max_size=3)).map(
        lambda value: ("not a JSON object", json.dumps(value, ensure_ascii=False).encode(), None)
    ),
    _LINE_TEXT.map(lambda text: ("any text", text.encode(), None)),
    st.binary(max_size=10).map(
        lambda raw: ("invalid UTF-8", b"\xff" + raw.replace(b"\n", b"").replace(b"\r", b""), None)
    ),
    st.sampled_from([b"", b" ", b"\t", b" \x0b\x0c "]).map(lambda raw: ("blank", raw, None)),
)


@given(st.lists(_LINES, max_size=12), st.sampled_from([b"\n", b"\r\n"]), st.booleans())
@settings(max_examples=200, deadline=None)
def test_jsonl_property_one_record_per_non_blank_line(
    lines: list[tuple[str, bytes, object]], newline: bytes, final_newline: bool
) -> None:
    data = newline.join(raw for _, raw, _ in lines) + (newline if final_newline else b"")

    records = rows_of(data, name="in.jsonl")

    kept = [(n, kind, value) for n, (kind, raw, value) in enumerate(lines, start=1) if raw.strip()]
    assert [r["source"] for r in records] == [f"in.jsonl:{n}" for n, _, _ in kept]
    for record, (_, kind, value) in zip(records, kept, strict=True):
        # A good row is its object; a bad line keeps its text (a JSON string) for the error row.
        assert isinstance(json.loads(record["row"]), dict if record["error"] is None else str)
        if record["error"] is not None:
            assert re.match(r"[A-Za-z][\w -]*: \S", record["error"]), record["error"]
        if kind == "object":
            assert json.loads(record["row"]) == value
        elif kind in ("not a JSON object", "invalid UTF-8"):
            assert record["error"].startswith(kind)


# -- the input file size cap ------------------------------------------------------------------------


def test_check_input_file_size_names_the_file_and_the_cap() -> None:
    with pytest.raises(InputFileTooLargeError, match=r"'a/b.csv' is 2147483648 bytes \(2048 MiB\), over the"):
        check_input_file_size("a/b.csv", 2 << 30)
    check_input_file_size("a/b.csv", MAX_INPUT_FILE_BYTES)  # at the cap: read
    check_input_file_size("a/b.csv", 10, limit=10)
    with pytest.raises(InputFileTooLargeError, match="over the 10 bytes"):
        check_input_file_size("a/b.csv", 11, limit=10)


def test_a_file_found_past_the_cap_as_it_is_read_is_named_without_a_size_it_never_read() -> None:
    error = input_file_over_bound("a/b.jsonl", 1 << 30)
    assert isinstance(error, InputFileTooLargeError)
    assert str(error).startswith(
        "input file 'a/b.jsonl' grew after the job's start-up check: it is now over the 1073741824 bytes "
        "(1024 MiB) one input file may have"
    )
    assert "Split it into smaller files" in str(error)


def test_csv_read_in_chunks_types_each_column_over_the_whole_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """A file is read a chunk at a time (a few records here), and each column keeps one type over
    all of them, as pyarrow's reader widens it over the whole file."""
    pytest.importorskip("pyarrow")
    from airflow_provider_raybatch.pipeline.read import csv_rows

    monkeypatch.setattr(csv_rows, "CSV_CHUNK_BYTES", 2_000)
    lines = [f"{index},{index},{index},0{index}" for index in range(20)]
    lines[15] = "15,1.5,word,015"
    data = ("n,num,text,zip\n" + "\n".join(lines) + "\n").encode()

    records = list(parse_file("f.csv", data, "csv"))

    assert [record["error"] for record in records] == [None] * 20
    first, late = (json.loads(str(records[index]["row"])) for index in (0, 15))
    assert first == {"n": 0, "num": 0.0, "text": "0", "zip": "00"}
    assert late == {"n": 15, "num": 1.5, "text": "word", "zip": "015"}


def test_a_csv_record_over_the_row_bound_is_its_error_row(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pyarrow")
    from airflow_provider_raybatch.pipeline.read import csv_rows, records

    monkeypatch.setattr(csv_rows, "CSV_CHUNK_BYTES", 2_000)
    monkeypatch.setattr(records, "RECORD_BYTES", 5_000)
    data = b"a,b\n1,x\n2," + b"y" * 5_000 + b"\n3,z\n"

    records = list(parse_file("f.csv", data, "csv"))

    assert [record["source"] for record in records] == ["f.csv:1", "f.csv:2", "f.csv:3"]
    assert records[1]["error"] is not None and records[1]["error"].startswith("row too large: ")
    assert [json.loads(str(records[index]["row"])) for index in (0, 2)] == [
        {"a": 1, "b": "x"},
        {"a": 3, "b": "z"},
    ]


def _lossy_cell(cell: str) -> bool:
    """The rule cell by cell: a number with leading zeros, or an integer past a float's digits."""
    return bool(re.match(r"\s*[+-]?0\d", cell) or re.fullmatch(r"\s*[+-]?\d{16,}\s*", cell))


_NUMBERISH = st.text(alphabet=st.sampled_from(list("0123456789+-. eE\t\u3000\u0661x")), max_size=24)


@settings(max_examples=500, deadline=None)
@given(cells=st.lists(_NUMBERISH, max_size=8))
def test_property_a_column_searched_at_once_finds_a_lossy_number_where_a_cell_by_cell_look_does(
    cells: list[str],
) -> None:
    from airflow_provider_raybatch.pipeline.read.csv_rows import _has_lossy_number_text

    assert _has_lossy_number_text(cells) == any(_lossy_cell(cell) for cell in cells)


_NEVER_CLOSES = "opens a quoted field that never closes, so the rest of the file"


@pytest.mark.parametrize(
    ("data", "open_row"),
    [
        (b'id,text\n1,"oops\n2,fine\n3,fine\n', 1),  # a stray quote at a cell's start: rows 2 and 3 in it
        (b'id,text\n1,x\n2,"a""', 2),  # a doubled quote is a quote in the field, which stays open
        (b'id,text\n1,"ok"\n2,"line\nbreak"\n3,x\n', None),  # quoted line breaks, every field closed
        (b'id,text\n1,"a,"', None),  # closed at the end of the file, no line end
        (b'id,text\n1,5" screen\n', None),  # a quote inside an unquoted field is a character
        (b"id,text\n1,x\n\n\n", None),
    ],
)
def test_a_quoted_field_that_never_closes_is_its_row_s_error_not_the_rest_of_the_file_silently(
    data: bytes, open_row: int | None
) -> None:
    records = list(parse_file("q.csv", data, "csv"))

    errors = {record["source"]: record["error"] for record in records if record["error"]}
    if open_row is None:
        assert errors == {}
    else:
        assert list(errors) == [f"q.csv:{open_row}"] and _NEVER_CLOSES in errors[f"q.csv:{open_row}"]
        assert records[-1]["source"] == f"q.csv:{open_row}"  # the rows it swallowed are in its error row
