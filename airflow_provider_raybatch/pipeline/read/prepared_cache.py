"""A try's prepared rows, kept in its staging, so that a retry reads them back instead of the input.

Before its engine is fed, a job reads, parses and prepares every input row and marks repeated ids.
At 2,000,000 rows in one CSV that took 217.6 s on the H100 host (bench/RESULTS.md 7e): one task
parses and prepares a file, and the duplicate scan is a shuffle. A retry after a crash paid all of it
again, though its rows are the same. So the first try writes its prepared rows, duplicates already
marked, as Parquet under ``_staging/<run_key>/prepared/`` (each block in parallel, cut into files that
each cost at most half of what a file read back may: :func:`write`), then ``prepared.json`` last; a
retry that finds both reads the Parquet back in parallel.

A cache is used only when it is certainly this input's:

- the staging belongs to one spec (:func:`..stage.commit.open_staging_parts` discards another
  spec's, with everything in it);
- ``prepared.json`` holds the digest of what the rows were prepared from (the run's
  :class:`..stage.binding.RunBinding`: the input's listing, each file's path, size, modification
  time and what changes with its bytes (:func:`..storage.input_file_stamps`); the code, preprocess
  included; the model, whose tokenizer and chat template prepare them) and must match the run now:
  a file rewritten, added or removed between tries, or a preprocess fixed behind the same name,
  means the input is read and prepared again;
- a try that died while writing leaves no ``prepared.json`` (it is written last, and removed before a
  write starts): such a cache is ignored and written again;
- the row count in ``prepared.json`` must be the Parquet's own;
- every Parquet file's Arrow types are on :mod:`.arrow_types`' allowlist, and its rows are read
  within the input reader's bounds (:mod:`.staged_parquet`): the staging is writable by whoever can
  write the output, and a planted file's values must not run code, nor decode to gigabytes, when read.

The cache goes with the staging when the run commits (:func:`..stage.commit.publish`). It is an
optimisation only: failing to write or read it is logged and the job goes on from the input.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from airflow_provider_raybatch.pipeline import storage
from airflow_provider_raybatch.pipeline.read import row_costs, staged_parquet
from airflow_provider_raybatch.shared import job_settings
from airflow_provider_raybatch.shared.json_types import JsonValue

if TYPE_CHECKING:
    import numpy as np
    import pyarrow.fs
    from ray.data import Dataset

log = logging.getLogger("airflow_provider_raybatch.pipeline")

#: Below this many rows a try keeps nothing: preparing them again costs a retry a second or two, about
#: what writing them costs every first try. ``RAYBATCH_KEEP_PREPARED_MIN_ROWS`` in the job's
#: environment changes it (the tests keep 400 rows).
KEEP_MIN_ROWS = 20_000
KEEP_MIN_ROWS_ENV = "RAYBATCH_KEEP_PREPARED_MIN_ROWS"
CACHE_FOLDER = "prepared"
CACHE_RECORD = "prepared.json"
_RECORD_FORMAT = 1
_COUNT_KEYS = ("rows_in", "errors", "repeated_ids", "rows_repeated")


@dataclass(frozen=True)
class PreparedRows:
    """Every input row prepared, with repeated ids marked (see :func:`..run._prepared_rows`).

    :param rows: the rows (``id``, ``source``, ``row``, ``messages``, ``prompt``, ``sampling``,
        ``request``, ``error``: text or null).
    :param rows_in: how many rows the input had.
    :param errors: how many rows were in error before the duplicate scan.
    :param repeated_ids: how many ids appear more than once among good rows.
    :param rows_repeated: how many rows have an id another row has too, good or not, less one per id
        (``rows_in`` less the distinct rows: the manifest's ``rows_duplicate``).
    :param reused: whether these rows were read from an earlier try's cache instead of the input.
    """

    rows: Dataset
    rows_in: int
    errors: int
    repeated_ids: int
    rows_repeated: int
    reused: bool = False


def input_digest(input_uri: str, extensions: list[str] | None) -> str:
    """A digest of the files the job reads that changes whenever one of them may have changed: added,
    removed, or rewritten, in place too with as many bytes and its modification time set back
    (:func:`..storage.input_file_stamps`). Their content is not read."""
    stamps = storage.input_file_stamps(input_uri, extensions)
    return hashlib.sha256(json.dumps([input_uri, stamps]).encode()).hexdigest()


def read(staging_uri: str, digest: str, within: str) -> PreparedRows | None:
    """The prepared rows an earlier try of this staging kept for this input, or None.

    :param within: the output folder of the staging: on local disk no link below it is followed
        (:mod:`...shared.local_tree`), and a link on the way makes the cache unused.
    """
    import ray.data

    record_uri = storage.join(staging_uri, CACHE_RECORD)
    try:
        if not storage.exists(record_uri, within=within):
            return None
        record = json.loads(storage.read_text(record_uri, within=within))
    except (OSError, ValueError) as err:
        log.warning("Ignoring the prepared rows an earlier try kept: %s: %s", CACHE_RECORD, err)
        return None
    counts = _counts(record, digest)
    if counts is None or counts["rows_in"] == 0:
        log.info(
            "The prepared rows an earlier try kept are not for these input files (or not a whole "
            "record); reading the input."
        )
        return None
    folder = storage.join(staging_uri, CACHE_FOLDER)
    filesystem, _ = storage.filesystem(folder)
    try:
        files = _checked_files(folder, within)
        # Read here, whole: a file that cannot be read falls back to the input now, not later in the
        # engine's dataset, where it would fail every retry the same way.
        rows = ray.data.read_parquet(files, filesystem=filesystem, file_extensions=None).materialize()
        cached_rows = rows.count()
    except Exception as err:  # noqa: BLE001 - a cache that cannot be read is read again from the input
        log.warning("Ignoring the prepared rows an earlier try kept at %s: %s", folder, err)
        return None
    if cached_rows != counts["rows_in"]:
        log.warning(
            "Ignoring the prepared rows an earlier try kept at %s: %d rows, %s says %d.",
            folder,
            cached_rows,
            CACHE_RECORD,
            counts["rows_in"],
        )
        return None
    return PreparedRows(
        rows,
        counts["rows_in"],
        counts["errors"],
        counts["repeated_ids"],
        counts["rows_repeated"],
        reused=True,
    )


def _checked_files(folder: str, within: str) -> list[str]:
    """Every file of the cache folder, once each one is known to be read within bounds
    (:mod:`.staged_parquet`: its Arrow types allowed, its pages and what its rows cost once read).

    The folder is in the output's staging, which whoever can write the output can write too: a planted
    file could hold a type whose values run code when read, or a few KiB that decode to gigabytes in
    the workers that read it. Ray reads exactly the files checked. Each is read here a batch at a time,
    keeping none; one whose bytes alone pass the bound is not read at all. On local disk no link
    below the output folder ``within`` is followed or listed (:func:`..storage.list_files`).

    :raises ValueError: a file passes a bound; the message names it and the bound.
    :raises OSError: a folder on the way is a link (:class:`...shared.local_tree.LinkInOutputError`).
    """
    paths = storage.list_files(folder, within=within)
    for path in paths:

        def check_size(size: int, path: str = path) -> None:
            if size > staged_parquet.FILE_COST_BYTES:
                raise staged_parquet.StagedParquetTooLargeError(
                    f"{path}: {size:,} bytes, more than a file read back from the staging may take "
                    f"once read ({staged_parquet.FILE_COST_BYTES:,})"
                )

        data = storage.read_bytes(storage.listed_uri(folder, path), within, check_size)
        try:
            staged_parquet.check_cost(data)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from err
    return paths


def _counts(record: JsonValue, digest: str) -> dict[str, int] | None:
    """The record's counts when it is a complete record for ``digest``, else None."""
    if not isinstance(record, dict) or record.get("format") != _RECORD_FORMAT:
        return None
    if record.get("input_digest") != digest:
        return None
    counts = {key: record.get(key) for key in _COUNT_KEYS}
    if not all(type(value) is int and value >= 0 for value in counts.values()):
        return None
    return counts  # type: ignore[return-value]


def worth_keeping(rows_in: int) -> bool:
    """Whether a try of ``rows_in`` rows keeps them for a retry (:data:`KEEP_MIN_ROWS`)."""
    return rows_in > 0 and rows_in >= keep_min_rows()


def keep_min_rows() -> int:
    """:data:`KEEP_MIN_ROWS`, or the job's ``RAYBATCH_KEEP_PREPARED_MIN_ROWS``."""
    return job_settings.whole_number(KEEP_MIN_ROWS_ENV, KEEP_MIN_ROWS, maximum=10**12)


def write(staging_uri: str, prepared: PreparedRows, digest: str, within: str) -> bool:
    """Keep ``prepared`` in the staging for a retry: the Parquet files first, then the record. An
    empty input keeps nothing (a retry reads it again at no cost). Returns whether they were kept.

    :param within: the output folder of the staging: on local disk no link below it is followed
        (:mod:`...shared.local_tree`): a link on the way (the staging swapped for a link while the input was
        read) keeps nothing, deleting and writing nothing through it.
    """
    record_uri = storage.join(staging_uri, CACHE_RECORD)
    folder = storage.join(staging_uri, CACHE_FOLDER)
    try:
        storage.delete_file(record_uri, within=within)  # first: no record ever names a folder being rewritten
        storage.delete_tree(folder, within=within)  # what a try that died while writing left
        if not prepared.rows_in:
            return False
        storage.make_folders(folder, within=within)  # a link on the way refuses before Ray writes
        filesystem, path = storage.filesystem(folder)
        # Taken here, in the driver, and shipped: the bound the read charges with is the driver's too.
        most_cost = staged_parquet.FILE_COST_BYTES // 2
        files = prepared.rows.map_batches(
            _write_block,
            batch_size=None,  # a whole block at a time: a file per block where its rows cost little
            batch_format="pyarrow",
            fn_kwargs={"folder": path, "filesystem": filesystem, "most_cost": most_cost},
        )
        # One row a block: summed here, not with Dataset.sum (an aggregation: a shuffle's tasks and actors).
        rows_written = sum(int(row["rows"]) for row in files.take_all())
        if rows_written != prepared.rows_in:
            raise ValueError(f"{rows_written} rows were written of {prepared.rows_in}")
        record = {"format": _RECORD_FORMAT, "input_digest": digest}
        record |= {
            "rows_in": prepared.rows_in,
            "errors": prepared.errors,
            "repeated_ids": prepared.repeated_ids,
            "rows_repeated": prepared.rows_repeated,
        }
        storage.write_text(record_uri, json.dumps(record), within=within)
    except Exception as err:  # noqa: BLE001 - only a retry's speed depends on it
        log.warning(
            "Could not keep the prepared rows for a retry at %s (a retry reads the input again): %s: %s",
            folder,
            type(err).__name__,
            err,
        )
        with contextlib.suppress(OSError):  # a link on the way: nothing was written through it
            storage.delete_file(record_uri, within=within)
        return False
    return True


def _write_block(block: pa.Table, folder: str, filesystem: pyarrow.fs.FileSystem, most_cost: int) -> pa.Table:
    """Write one block's rows as Parquet files in ``folder``, cut where their rows would cost more than
    ``most_cost`` once read back (charged as :func:`.staged_parquet.check_cost` charges them:
    :func:`.row_costs.row_costs`), and give the rows written (a one-row table).

    Ray Data's writers write a file per block, and one input file is one block: at 832,470 rows such a
    file cost more than the 1 GiB a file read back may, and no retry ever used the cache. ``most_cost``
    is half that bound: the reader charges a text column it reads as a dictionary 8 B a row more (its
    index), less than any value costs here.
    """
    import pyarrow.parquet as pq

    block = _nulls_as_text(block)
    name = uuid.uuid4().hex  # a task retried writes other files: the read then finds too many rows
    for index, (start, stop) in enumerate(_file_runs(row_costs.row_costs(block).held, most_cost)):
        # A page closed after each value, not each 1,024 (pyarrow's default): long rows would make pages
        # past what a retry reads back (staged_parquet), and the cache would never be used.
        pq.write_table(
            block.slice(start, stop - start),
            f"{folder}/{name}-{index:06d}.parquet",
            filesystem=filesystem,
            write_batch_size=1,
        )
    return pa.table({"rows": [block.num_rows]})


def _file_runs(costs: np.ndarray, most_cost: int) -> list[tuple[int, int]]:
    """Consecutive rows, as ``(start, stop)``, each run costing at most ``most_cost`` (``costs`` a row);
    a row that costs more alone is a run of its own."""
    import numpy as np

    ends = np.cumsum(costs)
    runs = []
    start = 0
    while start < len(costs):
        before = int(ends[start - 1]) if start else 0
        stop = max(int(np.searchsorted(ends, before + most_cost, side="right")), start + 1)
        runs.append((start, stop))
        start = stop
    return runs


def _nulls_as_text(batch: pa.Table) -> pa.Table:
    """A column that is all null in this block (Arrow's null type) as text, as it is in other blocks:
    the Parquet files of one folder must agree on their schema to be read back as one dataset."""
    for index, field in enumerate(batch.schema):
        if pa.types.is_null(field.type):
            batch = batch.set_column(index, field.name, batch.column(index).cast(pa.string()))
    return batch
