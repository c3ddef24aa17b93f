"""The parts a replica stages from rows the input reader accepted are parts the commit reads back.

The commit reads a staged part within the input reader's bounds (pipeline/read/staged_parquet.py): a
row's pages at most 256 MiB once decoded, a part's rows at most 1 GiB. Rows of long number lists
(token ids, vectors) are small as text and large once read: 32 rows of 100,000 zeros, 9 MiB of JSON,
were one Parquet page of 211 bytes holding 3.2 million values, all charged to each of its rows
(486 MB), and the commit refused the part on every try when it had to give it another part's schema.
A part cut by its text held 32 rows of 400,000 zeros: 3.2 GB once read. Now the writer's pages hold
a row's lists, or as many rows as cost 16 MiB (pipeline/stage/part_schema.py), the replica cuts parts
by what their rows cost once read (pipeline/stage/replica_staging.py), and the reader reads which rows
each page of a compressed list column starts (pipeline/read/parquet_levels.py). The bounds are scaled
down here so that a few thousand values show what millions do.
"""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_raybatch.pipeline.read import (
    parquet_levels,
    parquet_pages,
    parquet_plan,
    row_costs,
    staged_parquet,
)
from airflow_provider_raybatch.pipeline.row_types import StagedRow
from airflow_provider_raybatch.pipeline.stage import part_schema, replica_staging
from airflow_provider_raybatch.pipeline.stage.commit import StagedPart
from airflow_provider_raybatch.pipeline.stage.parts import PartWriter

#: The reader's bounds scaled down 64 times (a row's pages 4 MiB, a part 16 MiB), the writer's with them.
SCALE = 64


