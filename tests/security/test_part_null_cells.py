"""A Parquet part's table has every column any of its rows has, and the commit charges a row each cell
of it, null or not (issue 45). 450 small rows of 22 keys of their own (11.6 MB of lines, each input
file within its bounds, ``batch_size`` 900) were cut as one part of 9,901 columns: 4.46M null cells of
about 270 B each read back, which the commit refused on every try. A part's null cells are now
charged as rows are cut into parts (bounds scaled down here: 40 rows show what 450 did)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_raybatch.pipeline.read import row_costs, staged_parquet
from airflow_provider_raybatch.pipeline.row_types import StagedRow
from airflow_provider_raybatch.pipeline.stage import part_runs, part_schema
from airflow_provider_raybatch.pipeline.stage.parts import PartWriter
from airflow_provider_raybatch.shared.json_types import JsonObject

#: A part may cost 1 MB read back here (1 GiB in the product): half for its lines, half its nulls.
_FILE_COST = 1_000_000


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(staged_parquet, "FILE_COST_BYTES", _FILE_COST)
    monkeypatch.setattr(part_runs, "PART_LINES_COST_MOST", _FILE_COST // 2)
    monkeypatch.setattr(part_runs, "PART_NULL_CELLS_COST_MOST", _FILE_COST // 2)


def _present(record: JsonObject) -> JsonObject:
    return {key: value for key, value in record.items() if value is not None}


def _staged(record: JsonObject, number: int) -> StagedRow:
    return StagedRow(source=f"in.jsonl:{number}", ok=True, record=json.dumps(record, ensure_ascii=False))


def _own_keys(number: int) -> JsonObject:
    """A row of 5 keys no other row has, and the generated text every row has."""
    return {**{f"k{number}_{key}": key for key in range(5)}, "generated_text": "ok"}


def _null_struct(number: int) -> JsonObject:
    """The first row holds a wide object column, every other row null in it."""
    wide = {f"field_{key}": key for key in range(100)} if number == 0 else None
    return {"s": wide, "generated_text": "ok"}


def _own_struct(number: int) -> JsonObject:
    """A row of one object column of its own: its null in every other row is a null in each field."""
    return {f"s{number}": {f"field_{key}": key for key in range(5)}, "generated_text": "ok"}


@pytest.mark.usefixtures("small_parts")
@pytest.mark.parametrize(
    "row_of", [_own_keys, _own_struct, _null_struct], ids=["own keys", "own object column", "null object"]
)
def test_rows_whose_keys_differ_are_cut_into_parts_the_commit_reads_back(tmp_path: Path, row_of) -> None:
    rows = [_staged(row_of(number), number) for number in range(40)]
    writer = PartWriter(str(tmp_path / "staging"), "parquet", count_labels=False)
    # Each row's line is small: one part by what the lines cost.
    assert sum(part_runs.line_cost_at_most(row["record"], _FILE_COST) for row in rows) < _FILE_COST // 4

    parts = writer.write_parts(rows)

    assert len(parts) > 1
    back = [json.loads(row["record"]) for part in parts for row in writer.read_part(part)]  # bounded read
    # A row's missing columns are read back as nulls.
    assert [_present(row) for row in back] == [_present(json.loads(row["record"])) for row in rows]


@pytest.mark.usefixtures("small_parts")
def test_rows_that_share_their_keys_stay_one_part(tmp_path: Path) -> None:
    rows = [_staged({"id": number, "generated_text": "ok " * 10}, number) for number in range(100)]
    writer = PartWriter(str(tmp_path / "staging"), "parquet", count_labels=False)

    parts = writer.write_parts(rows)

    assert [part.sidecar["rows_out"] for part in parts] == [100]


@pytest.mark.usefixtures("small_parts")
def test_a_jsonl_part_has_no_null_cells_to_charge(tmp_path: Path) -> None:
    rows = [_staged(_own_keys(number), number) for number in range(40)]
    writer = PartWriter(str(tmp_path / "staging"), "jsonl", count_labels=False)

    assert [part.sidecar["rows_out"] for part in writer.write_parts(rows)] == [40]


# Each key holds values of one shape (a struct column's values all have the same fields: objects of
# different keys are written as JSON text, whose null is one cell), some of them not ASCII.
_KEYS = ["a", "b", "name_long_" * 4, "é", "日本", "𝔘"]
_SHAPES = {
    "a": st.integers(-(2**40), 2**40),
    "b": st.text(max_size=30),
    "name_long_" * 4: st.builds(lambda x, y: {"x": x, "y": {"z": y}}, st.booleans(), st.text(max_size=5)),
    "é": st.lists(st.integers(0, 9), max_size=4),
    "日本": st.floats(allow_nan=False, allow_infinity=False),
    "𝔘": st.builds(lambda t: {"t": t}, st.text(max_size=8)),
}
_ROW = st.sets(st.sampled_from(_KEYS), min_size=1).flatmap(
    lambda keys: st.fixed_dictionaries({key: _SHAPES[key] for key in sorted(keys)})
)


@given(st.lists(_ROW, min_size=1, max_size=12))
@settings(max_examples=200, deadline=None)
def test_the_null_cells_charged_are_at_least_what_the_commit_charges_them(records: list[JsonObject]) -> None:
    """What the part's table costs read back is at most what its rows cost alone plus the null cells
    charged, for any rows whose columns keep their types (the charge is an upper bound)."""
    nulls = part_runs._NullCells()
    for record in records:
        nulls.add(dict(record), json.dumps(record, ensure_ascii=False).isascii())
    together = int(row_costs.row_costs(part_schema.table_of(records)).held.sum())
    alone = sum(int(row_costs.row_costs(part_schema.table_of([record])).held.sum()) for record in records)
    width = 1 if nulls.ascii else 4

    assert together <= alone + nulls.cost * width


@pytest.mark.usefixtures("small_parts")
def test_parquet_rows_are_charged_what_their_values_cost_read_back_not_their_lines(tmp_path: Path) -> None:
    """A Parquet row's text costs about three times its line read back (Arrow, Python and JSON text):
    rows whose lines fit half a part were one part past the whole of what the commit reads."""
    rows = [_staged({"id": number, "generated_text": "x" * 45_000}, number) for number in range(10)]
    assert sum(part_runs.line_cost_at_most(row["record"], _FILE_COST) for row in rows) < _FILE_COST // 2
    writer = PartWriter(str(tmp_path / "staging"), "parquet", count_labels=False)

    parts = writer.write_parts(rows)

    assert len(parts) > 1
    assert sum(len(writer.read_part(part)) for part in parts) == 10


@pytest.mark.usefixtures("small_parts")
@pytest.mark.parametrize("wide", [{"𝔘": "x"}, {"s": {"t": {"𝔘": 1}}}], ids=["column", "field"])
def test_a_name_that_is_not_ascii_at_any_depth_widens_every_row_of_its_part(tmp_path: Path, wide) -> None:
    """The commit charges a row at the width of its widest character, its part's column and field
    names included (its null cells are its own): one row's key past U+FFFF made ASCII rows of '"'
    (charged 10 B a character) cost 26 B a character read back, and the commit refused the part on
    every try; a struct field's name, at any depth, the same."""
    rows = [_staged(wide, 0)] + [_staged({"id": number, "q": '"' * 1_500}, number) for number in range(1, 28)]
    writer = PartWriter(str(tmp_path / "staging"), "parquet", count_labels=False)

    parts = writer.write_parts(rows)

    assert sum(len(writer.read_part(part)) for part in parts) == 28


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=6), children, max_size=5)
    ),
    max_leaves=30,
)


