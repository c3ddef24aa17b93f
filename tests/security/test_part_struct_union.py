"""A part's rows may not together make Arrow build a struct past a row's bounds (``part_schema.table_of``).

Row data is untrusted (docs/security.md). A row's empty cells are bounded (``column_bound``), but the
replica writes a part of rows of several files, and Arrow infers a column's type from all of them:
rows of 8 files, each a list of 1,000 objects of one key of their own (17 KB, inside every bound),
made Arrow build a struct of 8,000 fields for 8,000 items, over 1.9 GiB in the replica, before the
column fell back to JSON text anyway. Now such a column is JSON text without the struct being built,
and the part reads back as it was staged.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from airflow_provider_raybatch.pipeline.read import column_bound
from airflow_provider_raybatch.pipeline.stage import part_schema

#: Objects in each row's list: each row alone leaves ITEMS * ITEMS cells empty (inside the bound), the
#: part's FILES rows together (FILES * ITEMS) ** 2, past it.
ITEMS = 300
FILES = 4


def _widest_struct(data_type: pa.DataType) -> int:
    """The most fields of any struct in ``data_type``, in lists too."""
    own = data_type.num_fields if pa.types.is_struct(data_type) else 0
    inner = [_widest_struct(data_type.field(index).type) for index in range(data_type.num_fields)]
    return max([own, *inner])


@pytest.fixture
def widest_built(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The widest struct each ``pa.array`` call built, as the part writer calls it."""
    built: list[int] = []
    real = pa.array

    def spy(*args: Any, **kwargs: Any) -> Any:  # Any: pa.array's own arguments and result
        array = real(*args, **kwargs)
        built.append(_widest_struct(array.type))
        return array

    monkeypatch.setattr(pa, "array", spy)
    return built


def _rows(object_of: Any) -> list[dict[str, Any]]:  # Any: a JSON value
    """One row of each file: a list of ITEMS objects, ``object_of(file, item)`` each."""
    return [
        {"row_id": f"in{file}.jsonl:1", "d": [object_of(file, item) for item in range(ITEMS)]}
        for file in range(FILES)
    ]


def test_rows_of_several_files_do_not_build_their_union(widest_built: list[int]) -> None:
    records = _rows(lambda file, item: {f"f{file}k{item}": 1})
    for record in records:
        assert column_bound.row_refusal(record) is None  # each row alone is a good row
    assert (FILES * ITEMS) ** 2 > column_bound.MAX_ROW_EMPTY_CELLS

    table = part_schema.table_of(records)

    assert part_schema.is_json_field(table.schema.field("d"))
    assert max(widest_built) < FILES * ITEMS  # Arrow never built the union of every row's keys
    assert part_schema.decode_parquet(part_schema.encode_parquet(table)) == records


def test_objects_of_the_same_keys_stay_a_struct(widest_built: list[int]) -> None:
    records = _rows(lambda file, item: {"file": file, "item": item})

    table = part_schema.table_of(records)

    assert str(table.schema.field("d").type) == "list<item: struct<file: int64, item: int64>>"
    assert part_schema.decode_parquet(part_schema.encode_parquet(table)) == records