@pytest.fixture
def scaled_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parquet_plan, "PARQUET_HELD_BYTES", parquet_plan.PARQUET_HELD_BYTES // SCALE)
    monkeypatch.setattr(staged_parquet, "FILE_COST_BYTES", staged_parquet.FILE_COST_BYTES // SCALE)
    # raising=False: run against a writer without these bounds, the tests fail on the commit's read
    monkeypatch.setattr(part_schema, "PAGE_ROWS_COST", (16 << 20) // SCALE, raising=False)
    monkeypatch.setattr(replica_staging, "PART_COST_BYTES", (512 << 20) // SCALE, raising=False)


def _staged(source: str, record: dict[str, Any]) -> StagedRow:  # Any: row values
    return StagedRow(source=source, ok=True, record=json.dumps(record))


def _read_back(writer: PartWriter, parts: list[StagedPart]) -> list[dict[str, Any]]:
    """What the commit does with parts whose schemas differ: conform them, then read each one."""
    writer.conform_parts(parts)
    return [json.loads(row["record"]) for part in parts for row in writer.read_part(part)]


def test_a_part_of_list_rows_is_read_back_when_it_is_given_another_parts_schema(
    tmp_path: Path, scaled_bounds: None
) -> None:
    """8 rows of 5,000 zeros (scaled: 32 of 100,000) with a part that has one more column: the part is
    rewritten for the output's schema and read back, each row charged its own page, not all 40,000
    values (6 MB; a row may have 4 MiB here). Before: 'row 1 of its row group 0 is in pages that decode
    to ...', the commit failed."""
    writer = PartWriter(str(tmp_path / "staging"), "parquet", count_labels=False)
    rows = [_staged(f"in.jsonl:{n}", {"text": "t", "l": [0] * 5_000}) for n in range(8)]
    parts = [writer.write_part(rows), writer.write_part([_staged("in.jsonl:9", {"text": "t", "z": 1})])]

    read = _read_back(writer, parts)

    assert [row["l"] for row in read[:8]] == [[0] * 5_000] * 8
    assert read[8] == {"text": "t", "z": 1}  # a part is read back with the columns it was staged with


def test_the_replica_cuts_parts_by_what_their_rows_cost_once_read(
    tmp_path: Path, scaled_bounds: None
) -> None:
    """32 rows (a flush at batch_size 64) of 2,500 zeros each: 240 KB of text, 20 MB once read, more
    than a part may (16 MiB here; scaled: 32 rows of 160,000, 15 MiB of text). The replica stages them
    in parts the commit reads back, every row in order. Before: one part, which the commit refused."""
    writer = PartWriter(str(tmp_path / "staging"), "parquet", count_labels=False)

    def write(rows: list[dict[str, Any]]) -> StagedPart:  # Any: an engine row's values
        return writer.write_part(
            [
                _staged(row["source"], {**json.loads(row["row"]), "generated_text": row["generated_text"]})
                for row in rows
            ]
        )

    stager = replica_staging.RowStager(write, flush_rows=32)
    line = json.dumps({"text": "t", "l": [0] * 2_500})

    async def stage() -> list[StagedPart]:
        for n in range(32):
            stager.finished({"source": f"in.jsonl:{n}", "row": line, "generated_text": "g"})
        await stager.flush()
        return stager.take_written()

    parts = asyncio.run(stage())
    parts.append(writer.write_part([_staged("in.jsonl:99", {"text": "t", "z": 1})]))

    read = _read_back(writer, parts)

    assert len(parts) > 2
    assert [row["l"] for row in read[:32]] == [[0] * 2_500] * 32
    assert [source for part in parts for source in part.sidecar["sources"]] == [
        *(f"in.jsonl:{n}" for n in range(32)),
        "in.jsonl:99",
    ]


@pytest.mark.parametrize(
    "record",
    [
        {"l": [0] * 500},
        {"l": [True] * 500},
        {"l": [None] * 500},
        {"l": [[0]] * 500},
        {"l": [[]] * 500},
        {"l": [{"a": 0}] * 500},
        {"l": [0] * 500, "wide": "\U0001f600"},
        {"l": [[0]] * 500, "wide": "\U0001f600"},
        {"s": '"\\' * 500},
        {"s": "\x01" * 500},
        {"s": "\U0001f600" * 500},
        {"f": [1.2345678901234567e-300] * 500},
        {f"k{n}": n for n in range(200)},
        {"d": [[[[0]]]] * 200},
    ],
)
def test_a_rows_estimate_is_at_least_what_it_costs_once_read(record: dict[str, Any]) -> None:
    """What the replica charges an engine row (its input row's JSON text, the generated text, its counts)
    is at least what the staged row costs once the commit reads it (row_costs of its part's table)."""
    for ascii_only in (False, True):
        engine_row = {
            "source": "in.jsonl:1",
            "row": json.dumps({"text": "t", **record}, ensure_ascii=ascii_only),
            "generated_text": "g",
            "num_input_tokens": 3,
        }
        staged = {"row_id": "in.jsonl:1", "text": "t", **record, "generated_text": "g", "num_input_tokens": 3}
        cost = int(row_costs.row_costs(part_schema.table_of([staged])).held.sum())
        assert cost <= staged_parquet.staged_row_cost(engine_row)


def test_the_rows_each_page_of_a_compressed_list_column_starts_are_read() -> None:
    """A Snappy page's levels come back as a pyarrow Buffer, whose view is of signed bytes: a level
    run's length of 0x80 or more read as negative, so no page's rows were known and each page was
    charged to every row of its row group (input files too). One row a page: one row each."""
    sink = io.BytesIO()
    pq.write_table(pa.table({"l": [[0] * 1_000] * 4}), sink, max_rows_per_page=1, use_dictionary=False)
    data = sink.getvalue()
    column = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(0).column(0)
    assert column.compression == "SNAPPY"
    pages = parquet_pages.chunk_pages(
        data, column.data_page_offset, column.total_compressed_size, column.num_values, 100
    )

    started = [parquet_levels.rows_started(data, page, column.compression, 1) for page in pages]

    assert started == [(1, False)] * 4
