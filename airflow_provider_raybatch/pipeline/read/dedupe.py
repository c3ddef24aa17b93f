"""Which prepared rows go on to the engine: the first row of each id, and none that an earlier try staged.

Both steps work on Arrow batches in Ray Data's workers, so the work per row is vectorized and nothing
is deserialized per row:

- **Duplicate ids.** Up to :data:`DRIVER_SCAN_MAX_ROWS` rows, the driver streams the ids once (a hash
  shuffle costs ~6 s of Ray Data overhead even on 200 rows, measured on a 2-core machine, which a
  daily job of a few thousand rows should not pay). Above it, the cluster hash-partitions the ids
  (``repartition(keys=["id"])``) and pyarrow groups each partition in C++, so the driver holds
  nothing proportional to rows and nothing runs per id in Python. (Ray Data's
  ``groupby().aggregate()`` is the fallback under a sort shuffle; on Ray 2.57 it aggregates every id
  in Python: 92 s for 1M ids on 2 cores, against 9.4 s partitioned.) Either way the result is the
  first source of each repeated id, in file order, and the workers mark the later copies with one
  broadcast table of those ids. The same pass counts the rows whose id another row has too, rows in
  error included (``rows_duplicate``: the failed-rows thresholds count each id once).
- **Rows staged by an earlier try.** Their sources go to the object store once, as one Arrow array,
  and each worker filters whole batches against it (``pyarrow.compute.is_in``), instead of fetching
  and unpickling the whole set once per row.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_raybatch.pipeline import row_marks
from airflow_provider_raybatch.shared import job_settings
from airflow_provider_raybatch.shared.manifest import DUPLICATE_ID_REASON

if TYPE_CHECKING:
    import ray
    from ray.data import Dataset

#: Up to this many rows the driver finds duplicate ids itself: its memory for them stays bounded
#: (ids only, ~100 MB at this size), and small runs skip a shuffle.
DRIVER_SCAN_MAX_ROWS = 1_000_000
DRIVER_SCAN_MAX_ROWS_ENV = "RAYBATCH_DRIVER_SCAN_MAX_ROWS"
#: The most a job may set it to: past ~10M ids the driver's memory for them nears the 2 GiB it may use.
DRIVER_SCAN_MAX_ROWS_LIMIT = 10_000_000
#: Columns of the table of repeated ids: the id and the source of its first row in file order.
FIRST_SOURCES_SCHEMA = pa.schema([("id", pa.string()), ("first_source", pa.string())])
#: What a partition's grouping gives: its repeated ids, then one row (no id) with the rows of it whose
#: id another row has too (:func:`_repeated_ids`).
_GROUPED_SCHEMA = FIRST_SOURCES_SCHEMA.append(pa.field("rows_repeated", pa.int64()))
#: Ids per hash partition when the cluster finds duplicates (~60 MB of keys), and the most partitions.
ROWS_PER_PARTITION = 250_000
MAX_PARTITIONS = 2_000
_SOURCE = r"^(?P<name>.*):(?P<line>\d+)$"  # every row's source is "<file>:<line>" (see rows.py)
_ORDER_SEPARATOR = "\x00"  # never in a file path, so the order keys sort by file, then line number


def find_first_sources(
    prepared: Dataset, rows_in: int, driver_scan_max_rows: int | None = None
) -> tuple[pa.Table, int, int]:
    """The repeated ids among good rows with the first source of each, the rows already in error, and
    the rows whose id another row has too, less one per id (:func:`.row_marks.first_sources_of_duplicates`).

    :param prepared: the materialized prepared rows (``id``, ``source``, ``error`` columns).
    :param rows_in: how many they are (chooses the driver scan or the cluster's shuffle).
    :param driver_scan_max_rows: the most rows the driver scans (unset: ``RAYBATCH_DRIVER_SCAN_MAX_ROWS``
        in the job's environment, a test's way to take the shuffle on a few rows, else
        :data:`DRIVER_SCAN_MAX_ROWS`).
    """
    if driver_scan_max_rows is None:
        driver_scan_max_rows = configured_driver_scan_max_rows()
    if rows_in <= driver_scan_max_rows:
        first_sources, errors, repeats = _scan_in_driver(prepared)
        return first_sources_table(first_sources), errors, repeats
    return _group_on_cluster(prepared)


def configured_driver_scan_max_rows() -> int:
    """:data:`DRIVER_SCAN_MAX_ROWS`, or the job's ``RAYBATCH_DRIVER_SCAN_MAX_ROWS``."""
    return job_settings.whole_number(
        DRIVER_SCAN_MAX_ROWS_ENV, DRIVER_SCAN_MAX_ROWS, DRIVER_SCAN_MAX_ROWS_LIMIT
    )


def first_sources_table(first_sources: dict[str, str]) -> pa.Table:
    """:func:`.row_marks.first_sources_of_duplicates`' mapping as the table :func:`mark_duplicates` takes."""
    columns = {"id": list(first_sources), "first_source": list(first_sources.values())}
    return pa.table(columns, schema=FIRST_SOURCES_SCHEMA)


def _scan_in_driver(prepared: Dataset) -> tuple[dict[str, str], int, int]:
    columns = prepared.select_columns(["id", "source", "error"])
    batches = columns.iter_batches(batch_format="pyarrow", batch_size=65536)
    names = ("id", "source", "error")
    return row_marks.first_sources_of_duplicates(
        triple
        for batch in batches
        for triple in zip(*(batch.column(c).to_pylist() for c in names), strict=True)
    )


def _group_on_cluster(prepared: Dataset) -> tuple[pa.Table, int, int]:
    keys = prepared.map_batches(_order_keys, batch_format="pyarrow").materialize()
    errors = prepared.count() - int(keys.sum("good") or 0)
    if _hash_shuffle_is_on():
        # Rows of one id land in one block (the hash shuffle never splits its output blocks), and
        # pyarrow groups each block in C++: no step runs per id in Python, on any Ray version.
        by_id = keys.repartition(num_blocks=shuffle_partitions(keys.count()), keys=["id"])
        repeated = by_id.map_batches(repeated_ids_in_partition, batch_format="pyarrow", batch_size=None)
    else:  # a sort-based shuffle, which a job may choose, cannot partition by key: Ray Data's groupby
        from ray.data.aggregate import Count, Min, Sum

        grouped = keys.groupby("id").aggregate(
            Count(alias_name="copies"), Sum("good", alias_name="good"), Min("order", alias_name="first")
        )
        repeated = grouped.map_batches(_repeated_ids, batch_format="pyarrow")
    tables = list(repeated.iter_batches(batch_format="pyarrow", batch_size=None))  # the repeated ids only
    table = pa.concat_tables([_GROUPED_SCHEMA.empty_table(), *(t.cast(_GROUPED_SCHEMA) for t in tables)])
    repeats = int(pc.sum(table.filter(pc.is_null(table["id"]))["rows_repeated"]).as_py() or 0)
    first_sources = table.filter(pc.is_valid(table["id"])).select(FIRST_SOURCES_SCHEMA.names)
    return first_sources.cast(FIRST_SOURCES_SCHEMA), errors, repeats


def shuffle_partitions(rows: int) -> int:
    """Partitions of about :data:`ROWS_PER_PARTITION` ids each: small enough to group in one task's
    memory, enough to spread over the cluster."""
    return max(1, min(MAX_PARTITIONS, -(-rows // ROWS_PER_PARTITION)))


def _hash_shuffle_is_on() -> bool:
    from ray.data import DataContext

    return is_hash_shuffle(DataContext.get_current().shuffle_strategy)


def is_hash_shuffle(strategy: Any) -> bool:  # Any: a ShuffleStrategy, or the string Ray 2.57 keeps as given
    """Whether Ray Data's shuffle strategy can partition by key (the sort shuffles cannot).

    By value, not name: Ray 2.57 stores a strategy set as a string (``RAY_DATA_DEFAULT_SHUFFLE_STRATEGY``)
    as that string, and 2.60's ``HASH_SHUFFLE_V2`` is an alias of ``SHUFFLE_V2``.
    """
    return getattr(strategy, "value", strategy) in {"hash_shuffle", "shuffle_v2", "hash_shuffle_v2"}


def repeated_ids_in_partition(partition: pa.Table) -> pa.Table:
    """The repeated ids of one hash partition (all the copies of an id are in it), with their first
    source, and the count of its rows whose id another row has too (:func:`_repeated_ids`)."""
    grouped = partition.group_by("id").aggregate([("id", "count"), ("good", "sum"), ("order", "min")])
    named = {
        "id": grouped["id"],
        "copies": grouped["id_count"],
        "good": grouped["good_sum"],
        "first": grouped["order_min"],
    }
    return _repeated_ids(pa.table(named))


def _order_keys(batch: pa.Table) -> pa.Table:
    """Each row's id, whether it is good, and for a good row a key that sorts like
    :func:`.row_marks.source_order` and ends in the source. A row in error whose id is its own source
    has no id of its own (:func:`.row_marks.first_sources_of_duplicates`): it is left out."""
    source = pc.cast(batch["source"], pa.string())
    row_id = pc.cast(batch["id"], pa.string())
    good = pc.is_null(batch["error"])
    rows = batch.filter(pc.or_(good, pc.not_equal(row_id, source)))
    good, source = pc.is_null(rows["error"]), pc.cast(rows["source"], pa.string())
    parts = pc.extract_regex(source, _SOURCE)
    name = pc.fill_null(pc.struct_field(parts, "name"), "")
    line = pc.fill_null(pc.utf8_lpad(pc.struct_field(parts, "line"), 20, "0"), "0" * 20)
    order = pc.binary_join_element_wise(name, line, source, _ORDER_SEPARATOR)
    return pa.table(
        {
            "id": pc.cast(rows["id"], pa.string()),
            "order": pc.if_else(good, order, pa.scalar(None, pa.string())),  # a row in error is no first
            "good": pc.cast(good, pa.int64()),
        }
    )


def _repeated_ids(batch: pa.Table) -> pa.Table:
    """From ids grouped with their ``copies`` (every row), ``good`` copies and ``first`` good row's order
    key: each id with more than one good row and the source of its first, then one row with no id
    holding how many rows repeat an id (each id's copies less one)."""
    repeated = batch.filter(pc.greater(batch["good"], 1))
    first = pc.list_element(pc.split_pattern(repeated["first"], _ORDER_SEPARATOR, max_splits=2), 2)
    repeats = int(pc.sum(pc.subtract(batch["copies"], 1)).as_py() or 0) if batch.num_rows else 0
    ids = pa.table(
        {
            "id": repeated["id"],
            "first_source": first,
            "rows_repeated": pa.array([0] * repeated.num_rows, pa.int64()),
        }
    )
    count = pa.table(
        {"id": [None], "first_source": [None], "rows_repeated": [repeats]}, schema=_GROUPED_SCHEMA
    )
    return pa.concat_tables([ids.cast(_GROUPED_SCHEMA), count])


def mark_duplicates(prepared: Dataset, first_sources: pa.Table) -> Dataset:
    """Every good row whose id repeats and that is not the first of it becomes a ``duplicate id`` error."""
    import ray

    if first_sources.num_rows == 0:
        return prepared
    return prepared.map_batches(
        mark_duplicates_in_batch, batch_format="pyarrow", fn_kwargs={"first_sources": ray.put(first_sources)}
    )


def mark_duplicates_in_batch(batch: pa.Table, first_sources: pa.Table | ray.ObjectRef) -> pa.Table:
    if batch.num_rows == 0:
        return batch
    first_sources = _resolved(first_sources)
    index = pc.index_in(pc.cast(batch["id"], pa.string()), value_set=first_sources["id"])
    first = pc.take(first_sources["first_source"], index)
    later_copy = pc.fill_null(
        pc.and_(pc.is_null(batch["error"]), pc.not_equal(first, pc.cast(batch["source"], pa.string()))), False
    )
    if not pc.any(later_copy).as_py():
        return batch
    # Only the later copies go through Python (for repr()): every pass over the lazily marked rows
    # marks its batches again, so the rest of the batch stays in Arrow.
    rows = pc.indices_nonzero(later_copy)
    ids, firsts = pc.take(batch["id"], rows).to_pylist(), pc.take(first, rows).to_pylist()
    reasons = pa.array(
        [f"{DUPLICATE_ID_REASON}: {i!r} first seen at {f}" for i, f in zip(ids, firsts, strict=True)],
        pa.string(),
    )
    errors, mask = (_one_chunk(column) for column in (pc.cast(batch["error"], pa.string()), later_copy))
    marked = pc.replace_with_mask(errors, mask, reasons)
    return batch.set_column(batch.schema.get_field_index("error"), "error", marked)


def _one_chunk(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``replace_with_mask`` takes arrays only, and a table's columns are chunked."""
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def drop_staged(prepared: Dataset, staged_sources: Iterable[str]) -> Dataset:
    """The rows whose source no earlier try staged."""
    import ray

    staged = pa.array(staged_sources, pa.string())
    if len(staged) == 0:
        return prepared
    return prepared.map_batches(
        unstaged_in_batch, batch_format="pyarrow", fn_kwargs={"staged": ray.put(staged)}
    )


def unstaged_in_batch(batch: pa.Table, staged: pa.Array | ray.ObjectRef) -> pa.Table:
    if batch.num_rows == 0:
        return batch
    already = pc.is_in(pc.cast(batch["source"], pa.string()), value_set=_resolved(staged))
    return batch.filter(pc.invert(already))


def _resolved(value: pa.Table | pa.Array | ray.ObjectRef) -> pa.Table | pa.Array:
    """Fetched from the object store once per batch (zero-copy for Arrow data)."""
    if type(value).__name__ == "ObjectRef":
        import ray

        return ray.get(value)
    return value
