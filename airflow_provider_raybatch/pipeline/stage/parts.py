"""Staged parts: how result rows are written to a run's staging folder, and read back.

Each group of result rows (``source``, ``ok``, ``record``) becomes one part::

    <data>/outputs/<part>.<ext>      the part's output rows, in the run's output format
    <data>/errors/<part>.<ext>       the part's error rows
    <staging>/parts/<part>.json      sidecar: the part's sources and counts; its presence commits the part

``<data>`` is the version folder the run will commit (:func:`.commit.staged_data_uri`), so that the
commit moves nothing; ``<staging>`` is ``_staging/<run_key>``.

The sidecar lists the sources of the output rows first, then those of the error rows, each in file
order (``sources_in_file_order``), so that commit can take single rows out of a part
(:func:`.commit._drop_repeated_rows`), and the output rows' labels in the same order where any row
has one (``labels``), so that a row staged again still counts in ``generated_text_counts`` as the
label it is, and free text never does; and their engine token counts (``tokens``), which a postprocess
may have left out of the rows. It also carries what the run report needs, kept small: when the
part was written and power-of-two histograms of its output rows' token counts (see :mod:`.report`).

A part without a sidecar (the job died while writing it) does not count and is removed on resume,
so a retry redoes at most the rows that were being staged. Commit reads only the sidecars.

No Ray here: the engine replicas (:mod:`.engine_actor`), the Ray Data sink (:mod:`.sink`) and commit
all write through :class:`PartWriter`.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import uuid
from collections import Counter
from typing import TYPE_CHECKING, Any

from airflow_provider_raybatch.pipeline import storage
from airflow_provider_raybatch.pipeline.openai import openai_batch
from airflow_provider_raybatch.pipeline.read import staged_parquet
from airflow_provider_raybatch.pipeline.reporting.report import part_report_fields, row_tokens
from airflow_provider_raybatch.pipeline.reporting.timings import FIRST_ROW_IN_ENGINE_KEY, REPLICA_KEY
from airflow_provider_raybatch.pipeline.row_types import StagedRow
from airflow_provider_raybatch.pipeline.stage import footer_width, part_runs, part_schema
from airflow_provider_raybatch.pipeline.stage.commit import (
    PART_FOLDERS,
    SEAL_FILE_NAME,
    SOURCES_IN_FILE_ORDER,
    STAGED_VERSION_KEY,
    StagedPart,
    reason_kind,
)
from airflow_provider_raybatch.pipeline.stage.footer_width import OutputTooWideError
from airflow_provider_raybatch.shared.json_types import JsonObject, Kwargs, Row
from airflow_provider_raybatch.shared.jsonl import split_lines
from airflow_provider_raybatch.shared.manifest import MANIFEST_FILE_NAME
from airflow_provider_raybatch.shared.specs import ERROR_COLUMN, OutputFormat

if TYPE_CHECKING:
    import pyarrow as pa


def _check_width(target: dict[str, str], folder: str, fields: list[pa.Field] | None = None) -> None:
    """Refuse, before any part is rewritten, an output whose one schema no part's footer could hold.

    :param fields: the target's Arrow fields (:func:`.part_schema.target_fields`), once its concrete
        types are read from the parts' footers: what a footer of them takes is measured
        (:func:`.footer_width.schema_bytes`). Unset: only the names and type texts are counted, which
        needs no footer read.
    :raises OutputTooWideError: naming the columns, their size and the way out (``keep_columns``).
    """
    if fields is not None:
        too_wide = footer_width.refusal(len(fields), footer_width.schema_bytes(fields), f"the run's {folder}")
        if too_wide is not None:
            raise too_wide
        return
    size = sum(len(name.encode()) + len(kind.encode()) for name, kind in target.items())
    if size > MAX_OUTPUT_SCHEMA_BYTES:
        raise OutputTooWideError(
            f"the run's {folder} have {len(target):,} columns whose names and types take {size:,} bytes "
            f"together, more than one output file can describe ({MAX_OUTPUT_SCHEMA_BYTES:,}): the input "
            "files' rows bring different columns (each file is within its own bounds). Keep the columns "
            "the output needs with keep_columns, or give the files one set of columns."
        )


def _output_of(staging_uri: str) -> str | None:
    """The output folder of a run's staging folder (``OutputLayout.staging_uri``:
    ``<output>/_staging/<run_key>``); None when the staging is not laid out so."""
    parent = posixpath.dirname(staging_uri.rstrip("/"))
    return posixpath.dirname(parent) if posixpath.basename(parent) == "_staging" else None


class StagingTakenError(RuntimeError):
    """A writer's staging was started afresh or committed by a newer try: it writes nothing more."""


