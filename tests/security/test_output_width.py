"""Rows of several input files meet in one output (issue 45): each file is within its own column
bounds (``read.column_bound``), but the commit gives every part the output's one schema, and every
part's footer then names every file's columns. Four files of 4,000 distinct 127-character keys made
each footer 9.5 MB, which the commit refused on every try, after rewriting parts for up to 94 CPU s.
The commit now refuses such an output before it rewrites a part, saying what to do (bounds scaled
down here: a few rows show what 2 MB of input did).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_raybatch.pipeline.stage import parts as parts_module
from airflow_provider_raybatch.pipeline.stage.parts import OutputTooWideError, PartWriter


def _staged(number: int, columns: dict[str, Any]) -> dict[str, Any]:  # Any: JSON values
    record = {"row_id": f"f{number}:1", **columns, "generated_text": "g"}
    return {"source": f"f{number}:1", "ok": True, "record": json.dumps(record), "tokens": [1, 1]}


def _file_row(number: int) -> dict[str, int]:
    """One file's row: 40 keys of its own, 100 characters each (4 KB of names)."""
    return {f"f{number}_{key:03d}_".ljust(100, "k"): key for key in range(40)}


def test_files_whose_rows_together_name_too_much_for_one_footer_fail_the_commit_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parts_module, "MAX_OUTPUT_SCHEMA_BYTES", 10_000)
    writer = PartWriter(str(tmp_path / "staging"), "parquet", count_labels=False)
    staged = [writer.write_part([_staged(number, _file_row(number))]) for number in range(3)]  # type: ignore[list-item]
    before = {file: file.read_bytes() for file in (tmp_path / "staging").rglob("outputs/*.parquet")}

    with pytest.raises(OutputTooWideError, match=r"outputs have 122 columns .* keep_columns"):
        writer.conform_parts(staged)
    # Refused before any part was rewritten.
    assert {file: file.read_bytes() for file in before} == before


def test_files_whose_rows_together_fit_one_footer_are_conformed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parts_module, "MAX_OUTPUT_SCHEMA_BYTES", 10_000)
    writer = PartWriter(str(tmp_path / "staging"), "parquet", count_labels=False)
    staged = [writer.write_part([_staged(number, _file_row(number))]) for number in range(2)]  # type: ignore[list-item]

    writer.conform_parts(staged)
