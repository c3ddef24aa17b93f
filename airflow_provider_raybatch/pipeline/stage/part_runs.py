"""How a flush of staged rows is cut into parts, each within what the commit may read back.

A caller cuts its rows by what it sees before they are staged (a replica, by the engine's rows), but a
part's rows cost more read back than their engine rows did, in two ways:

* a row's staged line: an OpenAI line's logprobs spell out each token's bytes and alternatives (32
  lines of 2,000 tokens with 20 logprobs were charged 4.4 MiB each as engine rows and cost 62 MiB
  each read back: 1.95 GiB in one part, which the commit refused on every try);
* a Parquet part's null cells: its table has every column any of its rows has, and a row is charged
  each cell of it, null or not. 450 small rows of 22 keys of their own (11.6 MB of lines) were one
  part of 9,901 columns, 4.46M null cells of about 270 B each read back: refused on every try.

So each part's lines are held within :data:`PART_LINES_COST_MOST` and its null cells within the rest
of :data:`..read.staged_parquet.FILE_COST_BYTES`, each charged as the commit charges it.
"""

from __future__ import annotations

import json

from airflow_provider_raybatch.pipeline.read import raw_records, row_costs, staged_parquet
from airflow_provider_raybatch.pipeline.row_types import StagedRow
from airflow_provider_raybatch.pipeline.stage import part_schema
from airflow_provider_raybatch.shared.specs import OutputFormat

#: The most a part's lines may cost together once the commit reads them back (as
#: :func:`..read.raw_records.json_line_cost` charges a line): half of what a part may
#: (:data:`..read.staged_parquet.FILE_COST_BYTES`), the rest for a Parquet part's null cells.
PART_LINES_COST_MOST = staged_parquet.FILE_COST_BYTES // 2
#: The most a Parquet part's null cells may cost together once read back.
PART_NULL_CELLS_COST_MOST = staged_parquet.FILE_COST_BYTES - PART_LINES_COST_MOST


def line_cost_at_most(record: str, budget: int) -> int:
    """At most what a staged row's line (``record``, its JSON text) costs the commit read back in a JSONL
    part, charged as the commit charges a line (:func:`..read.raw_records.json_line_cost`; past
    ``budget`` counted again outside its strings), four times over where it is not ASCII.

    Why four: the line is written with its lone surrogates escaped (six bytes each), and with every
    non-ASCII character escaped in an ASCII-only part (an OpenAI output), and the commit charges an
    escape as the character it stands for, at up to 4 bytes wide: a surrogate charged 2 x 3 bytes here
    was 4 x 6 read back (a row of 2,500,000 of them: 15 MB charged, 60 MB read back).
    """
    line = record.encode("utf-8", "surrogatepass")
    return raw_records.json_line_cost(line, budget) * (1 if line.isascii() else 4)


