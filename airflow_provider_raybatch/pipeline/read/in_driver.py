"""A small input read and prepared in the job's driver, by the steps Ray Data's tasks run on a large one.

A job's read and prepare through Ray Data (:func:`..run._prepared_rows`) costs each new job the start of
its read tasks' worker processes: 3.6-5.8 s of a warm job's 12-16 s from submit to its first row on a
GPU host (bench/RESULTS.md section 13), while parsing and preparing 2,000 rows takes ~0.1 s in one
process. Up to :data:`DRIVER_READ_MAX_BYTES` of input (and :data:`DRIVER_READ_MAX_ROWS` rows) the driver
does it itself: the same :func:`.row_steps.parse_file_row` and :func:`.row_steps.prepare_row`, the same
duplicate scan, so each row comes out as the tasks make it (tests/unit/pipeline/test_in_driver.py
compares them on messy inputs). The rows then go to the object store as one Arrow block, with its
metadata made here (``ray.data.from_blocks``), and the engine stage reads them from there. A larger
input, or one with images (each row may fetch one), goes through Ray Data's tasks, which read files in
parallel and never hold the whole input in one process.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from airflow_provider_raybatch.pipeline import job_settings, row_steps, storage
from airflow_provider_raybatch.pipeline.read import dedupe
from airflow_provider_raybatch.pipeline.read.prepared_cache import PreparedRows
from airflow_provider_raybatch.specs import BatchInferenceSpec

log = logging.getLogger("airflow_provider_raybatch.pipeline")

#: Up to this many bytes of input files the driver reads and prepares them itself. Its memory for them
#: is a few times this (the prepared rows hold each row's JSON and its prompt).
DRIVER_READ_MAX_BYTES = 32 * 1024 * 1024
DRIVER_READ_MAX_BYTES_ENV = "RAYBATCH_DRIVER_READ_MAX_BYTES"
#: The most a job may set it to: past 1 GiB one process holding every prepared row nears the driver's
#: memory, and Ray Data's parallel read is the faster anyway.
DRIVER_READ_MAX_BYTES_LIMIT = 1024 * 1024 * 1024
#: A small file of very short rows can still be millions of rows (``{}`` is three bytes): past this many
#: the driver stops and Ray Data's tasks read the input instead.
DRIVER_READ_MAX_ROWS = 200_000
#: Every prepared column is text or null (:func:`.row_steps.prepare_row`).
PREPARED_SCHEMA = pa.schema([(name, pa.string()) for name in row_steps.PREPARED_COLUMNS])


class _TooManyRows(Exception):
    """The input has more rows than the driver reads itself."""


def configured_max_bytes() -> int:
    """:data:`DRIVER_READ_MAX_BYTES`, or the job's ``RAYBATCH_DRIVER_READ_MAX_BYTES`` (0: never)."""
    return job_settings.whole_number(
        DRIVER_READ_MAX_BYTES_ENV, DRIVER_READ_MAX_BYTES, DRIVER_READ_MAX_BYTES_LIMIT
    )


def prepared_rows(spec: BatchInferenceSpec, max_rows: int = DRIVER_READ_MAX_ROWS) -> PreparedRows | None:
    """Every input row read, prepared and marked where its id repeats, as :func:`..run._prepared_rows`
    gives them; None when the input is for Ray Data's tasks (too large, or with images)."""
    if spec.image_column:
        return None
    extensions = storage.extensions_for(spec.input_uri, spec.resolved_input_format)
    files = storage.input_file_sizes(spec.input_uri, extensions)
    if sum(size for _, size in files) > configured_max_bytes():
        return None
    clock = time.perf_counter()
    try:
        prepared = _limited(_prepared(spec, [path for path, _ in files]), max_rows)
    except _TooManyRows:
        log.info("The input has more than %d rows: Ray Data's tasks read it.", max_rows)
        return None
    import ray.data

    first_sources, errors = row_steps.first_sources_of_duplicates(
        (row["id"], row["source"], row["error"]) for row in prepared
    )
    # from_blocks, not from_arrow: from_arrow asks a Ray task for the table's metadata, and a new job's
    # first task waits for a worker process to start (0.7-2 s on a 2-core VM), which is what this avoids.
    rows = ray.data.from_blocks([pa.Table.from_pylist(prepared, schema=PREPARED_SCHEMA)])
    if first_sources:
        rows = dedupe.mark_duplicates(rows, dedupe.first_sources_table(first_sources))
    log.info("Read and prepared %d rows of %d file(s) in the driver (%.2f s).", len(prepared), len(files),
             time.perf_counter() - clock)  # fmt: skip
    return PreparedRows(rows, len(prepared), errors, len(first_sources))


def _prepared(spec: BatchInferenceSpec, paths: list[str]) -> Iterator[dict[str, Any]]:  # Any: text or None.
    filesystem, _ = storage.filesystem(spec.input_uri)
    binary_columns = (spec.image_column,) if spec.image_column else ()
    for path in paths:
        with filesystem.open_input_stream(path) as stream:
            file_row = {"path": path, "bytes": stream.read()}  # Ray Data's read_binary_files row
        for record in row_steps.parse_file_row(
            file_row, spec.input_uri, spec.resolved_input_format, binary_columns, spec.id_column
        ):
            yield row_steps.prepare_row(record, spec)


def _limited(prepared: Iterator[dict[str, Any]], max_rows: int) -> list[dict[str, Any]]:  # Any: text or None.
    rows: list[dict[str, Any]] = []  # Any: text or None
    for row in prepared:
        if len(rows) == max_rows:
            raise _TooManyRows
        rows.append(row)
    return rows