#: Sidecar key: each output row's label (the choice its answer was held to; None for free text), in
#: file order, so that a row commit stages again still counts as the label it is, or not at all.
LABELS_KEY = "labels"
#: Sidecar key: each output row's engine token counts ``[in, out]``, in file order, where the engine
#: gave them: a postprocess may drop the token columns, so a row commit stages again keeps its counts.
TOKENS_KEY = "tokens"
#: Sidecar key: each data file's columns and their types (Parquet; see :mod:`.part_schema`), as the
#: file has them now: a commit that gives a part the output's columns records them here.
COLUMNS_KEY = "columns"
#: Sidecar key: each data file's columns as it was staged, kept where a commit gave it others: what a
#: later commit reads of it (:func:`_staged_columns`).
STAGED_COLUMNS_KEY = "staged_columns"
#: Sidecar key: the folders whose file a commit was rewriting for the output's columns (its sidecar
#: says the new ones): the next commit rewrites them again, whatever the sidecar says.
REWRITING_KEY = "rewriting"
#: The most bytes of column names and types an output's parts may have together once given one schema,
#: checked from the sidecars before any footer is read: every part's footer holds them about four
#: times over, and a footer is read at most 8 MiB. Each input file's rows are bounded alike
#: (``read.column_bound``), but several files' rows meet in one output: four files of 4,000 distinct
#: 127-character keys made every part's footer 9.5 MB. Names and types are not all a footer takes (a
#: struct's leaves repeat its name): the output's schema is then measured (:mod:`.footer_width`).
MAX_OUTPUT_SCHEMA_BYTES = 1 << 20


class PartTooCostlyError(ValueError):
    """A part's file, as encoded, is past what the commit reads back: its rows go in smaller parts."""


def _encode(
    records: list[Row], output_format: OutputFormat, ascii_only: bool = False, many_rows: bool = False
) -> tuple[bytes, dict[str, str]]:
    """A part's file and its columns' types (``part_schema.column_types``; empty for JSONL).

    JSONL lines are strict JSON (NaN and Infinity as null). Parquet's schema comes from every row of
    the part (:mod:`.part_schema`), never from the first.

    :param ascii_only: escape every non-ASCII character, so that no reader splitting lines on
        Unicode separators (str.splitlines splits on U+2028 and U+0085) cuts a line in two.
    :param many_rows: the part has more than one row: a Parquet file of nested columns is read as the
        commit reads it first (:func:`..read.staged_parquet.check_cost`), as its rows' nulls at any
        depth cost there what its widest rows' values do, which no charge before the table counts.
    :raises PartTooCostlyError: the file is past what the commit reads back."""
    if output_format == "jsonl":
        lines = (
            json.dumps(part_schema.strict_json_value(record), ensure_ascii=ascii_only) for record in records
        )
        text = "".join(_escape_line_breaks(line) + "\n" for line in lines)
        return text.encode("utf-8", "backslashreplace"), {}  # a lone surrogate as its JSON escape
    table = part_schema.table_of(records)
    data = part_schema.encode_parquet(table)
    if many_rows and part_schema.has_nested_columns(table.schema):
        try:
            staged_parquet.check_cost(data)
        except ValueError as err:  # its rows' cost or a page's, row's or the file's decode bound
            raise PartTooCostlyError(str(err)) from err
    return data, part_schema.column_types(table)