def row_cost_at_most(record: str, output_format: OutputFormat, budget: int) -> int:
    """At most what a staged row (``record``, its JSON text) costs the commit read back alone: in JSONL,
    its line (:func:`line_cost_at_most`); in Parquet, the row once Arrow, Python and JSON text
    (:func:`..read.row_costs.row_costs`), at most five times what the input reader charges its text
    (:data:`..read.staged_parquet.READ_BACK_PER_JSON_BYTE`). A Parquet row's text costs about three
    times its line read back (its Arrow and Python values beside its JSON): 256 MiB of lines was a part
    past the 1 GiB the commit reads."""
    if output_format != "parquet":
        return line_cost_at_most(record, budget)
    per_byte = staged_parquet.READ_BACK_PER_JSON_BYTE
    line = record.encode("utf-8", "surrogatepass")
    return per_byte * raw_records.json_line_cost(line, budget // per_byte)


#: A row's JSON up to this long cannot cost the commit too much through its nulls inside lists and
#: objects: k nulls beside an item of F fields cost about k x F x 247 B read back (x4 for names past
#: ASCII), at most about 8 L^2 for L bytes of JSON: 128 MiB at 4 KiB, under a row's decode bound.
_NESTED_NULLS_CHECKED_FROM = 4 << 10


def lone_row_refusal(record: str) -> str | None:
    """Why a row (its JSON text) alone, as a Parquet part, is past what the commit reads back, or None:
    read as the commit reads it where its nulls inside lists or objects could make it so. One row of
    513 KB, a list of 1,000 nulls beside an object of 1,000 500-character keys, was a part the commit
    refused on every try: each null read back as a null in each of the widest item's fields."""
    if len(record) <= _NESTED_NULLS_CHECKED_FROM or "null" not in record:
        return None
    row = json.loads(record)
    if not any(_holds_null(value) for value in row.values() if isinstance(value, dict | list)):
        return None
    try:
        staged_parquet.check_cost(part_schema.encode_parquet(part_schema.table_of([row])))
    except ValueError as err:  # its cost, a page's, the row's or the file's decode bound, its width
        return str(err)
    return None


def _holds_null(value: object) -> bool:
    if value is None:
        return True
    if isinstance(value, dict):
        return any(_holds_null(item) for item in value.values())
    if isinstance(value, list):
        return any(_holds_null(item) for item in value)
    return False


def _names_are_ascii(value: object) -> bool:
    """Whether every object key in ``value``, at any depth, is ASCII."""
    if isinstance(value, dict):
        return all(str(key).isascii() and _names_are_ascii(item) for key, item in value.items())
    if isinstance(value, list):
        return all(_names_are_ascii(item) for item in value)
    return True


def _null_shape(value: object) -> tuple[int, int]:
    """What a null cell of a column holding ``value`` is charged read back: its values (a struct's
    null is a null in each of its fields, and a dict) and its names' JSON text. A struct column's
    values all have the same fields (``part_schema`` writes objects of different keys as JSON text),
    so any one value tells."""
    if not isinstance(value, dict):
        return 1, 0
    values, names_text = 1, 0
    for name, item in value.items():
        item_values, item_names = _null_shape(item)
        values += item_values
        names_text += row_costs.name_json_length(str(name)) + item_names
    return values, names_text


class _NullCells:
    """What a growing Parquet part's null cells cost read back: each row has a null cell for each of
    the part's columns it lacks or holds null, charged as :func:`..read.row_costs.row_costs` charges
    a null of the column (:func:`_null_shape`) with its name. Kept as sums, so that adding a row costs
    its own values only, at every row's widest width (4 bytes a character once any text is not ASCII)."""

    def __init__(self) -> None:
        self.rows = 0
        self.cost = 0  # the null cells' cost so far, at width 1
        self.columns: dict[str, tuple[int, int]] = {}  # name -> (rows holding it, a null's cost)
        self.null_row = 0  # what a row holding none of the columns costs: the sum of their nulls
        self.ascii = True

    def cost_with(self, row: dict[str, object], ascii_row: bool) -> int:
        """What the part's null cells would cost with ``row`` added."""
        cost, _, _ = self._added(row)
        ascii_part = self.ascii and ascii_row and all(name.isascii() for name in row)
        return cost * (1 if ascii_part else 4)

    def add(self, row: dict[str, object], ascii_row: bool) -> None:
        self.cost, self.null_row, changed = self._added(row)
        self.columns.update(changed)
        self.rows += 1
        self.ascii = self.ascii and ascii_row and all(name.isascii() for name in row)

    def _added(self, row: dict[str, object]) -> tuple[int, int, dict[str, tuple[int, int]]]:
        """The cost and a null row's cost with ``row`` added, and the columns it changes."""
        cost, null_row = self.cost, self.null_row
        changed: dict[str, tuple[int, int]] = {}
        for name, value in row.items():
            values, names_text = _null_shape(value)
            null = row_costs.null_cost(values, names_text + row_costs.name_json_length(name))
            holding, was = self.columns.get(name, (0, 0))
            if null > was:  # a new column, or one whose values were seen narrower: earlier nulls grow
                cost += (self.rows - holding) * (null - was)
                null_row += null - was
            # A null value is a null cell like a missing key: a wide struct column's null is a null in
            # each of its fields (4 columns of 1,000 fields, null in 232 rows: 1.9 GB read back).
            changed[name] = (holding + (value is not None), max(null, was))
        own = sum(null for name, (_, null) in changed.items() if row[name] is not None)
        return cost + null_row - own, null_row, changed


def cut_into_parts(rows: list[StagedRow], output_format: OutputFormat) -> list[list[StagedRow]]:
    """``rows`` in order, cut into as many parts as keep each within what the commit reads back: its
    rows alone within :data:`PART_LINES_COST_MOST` (:func:`row_cost_at_most`) and, in Parquet, its
    null cells within :data:`PART_NULL_CELLS_COST_MOST`, each row four times over once a column or field
    name of the part, at any depth, is not ASCII. A row is never cut: one over a bound is a part
    of its own (it is bounded where it is staged, ``row_steps``; a row has no null cells of its own)."""
    runs: list[list[StagedRow]] = [[]]
    rows_cost = 0
    nulls = _NullCells()
    names_ascii = True  # every column and field name of the part so far
    for row in rows:
        cost = row_cost_at_most(row["record"], output_format, PART_LINES_COST_MOST)
        record: dict[str, object] = json.loads(row["record"]) if output_format == "parquet" else {}
        ascii_row = row["record"].isascii()
        # The commit reads each row at the width of its part's widest column or field name too: ASCII
        # text of '"' charged 10 B a character was 26 B read back beside another row's key (or a
        # struct's field, at any depth) past U+FFFF.
        row_names_ascii = _names_are_ascii(record)
        over = (rows_cost + cost) * (1 if names_ascii and row_names_ascii else 4) > PART_LINES_COST_MOST
        over = over or (
            output_format == "parquet" and nulls.cost_with(record, ascii_row) > PART_NULL_CELLS_COST_MOST
        )
        if over and runs[-1]:
            runs.append([])
            rows_cost = 0
            nulls = _NullCells()
            names_ascii = True
        runs[-1].append(row)
        rows_cost += cost
        names_ascii = names_ascii and row_names_ascii
        if output_format == "parquet":
            nulls.add(record, ascii_row)
    return [run for run in runs if run]
