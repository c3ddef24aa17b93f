"""Error rows count toward what one input file may carry, as its good rows do.

Row data is untrusted (docs/security.md). Every bad line is its own error row, with its source and a
reason: a JSONL line ``1`` (two bytes) becomes about 70 bytes of error row, so a 20 MB file of them made
698 MB of records, and a ragged CSV line ``,`` 39 times its size. ``rows.parse_file`` bounds a file's
records' text (source, row and reason) at ``MAX_INPUT_DECODED_BYTES``, rows and error rows alike, and
ends the file with its own error row saying how many rows were read.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_raybatch.pipeline.read import parquet_plan, records, rows

_BOUND = 64 * 1024


def _text(records: list[records.Record]) -> int:
    return sum(len(text) for record in records for text in record.values() if text is not None)


@pytest.mark.parametrize(
    ("name", "input_format", "data"),
    [
        ("ints.jsonl", "jsonl", b"1\n" * 20_000),  # each line a JSON int, not an object
        ("ragged.csv", "csv", b"a,b\n" + b",,\n" * 20_000),  # each record one field too many
        ("broken.jsonl", "jsonl", b"{\n" * 20_000),  # each line malformed
    ],
)
def test_a_file_of_tiny_bad_rows_ends_at_the_bound_with_its_own_error_row(
    monkeypatch: pytest.MonkeyPatch, name: str, input_format: rows.InputFormat, data: bytes
) -> None:
    monkeypatch.setattr(parquet_plan, "MAX_INPUT_DECODED_BYTES", _BOUND)

    records = list(rows.parse_file(name, data, input_format))

    *error_rows, last = records
    assert error_rows and all(record["error"] for record in error_rows)
    assert len(error_rows) < 20_000  # it stopped early: 20,000 error rows hold far more than the bound
    assert _text(error_rows) <= _BOUND
    assert last["source"] == f"{name}:0"
    assert f"only its first {len(error_rows):,} rows were read; split it" in str(last["error"])


def test_a_file_within_the_bound_keeps_every_error_row_and_every_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parquet_plan, "MAX_INPUT_DECODED_BYTES", _BOUND)
    data = b'{"prompt": "a"}\n1\n' * 100

    records = list(rows.parse_file("mixed.jsonl", data, "jsonl"))

    assert [record["source"] for record in records] == [f"mixed.jsonl:{n}" for n in range(1, 201)]
    assert [record["error"] is None for record in records] == [True, False] * 100


_LINES = st.lists(st.sampled_from([b"1", b"{", b'{"p": "x"}', b"[]", b'"s"', b"", b"\xff"]), max_size=300)


@settings(max_examples=100, deadline=None)
@given(lines=_LINES, bound=st.integers(min_value=200, max_value=5_000))
def test_property_a_file_s_records_never_carry_more_than_the_bound_and_end_saying_so(
    lines: list[bytes], bound: int
) -> None:
    saved = parquet_plan.MAX_INPUT_DECODED_BYTES
    parquet_plan.MAX_INPUT_DECODED_BYTES = bound
    try:
        records = list(rows.parse_file("any.jsonl", b"\n".join(lines) + b"\n", "jsonl"))
    finally:
        parquet_plan.MAX_INPUT_DECODED_BYTES = saved

    whole = [record for record in records if not record["source"].endswith(":0")]
    assert _text(whole) <= bound
    if len(whole) < sum(1 for line in lines if line):  # rows left unread: the file says so
        assert records[-1]["source"] == "any.jsonl:0"
        assert f"only its first {len(whole):,} rows were read" in str(records[-1]["error"])


@pytest.mark.parametrize(
    ("limit", "name", "input_format", "data", "reason"),
    [
        (
            "MAX_INPUT_FILE_ROWS",
            "lines.jsonl",
            "jsonl",
            b'{"p": 1}\n' * 30,
            "it has 30 lines, more than a file",
        ),
        ("MAX_INPUT_FILE_ROWS", "lines.csv", "csv", b"a\n" + b"1\n" * 29, "it has 30 lines, more than"),
        ("MAX_INPUT_FILE_ROWS", "cr.csv", "csv", b"a\r" + b"1\r" * 29, "it has 30 lines, more than"),
        ("MAX_INPUT_FILE_ROWS", "crlf.csv", "csv", b"a\r\n" + b"1\r\n" * 29, "it has 30 lines, more than"),
        ("MAX_INPUT_FILE_CELLS", "wide.csv", "csv", b"a,b,c\n" + b"1,2,3\n" * 9, "it has up to 30 cells"),
    ],
)
def test_a_file_of_more_lines_or_cells_than_a_file_may_have_is_refused_before_a_row_is_read(
    monkeypatch: pytest.MonkeyPatch,
    limit: str,
    name: str,
    input_format: rows.InputFormat,
    data: bytes,
    reason: str,
) -> None:
    """Each line or cell costs microseconds of Python: a 1 GiB CSV of lines ``1`` would have read for
    hours, and one 20,000 columns wide spent 5 us a cell (the bounds lowered here to keep files small)."""
    monkeypatch.setattr(parquet_plan if limit == "MAX_INPUT_FILE_ROWS" else rows, limit, 29)

    records = list(rows.parse_file(name, data, input_format))

    assert [record["source"] for record in records] == [f"{name}:0"]
    assert reason in str(records[0]["error"]) and "split it into several files" in str(records[0]["error"])
    monkeypatch.undo()
    assert all(record["error"] is None for record in rows.parse_file(name, data, input_format))