#: Characters that some readers take as line breaks (str.splitlines: U+0085, U+2028, U+2029); inside a
#: JSON string, written as escapes, so that every reader sees one line per row.
_LINE_BREAKS = {"\u0085": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def _escape_line_breaks(line: str) -> str:
    for character, escape in _LINE_BREAKS.items():
        line = line.replace(character, escape)
    return line


def _decode(
    data: bytes, output_format: OutputFormat, part_file: str, columns: list[str] | None = None
) -> list[Row]:
    if output_format == "jsonl":
        part_schema.check_json_cost(
            (line for _, line in split_lines(data)), part_file
        )  # before any is parsed
        return [json.loads(line) for line in data.decode().split("\n") if line]
    return part_schema.decode_parquet(data, part_file, columns)


def _staged_columns(part: StagedPart, folder: str) -> list[str] | None:
    """The columns a part's file had when it was staged (its sidecar's), or None where it names none.

    A commit gives each part the output's columns (:meth:`PartWriter.conform_parts`), adding each
    column the part lacks as null cells: a later commit of the same staging (a held run taken, a
    commit resumed) reads only these, or the part's rows would be charged the cells the first one
    added (300 rows given 4,481 columns: refused on every later try)."""
    staged = part.sidecar.get(STAGED_COLUMNS_KEY, {}).get(folder)
    if isinstance(staged, list) and all(isinstance(name, str) for name in staged):
        return staged
    columns = part.sidecar.get(COLUMNS_KEY, {}).get(folder)
    if not isinstance(columns, dict):
        return None
    # A column staged all null holds nothing to read; given the output's type by the first commit, it
    # would be read back at that type: 2,000 nulls of a struct of 1,500 fields were refused.
    return [name for name, kind in columns.items() if kind != part_schema.NULL_TYPE]


class PartWriter:
    """Write result rows into a run's staging folder as parts, and read a part's rows back."""

    def __init__(
        self,
        staging_uri: str,
        output_format: OutputFormat,
        count_labels: bool,
        openai_lines: bool = False,
        data_uri: str | None = None,
    ) -> None:
        """:param openai_lines: records are OpenAI batch output and error lines (tokens in ``usage``,
        the reason in ``error.message``), not rows.
        :param data_uri: where the data files go (the version folder); unset: ``staging_uri``."""
        self.staging_uri = staging_uri
        self.data_uri = data_uri or staging_uri
        #: The output folder the staging is in (``<output>/_staging/<run_key>``): on local disk nothing
        #: is written through a link below it. None for a staging outside an output's layout.
        self.output_uri = _output_of(staging_uri)
        self.output_format = output_format
        self.count_labels = count_labels
        self.openai_lines = openai_lines
        self.extension = "parquet" if output_format == "parquet" else "jsonl"
        self.ascii_only = openai_lines  # as OpenAI's own batch output is
        self.tokens_of = openai_batch.token_counts if openai_lines else row_tokens
        self.reason_of = openai_batch.error_reason if openai_lines else (lambda record: record[ERROR_COLUMN])
        #: An engine replica's clock (reporting/timings.py replica_clock), stamped on each part it stages.
        self.replica: dict[str, Any] | None = None
        #: When an engine took this stage's first row (epoch seconds; staged_udf.py), stamped likewise.
        self.first_row_in_engine_at: float | None = None

    def settings(self) -> Kwargs:
        """The keywords that build this writer again (in an engine replica, which stages rows too)."""
        return {
            "staging_uri": self.staging_uri,
            "output_format": self.output_format,
            "count_labels": self.count_labels,
            "openai_lines": self.openai_lines,
            "data_uri": self.data_uri,
        }

    def create_folders(self) -> None:
        for folder in PART_FOLDERS:
            root = self.staging_uri if folder == "parts" else self.data_uri
            storage.make_folders(storage.join(root, folder), within=self.output_uri)

    def write_parts(self, rows: list[StagedRow]) -> list[StagedPart]:
        """Stage ``rows`` as parts (:meth:`write_part`), in order, as many as keep each within what the
        commit reads back (:func:`.part_runs.cut_into_parts`: its lines, and a Parquet part's null cells;
        a part its file shows is past the commit's read, :class:`PartTooCostlyError`, in halves)."""
        return [
            part for run in part_runs.cut_into_parts(rows, self.output_format) for part in self._halved(run)
        ]

    def _halved(self, rows: list[StagedRow]) -> list[StagedPart]:
        try:
            return [self.write_part(rows)]
        except PartTooCostlyError:
            if len(rows) == 1:
                raise
            half = len(rows) // 2
            return self._halved(rows[:half]) + self._halved(rows[half:])

    def write_part(self, rows: list[StagedRow]) -> StagedPart:
        """Stage result rows (``source``, ``ok``, ``record``) as one part, its sidecar last.

        :raises StagingTakenError: the staging is no longer this writer's (:meth:`check_still_staging`).
        """
        self.check_still_staging()
        part = f"part-{uuid.uuid4().hex}"
        outputs = [json.loads(row["record"]) for row in rows if row["ok"]]
        errors = [json.loads(row["record"]) for row in rows if not row["ok"]]
        # The engine's counts where the row carries them (a postprocess may drop or rename the
        # token columns), else what the written row says.
        tokens = [
            _token_pair(row["tokens"]) if row.get("tokens") else self.tokens_of(record)
            for row, record in zip((row for row in rows if row["ok"]), outputs, strict=True)
        ]
        in_file_order = [row for row in rows if row["ok"]] + [row for row in rows if not row["ok"]]
        engine_counted = any(row.get("tokens") for row in rows if row["ok"])
        sidecar: JsonObject = {
            "sources": [row["source"] for row in in_file_order],
            SOURCES_IN_FILE_ORDER: True,
            "files": {},
            "rows_out": len(outputs),
            "rows_failed": len(errors),
            "tokens_in": sum(pair[0] for pair in tokens),
            "tokens_out": sum(pair[1] for pair in tokens),
            "errors_by_reason": dict(Counter(reason_kind(self.reason_of(record)) for record in errors)),
        }
        if engine_counted:
            sidecar[TOKENS_KEY] = [list(pair) for pair in tokens]
        if self.count_labels:  # the answers of rows constrained to labels (a choice), not free text
            # The label, not the written row: a postprocess may rename or drop generated_text.
            labels = [row.get("label") for row in rows if row["ok"]]
            sidecar["generated_text_counts"] = dict(Counter(label for label in labels if label is not None))
            if any(label is not None for label in labels):  # else all free text: nothing to keep
                sidecar[LABELS_KEY] = labels
        # Both files encoded (and checked) before either is written: a part found past the commit's
        # read is written as two, leaving nothing behind.
        encoded = {
            folder: _encode(records, self.output_format, self.ascii_only, many_rows=len(rows) > 1)
            for folder, records in (("outputs", outputs), ("errors", errors))
            if records
        }
        for folder, (data, types) in encoded.items():
            name = f"{part}.{self.extension}"
            storage.write_bytes(storage.join(self.data_uri, folder, name), data, within=self.output_uri)
            sidecar["files"][folder] = name
            if types:
                sidecar.setdefault(COLUMNS_KEY, {})[folder] = types
        if self.replica is not None:
            sidecar[REPLICA_KEY] = self.replica
        if self.first_row_in_engine_at is not None:
            sidecar[FIRST_ROW_IN_ENGINE_KEY] = round(self.first_row_in_engine_at, 3)
        # written_at: now, when the part's data is in place
        sidecar.update(part_report_fields(outputs, tokens_of=self.tokens_of, token_counts=tokens))
        # The sidecar last: until it exists the part's files do not count.
        sidecar_uri = storage.join(self.staging_uri, "parts", f"{part}.json")
        storage.write_bytes(sidecar_uri, json.dumps(sidecar).encode(), within=self.output_uri)
        try:  # a commit that listed the parts meanwhile must not find this one's files in its version
            self.check_still_staging()
        except BaseException:  # refused, or the check itself failed (a store error): the part is not staged
            for folder, name in sidecar["files"].items():
                storage.delete_file(storage.join(self.data_uri, folder, name), within=self.output_uri)
            storage.delete_file(sidecar_uri, within=self.output_uri)
            raise
        return StagedPart(part, sidecar)

    def check_still_staging(self) -> None:
        """Raise :class:`StagingTakenError` unless the version folder this writer writes into is still
        the one its run's staging names, and neither sealed for its commit nor committed yet.

        The data files go straight into the version folder (commit moves nothing), and a reader reads
        that whole folder once ``manifest.json`` names it. A replica of a job that has ended (its node
        cut off from Ray but not from the store) must not add a file there after a newer try started
        the staging afresh (a version folder no one removes) or committed it (rows the manifest does
        not count, in the result). Read before each part and after it (:meth:`write_part`), against the
        seal a commit sets once it has its parts (``commit.seal``): a part written across the commit's
        listing is removed by the writer, or by the seal. Left: a writer that stalls between its write
        and its second check past the manifest's write shows its part there until it resumes.
        """
        if self.data_uri == self.staging_uri:  # no version folder named yet: nothing a reader reads
            return
        version_uri = self.data_uri.rstrip("/")
        version = posixpath.basename(version_uri)
        pointer_uri = storage.join(self.staging_uri, "spec.json")
        try:  # one read: a publish may delete the staging between an exists and a read
            staged = json.loads(storage.read_text(pointer_uri, within=self.output_uri)).get(
                STAGED_VERSION_KEY
            )
        except FileNotFoundError:
            staged = None
        manifest_uri = storage.join(posixpath.dirname(posixpath.dirname(version_uri)), MANIFEST_FILE_NAME)
        sealed = staged == version and storage.exists(
            storage.join(self.staging_uri, SEAL_FILE_NAME), within=self.output_uri
        )
        committed = False
        if staged == version and not sealed:
            with contextlib.suppress(FileNotFoundError):
                committed = (
                    json.loads(storage.read_text(manifest_uri, within=self.output_uri)).get("version")
                    == version
                )
        if staged != version or sealed or committed:
            why = (
                "sealed for its commit"
                if sealed
                else "committed"
                if committed
                else f"started afresh (it stages into {staged} now)"
            )
            raise StagingTakenError(
                f"The staging {self.staging_uri} was {why}: this writer's version {version} is no longer "
                "its to write. The job that made this writer has ended; its rows are not staged."
            )

    def read_part(self, part: StagedPart) -> list[StagedRow]:
        """A part's rows as :meth:`write_part` took them (each output row with its ``label``, and its
        engine ``tokens`` where the sidecar has them); its sidecar must list them in file order."""
        if not part.sidecar.get(SOURCES_IN_FILE_ORDER):
            raise ValueError(f"staged part {part.name} does not list its rows in file order.")
        records: dict[str, list[Row]] = {"outputs": [], "errors": []}
        for folder, name in part.sidecar["files"].items():
            part_file = f"{folder}/{name}"
            records[folder] = _decode(
                self._read_file(part_file), self.output_format, part_file, _staged_columns(part, folder)
            )
        ok = [True] * len(records["outputs"]) + [False] * len(records["errors"])
        if len(ok) != len(part.sidecar["sources"]):
            raise ValueError(
                f"staged part {part.name}: {len(ok)} rows in its files, "
                f"{len(part.sidecar['sources'])} in its sidecar."
            )
        labels = part.sidecar.get(LABELS_KEY) or [None] * len(records["outputs"])
        tokens = part.sidecar.get(TOKENS_KEY) or [None] * len(records["outputs"])
        rows = [
            StagedRow(source=source, ok=flag, record=json.dumps(record, ensure_ascii=False))
            for source, flag, record in zip(
                part.sidecar["sources"], ok, records["outputs"] + records["errors"], strict=True
            )
        ]
        for row, label, counts in zip(rows, labels, tokens, strict=False):  # the output rows come first
            row["label"] = label
            if counts is not None:
                row["tokens"] = counts
        return rows

    def conform_parts(self, parts: list[StagedPart]) -> dict[str, list[str]]:
        """Give every Parquet part of an output one schema (:func:`.part_schema.unify`); returns the
        JSON text columns of each folder (none in JSONL, where every value is JSON already). Parts whose
        schema already matches are left alone."""
        if self.output_format != "parquet":
            return {"outputs": [], "errors": []}
        json_columns = {}
        for folder in ("outputs", "errors"):
            typed = [part for part in parts if folder in part.sidecar.get(COLUMNS_KEY, {})]
            target = part_schema.unify(part.sidecar[COLUMNS_KEY][folder] for part in typed)
            _check_width(target, folder)
            arrow_types = self._arrow_types(folder, typed, target)
            _check_width(target, folder, part_schema.target_fields(target, arrow_types))
            for part in typed:
                rewriting = folder in part.sidecar.get(REWRITING_KEY, [])
                if part.sidecar[COLUMNS_KEY][folder] == target and not rewriting:  # also its column order
                    continue
                part_file = f"{folder}/{part.sidecar['files'][folder]}"
                uri = storage.join(self.data_uri, part_file)
                staged = _staged_columns(part, folder)
                table = part_schema.read_parquet(self._read_file(part_file), part_file, staged)
                self._record_columns(part, folder, target, staged, rewriting=True)
                storage.write_bytes(
                    uri,
                    part_schema.encode_parquet(part_schema.conform(table, target, arrow_types)),
                    within=self.output_uri,
                )
                self._record_columns(part, folder, target, staged, rewriting=False)
            json_columns[folder] = [name for name, kind in target.items() if kind == part_schema.JSON_TYPE]
        return json_columns

    def _record_columns(
        self,
        part: StagedPart,
        folder: str,
        columns: dict[str, str],
        staged: list[str] | None,
        rewriting: bool,
    ) -> None:
        """Record in a part's sidecar the columns a commit gives its file, keeping those it was staged
        with: a later commit that sees other parts (a retry staged rows again, and the first copy
        went) takes the output's types from what each file holds now. A file given a column as JSON
        text whose sidecar still said text was taken as matching the output's text column, its values
        committed with their JSON quotes.

        Before the file is rewritten (``rewriting``), then after: a commit that died in between leaves
        the sidecar saying so, and the next rewrites that file whatever its sidecar says."""
        if staged is not None:
            part.sidecar.setdefault(STAGED_COLUMNS_KEY, {}).setdefault(folder, staged)
        part.sidecar[COLUMNS_KEY][folder] = dict(columns)
        marked = [name for name in part.sidecar.get(REWRITING_KEY, []) if name != folder]
        part.sidecar[REWRITING_KEY] = [*marked, folder] if rewriting else marked
        if not part.sidecar[REWRITING_KEY]:
            del part.sidecar[REWRITING_KEY]
        sidecar_uri = storage.join(self.staging_uri, "parts", f"{part.name}.json")
        storage.write_bytes(sidecar_uri, json.dumps(part.sidecar).encode(), within=self.output_uri)

    def _read_file(self, part_file: str) -> bytes:
        """A part's data file (``outputs/<part>.<ext>``), refused unread where it is larger than a part
        may be (:func:`.part_schema.check_file_size`): the staging is writable by whoever can write
        the output, and the committing process reads its parts."""
        return storage.read_bytes(  # its size first: nothing read yet
            storage.join(self.data_uri, part_file),
            self.output_uri,
            lambda size: part_schema.check_file_size(size, part_file),
        )

    def _arrow_types(self, folder: str, parts: list[StagedPart], target: dict[str, str]) -> dict[str, Any]:
        """The Arrow type of each concrete target column, read from the footer of a part that has it."""
        wanted = {name for name, kind in target.items() if kind not in (part_schema.JSON_TYPE, "null")}
        found: dict[str, pa.DataType] = {}
        for part in parts:
            missing = {
                name
                for name in wanted - found.keys()
                if part.sidecar[COLUMNS_KEY][folder].get(name) == target[name]
            }
            if not missing:
                continue
            part_file = f"{folder}/{part.sidecar['files'][folder]}"
            schema = part_schema.read_parquet_schema(self._read_file(part_file), part_file)
            found.update({name: schema.field(name).type for name in missing})
        return found


def _token_pair(tokens: list[int]) -> tuple[int, int]:
    """A staged row's engine ``tokens`` (input, generated) as the part's counts take them."""
    tokens_in, tokens_out = tokens
    return tokens_in, tokens_out
