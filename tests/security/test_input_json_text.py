"""A JSONL or CSV row whose JSON text would be far larger than its line is refused before it is made.

Row data is untrusted (docs/security.md). JSON writes a control character as six characters, and
Python holds a text at four bytes a character once one character is past U+FFFF, so a 5 MiB CSV cell
of control characters after an emoji makes 120 MiB of JSON text, and a 64 MiB record up to 1.5 GiB.
``pipeline/read/json_text_cost.py`` bounds a row's JSON text before ``json.dumps`` makes it; a
column's name counts at every row of a CSV file.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_raybatch.pipeline.read import column_bound, json_text_cost, rows

_MIB = 1 << 20
_TOO_LARGE = "row too large: its JSON text would take up to "


def test_a_csv_cell_of_control_characters_after_an_emoji_is_its_error_row_and_the_next_row_is_read() -> None:
    data = ('prompt\n"\U0001f600' + "\x01" * (5 * _MIB) + '"\nnext\n').encode()

    records = list(rows.parse_file("cells.csv", data, "csv"))

    assert [record["source"] for record in records] == ["cells.csv:1", "cells.csv:2"]
    assert str(records[0]["error"]).startswith(_TOO_LARGE), records[0]["error"]
    assert records[1]["error"] is None and json.loads(str(records[1]["row"])) == {"prompt": "next"}


def test_a_jsonl_line_whose_text_is_wide_and_escaped_is_its_error_row() -> None:
    line = '{"prompt": "\\ud83d\\ude00' + "\\u0001" * (5 * _MIB) + '"}\n{"prompt": "next"}\n'

    records = list(rows.parse_file("lines.jsonl", line.encode(), "jsonl"))

    # refused before it is parsed (raw_records charges its escapes' width), or else by its JSON text
    assert str(records[0]["error"]).startswith("row too large: "), records[0]["error"]
    assert records[1]["error"] is None


def test_a_long_csv_column_name_counts_at_every_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(column_bound, "MAX_FILE_NAME_BYTES", 1 << 30)  # the bound tested here, not that one
    name = "\x01" * (5 * _MIB)  # 30 MiB of JSON characters in each row, at 4 bytes with the emoji
    data = f'"{name}"\n\U0001f600\n'.encode()

    records = list(rows.parse_file("names.csv", data, "csv"))

    assert str(records[0]["error"]).startswith(_TOO_LARGE), records[0]["error"]


_TEXT = st.text(st.sampled_from(["a", "\x01", "\n", '"', "\\", "é", "中", "😀"]), max_size=300)
_VALUES = st.recursive(
    st.none() | st.integers() | st.booleans() | _TEXT,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(row=st.dictionaries(_TEXT, _VALUES, max_size=4))
def test_property_a_row_over_the_bound_is_never_missed(row: dict[str, object]) -> None:
    bound = 2_000
    text = json.dumps(row, ensure_ascii=False)
    width = max([1, *(1 if ord(char) < 0x100 else 2 if ord(char) < 0x10000 else 4 for char in text)])

    found = _too_large(row, bound)

    if len(text) * width > bound:
        assert found is not None and found > bound


def _too_large(row: dict[str, object], bound: int) -> int | None:
    saved = json_text_cost.MAX_JSON_TEXT_BYTES
    json_text_cost.MAX_JSON_TEXT_BYTES = bound
    try:
        return json_text_cost.json_text_too_large(row, None)
    finally:
        json_text_cost.MAX_JSON_TEXT_BYTES = saved


def test_a_long_csv_header_counts_at_every_row_toward_what_a_file_may_carry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow_provider_raybatch.pipeline.read import parquet_plan

    monkeypatch.setattr(parquet_plan, "MAX_INPUT_DECODED_BYTES", 8 * _MIB)
    monkeypatch.setattr(column_bound, "MAX_FILE_NAME_BYTES", 1 << 30)  # the bound tested here, not that one
    data = b"h" * _MIB + b"\n" + b"1\n" * 100  # a 1 MiB file of 100 rows of 1 MiB of JSON text each

    records = list(rows.parse_file("header.csv", data, "csv"))

    assert [record["error"] for record in records[:-1]] == [None] * 7
    assert records[-1]["source"] == "header.csv:0"
    assert "only its first 7 rows were read" in str(records[-1]["error"])


def test_a_lone_surrogate_is_escaped_alone_not_the_rest_of_its_row() -> None:
    line = '{"prompt": "\\udc00' + "é" * 1_000 + '"}\n'  # escaping every é would make 6,000 characters

    [record] = rows.parse_file("surrogate.jsonl", line.encode(), "jsonl")

    assert record["error"] is None and len(str(record["row"])) < 1_100
    assert json.loads(str(record["row"])) == json.loads(line)
    str(record["row"]).encode("utf-8")  # an Arrow block can hold it