@given(st.dictionaries(st.text(min_size=1, max_size=8), _JSON, min_size=1, max_size=6))
@settings(max_examples=300, deadline=None)
def test_a_parquet_row_alone_costs_at_most_what_it_is_charged(record: JsonObject) -> None:
    text = json.dumps(record, ensure_ascii=False)
    read_back = int(row_costs.row_costs(part_schema.table_of([record])).held.sum())

    assert read_back <= part_runs.row_cost_at_most(text, "parquet", 1 << 40)


_CELL = st.one_of(
    st.integers(-(2**40), 2**40),
    st.text(max_size=40),
    st.lists(st.integers(0, 9), max_size=6),
    st.builds(lambda t: {"t": t, "u": {"v": t}}, st.text(max_size=8)),
)
_PART_ROW = st.dictionaries(
    st.sampled_from(["a", "b", "c", "é", "日本", "𝔘", *(f"k{n}" for n in range(12))]), _CELL, min_size=1
)


@given(st.lists(_PART_ROW, min_size=1, max_size=40))
@settings(max_examples=150, deadline=None)
def test_every_part_cut_from_any_rows_costs_at_most_what_the_commit_reads(records: list[JsonObject]) -> None:
    """Each part, however its rows' keys, types and widths differ, costs the commit at most a part's
    bound read back, unless it is one row (a row is never cut; it is bounded where it is staged)."""
    rows = [_staged(record, number) for number, record in enumerate(records)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(part_runs, "PART_LINES_COST_MOST", 50_000)
        patch.setattr(part_runs, "PART_NULL_CELLS_COST_MOST", 10_000)
        parts = part_runs.cut_into_parts(rows, "parquet")

    assert [row for part in parts for row in part] == rows
    for part in parts:
        table = part_schema.table_of([json.loads(row["record"]) for row in part])
        assert len(part) == 1 or int(row_costs.row_costs(table).held.sum()) <= 60_000


@pytest.mark.usefixtures("small_parts")
def test_a_part_given_the_outputs_columns_is_read_back_as_staged_by_a_later_commit(tmp_path: Path) -> None:
    """The commit gives each part the output's columns as null cells and keeps its sidecar: a later
    commit of the same staging (a held run taken, a commit resumed) read every part whole, and 300 rows
    given 4,481 columns were refused on every try. It reads each part's staged columns only."""
    writer = PartWriter(str(tmp_path / "staging"), "parquet", count_labels=False)
    shared = [_staged({**{f"a{key}": key for key in range(10)}, "n": number}, number) for number in range(30)]
    parts = writer.write_parts(shared)
    parts += [
        part
        for number in range(30)
        for part in writer.write_parts([_staged(_own_keys(number), 100 + number)])
    ]
    assert [part.sidecar["rows_out"] for part in parts[:1]] == [30]

    writer.conform_parts(parts)  # the first commit
    writer.conform_parts(parts)  # a later one
    back = writer.read_part(parts[0])

    assert [json.loads(row["record"]) for row in back] == [json.loads(row["record"]) for row in shared]


def test_a_later_commit_reads_a_dotted_column_name_as_that_column_only(tmp_path: Path) -> None:
    """pyarrow takes a column name as a dotted path: a later commit that read a part's ``a.b`` by name
    read the struct ``a``'s field ``b`` too, with every null field the first commit gave it (3,000 of
    them: refused on every try), and staged its rows again with a key ``a`` they never had."""
    writer = PartWriter(str(tmp_path / "staging"), "parquet", count_labels=False)
    parts = writer.write_parts([_staged({"a": {"b": 1, "c": "x"}}, 0)])
    parts += writer.write_parts([_staged({"a.b": 7, "id": 1}, 1)])

    writer.conform_parts(parts)  # the first commit: the second part gets a struct column "a" of nulls
    writer.conform_parts(parts)  # a later one

    assert [json.loads(row["record"]) for row in writer.read_part(parts[1])] == [{"a.b": 7, "id": 1}]


def test_a_later_commit_of_other_parts_keeps_a_column_the_first_made_json_text(tmp_path: Path) -> None:
    """The first commit wrote a column as JSON text in every part (its types disagreed); a later one
    saw other parts (a retry staged rows again and the first copy went), whose types agreed, and took
    the first commit's JSON text file as matching a text column: its values were committed with
    their JSON quotes. The sidecar now says what each file holds."""
    writer = PartWriter(str(tmp_path / "staging"), "parquet", count_labels=False)
    text, number, other = (
        writer.write_parts([_staged({"x": value}, n)])[0] for n, value in enumerate(["Acme", 5, "Beta"])
    )
    writer.conform_parts([text, number])  # the first commit: x is JSON text in both

    later = writer.conform_parts([text, other])

    assert later["outputs"] == ["x"]  # JSON text in every part, and the manifest says so
    assert [json.loads(row["record"]) for row in writer.read_part(text)] == [{"x": "Acme"}]
    assert [json.loads(row["record"]) for row in writer.read_part(other)] == [{"x": "Beta"}]


class _Killed(BaseException):
    """The committing driver killed."""


def _killed(*args: object, **kwargs: object) -> None:
    raise _Killed


@pytest.mark.parametrize("killed", ["before the file", "after the file"])
def test_a_commit_killed_while_it_rewrites_a_part_leaves_the_next_one_right(
    tmp_path: Path, killed: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit that gave a part's column as JSON text and died before its sidecar said so left a later
    commit (of other parts, whose types agreed) taking the file as plain text: its values committed with
    their JSON quotes. Now the sidecar says the rewrite first, and the next commit rewrites the file."""
    from airflow_provider_raybatch.pipeline import storage
    from airflow_provider_raybatch.pipeline.stage.commit import StagedPart

    writer = PartWriter(str(tmp_path / "staging"), "parquet", count_labels=False)
    text, number, other = (
        writer.write_parts([_staged({"x": value}, n)])[0] for n, value in enumerate(["Acme", 5, "Beta"])
    )
    write_bytes, record = storage.write_bytes, PartWriter._record_columns

    def dies(self: PartWriter, part: StagedPart, folder: str, *args: object, rewriting: bool) -> None:
        if not rewriting:  # the file is rewritten: its sidecar is not updated
            raise _Killed
        record(self, part, folder, *args, rewriting=rewriting)  # type: ignore[arg-type]
        if killed == "before the file":
            monkeypatch.setattr(storage, "write_bytes", _killed)  # the part's file is not rewritten

    monkeypatch.setattr(PartWriter, "_record_columns", dies)
    with pytest.raises(_Killed):
        writer.conform_parts([text, number])
    monkeypatch.setattr(PartWriter, "_record_columns", record)
    monkeypatch.setattr(storage, "write_bytes", write_bytes)
    on_disk = [
        StagedPart(part.name, json.loads((tmp_path / "staging" / "parts" / f"{part.name}.json").read_text()))
        for part in (text, other)
    ]

    later = writer.conform_parts(on_disk)

    assert later["outputs"] == ["x"]
    assert [json.loads(row["record"]) for part in on_disk for row in writer.read_part(part)] == [
        {"x": "Acme"},
        {"x": "Beta"},
    ]


@pytest.mark.usefixtures("small_parts")
@pytest.mark.parametrize(
    "rows",
    [
        [{"c": [{f"field_{key}": key for key in range(100)}]}, {"c": [None] * 60}],
        [{"c": {"x": {f"field_{key}": key for key in range(100)}}}] + [{"c": {"x": None}}] * 60,
    ],
    ids=["null items of a list of objects", "null object in a held object"],
)
def test_nulls_inside_a_held_column_are_read_back(tmp_path: Path, rows: list[JsonObject]) -> None:
    """A null inside a column a row holds (a list's item, an object's field) is read back as a null in
    each field of the widest value there: two rows, one a list of 900 nulls beside a list of an object
    of 4,000 fields, were a part the commit refused on every try. A part whose file the commit would
    refuse is written in halves."""
    staged = [_staged(record, number) for number, record in enumerate(rows)]
    writer = PartWriter(str(tmp_path / "staging"), "parquet", count_labels=False)

    parts = writer.write_parts(staged)

    back = [json.loads(row["record"]) for part in parts for row in writer.read_part(part)]
    assert len(parts) > 1 and len(back) == len(rows)


@pytest.mark.usefixtures("small_parts")
def test_a_column_staged_all_null_is_not_read_again_at_the_type_the_first_commit_gave_it(
    tmp_path: Path,
) -> None:
    """A part whose column was all null was given the output's wide object type by the first commit,
    and a later one read its nulls at that type, each a null in every field: 2,000 nulls of an object
    of 1,500 fields were refused on every later try. A column staged all null is not read again."""
    writer = PartWriter(str(tmp_path / "staging"), "parquet", count_labels=False)
    wide = writer.write_parts(
        [_staged({"id": 0, "c": {f"field_{key:03d}_".ljust(50, "k"): key for key in range(100)}}, 0)]
    )
    nulls = writer.write_parts([_staged({"id": number, "c": None}, number) for number in range(1, 61)])
    assert len(nulls) == 1

    writer.conform_parts(wide + nulls)  # the first commit: c is an object of 100 fields in both parts
    writer.conform_parts(wide + nulls)  # a later one

    assert [_present(json.loads(row["record"])) for row in writer.read_part(nulls[0])] == [
        {"id": number} for number in range(1, 61)
    ]
