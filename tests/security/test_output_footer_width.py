"""What an output's columns cost a Parquet footer, bounded where parts are written and before the
commit rewrites any (issue 45). A footer repeats each leaf's whole path (a struct's name once for each
of its leaves) beside per-leaf metadata, so columns whose names and types were within the commit's
1 MiB check made footers past the 8 MiB a reader parses: 8 files of one 115-character struct of 4,000
leaves each were rewritten (13 CPU s, +335 MiB) and then refused as FooterTooLongError, advising row
groups. And a part's rows were never bounded together: 32 rows of 4,000 distinct 127-character keys
took the part writer 1.4 GiB before the commit refused the output anyway.

Real bounds, shapes scaled to the fewest columns that pass them: a long name costs a footer once per
leaf below it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_raybatch.pipeline.stage import part_schema
from airflow_provider_raybatch.pipeline.stage.parts import OutputTooWideError, PartWriter

#: A struct column's name: each of its leaves' paths repeats it.
_LONG = "s" * 2_000


def _staged(number: int, columns: dict[str, Any]) -> dict[str, Any]:  # Any: JSON values
    record = {"row_id": f"f{number}:1", **columns, "generated_text": "g"}
    return {"source": f"f{number}:1", "ok": True, "record": json.dumps(record), "tokens": [1, 1]}


def _struct_row(number: int, leaves: int) -> dict[str, Any]:
    """One file's row: a struct of short leaves under a long name of its own."""
    return {f"{number}{_LONG}": {f"k{leaf:05d}": 1 for leaf in range(leaves)}}


def _data_files(root: Path) -> dict[Path, bytes]:
    return {file: file.read_bytes() for file in root.rglob("outputs/*.parquet")}


def test_struct_paths_too_long_for_one_footer_fail_the_commit_before_any_rewrite(tmp_path: Path) -> None:
    # Each part is within the bound; their one schema is not (about 2 x 4.9 MB of footer), while
    # their names and types are 75 KB, far under the names-only check.
    writer = PartWriter(str(tmp_path / "staging"), "parquet", count_labels=False)
    staged = [writer.write_part([_staged(number, _struct_row(number, 2_200))]) for number in range(2)]  # type: ignore[list-item]
    before = _data_files(tmp_path)

    with pytest.raises(OutputTooWideError, match=r"the run's outputs have \d+ columns .* keep_columns"):
        writer.conform_parts(staged)
    assert _data_files(tmp_path) == before


def test_a_part_whose_top_level_names_pass_the_bound_is_refused_before_arrow_builds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[int] = []
    typed_array = part_schema.typed_array

    def counted(values: list[Any]) -> Any:  # Any: JSON values, an Arrow array
        built.append(len(values))
        return typed_array(values)

    monkeypatch.setattr(part_schema, "typed_array", counted)
    writer = PartWriter(str(tmp_path / "staging"), "parquet", count_labels=False)
    rows = [  # 4 files' rows, 450 distinct 1,000-character keys each (about 1.7 MB of footer a file)
        _staged(number, {f"f{number}_{key:03d}".ljust(1_000, "k"): key for key in range(450)})
        for number in range(4)
    ]

    with pytest.raises(OutputTooWideError, match=r"a part's rows have 1,802 columns .* keep_columns"):
        writer.write_part(rows)  # type: ignore[arg-type]
    assert built == []
    assert _data_files(tmp_path) == {}


def test_a_part_whose_structs_together_pass_the_bound_is_refused(tmp_path: Path) -> None:
    writer = PartWriter(str(tmp_path / "staging"), "parquet", count_labels=False)
    rows = [_staged(number, _struct_row(number, 1_100)) for number in range(3)]  # 3 x 2.5 MB of footer

    with pytest.raises(OutputTooWideError, match=r"a part's rows have \d+ columns .* keep_columns"):
        writer.write_part(rows)  # type: ignore[arg-type]
    assert _data_files(tmp_path) == {}


def test_many_sparse_columns_of_ordinary_names_still_commit(tmp_path: Path) -> None:
    # 2,000 distinct 30-character columns over 2 parts, each column in one part only (10,000 such
    # columns are within the bound too: test_part_schema.py).
    writer = PartWriter(str(tmp_path / "staging"), "parquet", count_labels=False)
    staged = [
        writer.write_part(
            [_staged(number, {f"c{number}_{key:05d}".ljust(30, "k"): key for key in range(1_000)})]  # type: ignore[list-item]
        )
        for number in range(2)
    ]

    writer.conform_parts(staged)
    assert sum(len(writer.read_part(part)) for part in staged) == 2


def test_one_row_of_long_texts_in_many_columns_commits(tmp_path: Path) -> None:
    # A text leaf's min and max statistics are its values (up to 4 KiB each): 1,500 columns of 4 KB
    # made a 12 MB footer, past what the commit reads back, on every try.
    writer = PartWriter(str(tmp_path / "staging"), "parquet", count_labels=False)
    texts = {f"c{column:04d}": "x" * 4_000 + str(column) for column in range(1_500)}
    staged = [writer.write_part([_staged(0, {**texts, "n": 7})])]  # type: ignore[list-item]

    writer.conform_parts(staged)
    (row,) = writer.read_part(staged[0])
    assert json.loads(row["record"])["c1499"] == "x" * 4_000 + "1499"


def test_a_text_column_named_like_a_struct_leaf_takes_none_of_its_statistics(tmp_path: Path) -> None:
    # pyarrow takes statistics by dotted path: the int leaf a.b0 gave its own to the text column "a.b0",
    # and 1,100 text columns of 4 KB made a 9.2 MB footer the commit refused on every try.
    writer = PartWriter(str(tmp_path / "staging"), "parquet", count_labels=False)
    row = {"a": {f"b{leaf}": leaf for leaf in range(1_100)}}
    row |= {f"a.b{leaf}": "x" * 4_000 for leaf in range(1_100)}
    staged = [writer.write_part([_staged(0, row)])]  # type: ignore[list-item]

    writer.conform_parts(staged)
    (read,) = writer.read_part(staged[0])
    assert json.loads(read["record"])["a"]["b7"] == 7


def test_a_long_value_after_a_shorter_one_gets_a_page_the_commit_reads_back(tmp_path: Path) -> None:
    # pyarrow checks a page's size only after a value went in: 1 MB then 64 MB made a 68 MB page,
    # past the 64 MiB a page may decode to, and the commit refused the part on every try.
    writer = PartWriter(str(tmp_path / "staging"), "parquet", count_labels=False)
    rows = [_staged(0, {"text": "a" * 1_040_000}), _staged(1, {"text": "b" * ((64 << 20) - 4_096)})]
    staged = [writer.write_part(rows)]  # type: ignore[arg-type]

    assert [len(json.loads(row["record"])["text"]) for row in writer.read_part(staged[0])] == [
        1_040_000,
        (64 << 20) - 4_096,
    ]
