"""Duplicate ids and the resume filter (pipeline/read/dedupe.py): the vectorized batch steps against the
row-by-row reference (property-based), and both ways of finding duplicates on a real local Ray."""

from __future__ import annotations

import pyarrow as pa
import pytest

try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:  # not importorskip: without hypothesis these tests must fail, not vanish
    given = settings = st = None  # type: ignore[assignment]

from airflow_provider_raybatch.pipeline import row_marks
from airflow_provider_raybatch.pipeline.read import dedupe
from tests.unit.pipeline.ray_env import run_in_ray_env

PREPARED_SCHEMA = pa.schema([(name, pa.string()) for name in ("id", "source", "error", "row")])


def _reference_marks(rows: list[dict]) -> list[str | None]:
    """The row-by-row rule the pipeline had before: each later copy of a good row's id is an error."""
    first, _, _ = row_marks.first_sources_of_duplicates((r["id"], r["source"], r["error"]) for r in rows)
    marked = []
    for row in rows:
        source = first.get(row["id"])
        duplicate = row["error"] is None and source is not None and source != row["source"]
        marked.append(f"duplicate id: {row['id']!r} first seen at {source}" if duplicate else row["error"])
    return marked


def _reference_rows_repeated(rows: list[dict]) -> int:
    """``rows_in`` less the distinct rows: rows of one id count once, good or failed; a row in error
    whose id is its own source (it has none) is a row apart, whatever id another row has."""
    keys = [
        ("row", r["source"]) if r["error"] is not None and r["id"] == r["source"] else ("id", r["id"])
        for r in rows
    ]
    return len(keys) - len(set(keys))


def _grouped_in_arrow(table: pa.Table) -> pa.Table:
    """What Ray Data's groupby().aggregate(Count, Sum, Min) computes, done by pyarrow on one table."""
    keys = dedupe._order_keys(table)
    grouped = keys.group_by("id").aggregate([("id", "count"), ("good", "sum"), ("order", "min")])
    grouped = grouped.rename_columns(
        {"id_count": "copies", "good_sum": "good", "order_min": "first", "id": "id"}
    )
    return dedupe._repeated_ids(grouped)


def _split(grouped: pa.Table) -> tuple[pa.Table, int]:
    """A grouping's repeated ids (its first sources) and its count of rows that repeat an id."""
    ids = grouped.filter(pa.compute.is_valid(grouped["id"])).select(["id", "first_source"])
    return ids, sum(grouped.filter(pa.compute.is_null(grouped["id"]))["rows_repeated"].to_pylist())


if st is not None:
    # "x.csv:1": an id that reads as another row's source (an id-less row's is its source)
    _ids = st.sampled_from(["a", "b", "c", "d'quote", "é", "10", "1", "x.csv:1"])
    _errors = st.one_of(st.none(), st.just("malformed JSON: line 3"), st.just("missing id"))
    _row = st.tuples(
        _ids, st.sampled_from(["x.csv", "dir/y.jsonl", "z:odd.jsonl"]), st.integers(1, 2000), _errors
    )
    # A "missing id" row (and a line that is no row) is named by its source, as prepare_row names it.
    _rows = st.lists(_row, max_size=60, unique_by=lambda r: (r[1], r[2])).map(
        lambda rows: [
            {"id": f"{f}:{n}" if e == "missing id" else i, "source": f"{f}:{n}", "error": e, "row": "{}"}
            for i, f, n, e in rows
        ]
    )
else:
    _rows = None


def _needs_hypothesis() -> None:
    if st is None:
        pytest.fail("hypothesis is missing: install the test extra (pip install -e '.[test]')")


def test_hypothesis_is_installed() -> None:
    _needs_hypothesis()


if st is not None:

    @settings(max_examples=300, deadline=None)
    @given(_rows, st.integers(1, 7))
    def test_marking_in_batches_matches_the_row_by_row_rule(rows: list[dict], batch_rows: int) -> None:
        """Any split into batches, either way of finding the first sources: the same errors, row by row."""
        expected = _reference_marks(rows)
        table = pa.Table.from_pylist(rows, schema=PREPARED_SCHEMA)
        first, errors, repeats = row_marks.first_sources_of_duplicates(
            (r["id"], r["source"], r["error"]) for r in rows
        )
        assert errors == sum(r["error"] is not None for r in rows)
        assert repeats == _reference_rows_repeated(rows)
        partitioned = dedupe.repeated_ids_in_partition(dedupe._order_keys(table))
        for grouped in (_grouped_in_arrow(table), partitioned):
            assert _split(grouped)[1] == repeats
        for first_sources in (
            dedupe.first_sources_table(first),
            *(_split(g)[0] for g in (_grouped_in_arrow(table), partitioned)),
        ):
            assert dict(zip(*first_sources.to_pydict().values(), strict=True)) == first
            marked = []
            for start in range(0, max(len(rows), 1), batch_rows):
                batch = dedupe.mark_duplicates_in_batch(table.slice(start, batch_rows), first_sources)
                marked += batch["error"].to_pylist()
            assert marked == expected
            kept = [r["id"] for r, error in zip(rows, marked, strict=True) if error is None]
            assert len(kept) == len(set(kept))  # every good id once

    @settings(max_examples=200, deadline=None)
    @given(_rows, st.data())
    def test_the_resume_filter_drops_exactly_the_staged_sources(
        rows: list[dict], data: st.DataObject
    ) -> None:
        sources = [r["source"] for r in rows]
        staged = data.draw(st.lists(st.sampled_from(sources) if sources else st.nothing(), unique=True))
        staged += ["elsewhere.csv:1"]  # a staged source no input row has (an input file since edited)
        table = pa.Table.from_pylist(rows, schema=PREPARED_SCHEMA)
        kept = dedupe.unstaged_in_batch(table, pa.array(staged, pa.string()))
        assert kept["source"].to_pylist() == [s for s in sources if s not in set(staged)]


def test_an_all_null_error_column_takes_duplicate_reasons() -> None:
    """A block whose rows are all good has an error column of Arrow's null type."""
    table = pa.table({"id": ["a", "a"], "source": ["f.csv:2", "f.csv:10"], "error": pa.nulls(2)})
    first = dedupe.first_sources_table({"a": "f.csv:2"})
    assert dedupe.mark_duplicates_in_batch(table, first)["error"].to_pylist() == [
        None,
        "duplicate id: 'a' first seen at f.csv:2",
    ]


class _Strategy:
    """A stand-in for Ray Data's ShuffleStrategy enum member (its ``value``)."""

    def __init__(self, value: str) -> None:
        self.value = value


@pytest.mark.parametrize(
    ("strategy", "hashed"),
    [
        (_Strategy("hash_shuffle"), True),
        (_Strategy("shuffle_v2"), True),
        ("hash_shuffle", True),  # Ray 2.57 keeps RAY_DATA_DEFAULT_SHUFFLE_STRATEGY as the string given
        ("shuffle_v2", True),
        (_Strategy("sort_shuffle_pull_based"), False),
        ("sort_shuffle_push_based", False),
        (_Strategy("gpu_shuffle"), False),
    ],
)
def test_only_hash_shuffles_take_the_partitioned_path(strategy: object, hashed: bool) -> None:
    assert dedupe.is_hash_shuffle(strategy) is hashed


# address="local": a cluster of its own, never one already running on the machine.
_ON_RAY = """
import json, random
import ray, ray.data
from airflow_provider_raybatch.pipeline import row_marks
from airflow_provider_raybatch.pipeline.read import dedupe
ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR")
ray.data.DataContext.get_current().enable_progress_bars = False
random.seed(7)
rows = []
for file in ("b.csv", "a.jsonl", "c.csv"):
    for line in range(1, 1501):
        error = "malformed JSON: x" if random.random() < 0.05 else None
        row_id = str(random.randrange(3000))
        rows.append({"id": row_id, "source": f"{file}:{line}", "error": error, "row": "{}"})
random.shuffle(rows)
prepared = ray.data.from_items(rows, override_num_blocks=12).materialize()
results = {}
dedupe.ROWS_PER_PARTITION = 350  # ~12 hash partitions, so an id's copies must meet across blocks
sort_shuffle = ray.data.context.ShuffleStrategy.SORT_SHUFFLE_PULL_BASED
for name, limit in (("driver", 10**9), ("cluster", 0), ("cluster_sort_shuffle", 0)):
    if name == "cluster_sort_shuffle":  # a job that chose a sort shuffle takes Ray Data's groupby
        ray.data.DataContext.get_current().shuffle_strategy = sort_shuffle
    first, errors, repeats = dedupe.find_first_sources(prepared, len(rows), driver_scan_max_rows=limit)
    marked = dedupe.mark_duplicates(prepared, first)
    staged = [r["source"] for r in rows[:2000]]
    todo = dedupe.drop_staged(marked, staged)
    results[name] = {"first": dict(zip(*first.to_pydict().values())), "errors": errors, "repeats": repeats,
                     "marked": sorted((r["source"], r["error"]) for r in marked.take_all()),
                     "todo": sorted(r["source"] for r in todo.take_all())}
triples = ((r["id"], r["source"], r["error"]) for r in rows)
reference, ref_errors, ref_repeats = row_marks.first_sources_of_duplicates(triples)
print(json.dumps({"results": results, "reference": reference, "ref_errors": ref_errors, "staged": staged,
                  "ref_repeats": ref_repeats, "sources": sorted(r["source"] for r in rows)}))
"""


@pytest.mark.timeout(300)
def test_the_driver_scan_and_the_cluster_shuffle_find_the_same_duplicates_on_ray() -> None:
    """4,500 rows in 12 blocks, ~1,500 repeated ids across three files: the cluster's hash partitions
    (taken above DRIVER_SCAN_MAX_ROWS), Ray Data's groupby (under a sort shuffle) and the driver's scan
    agree with the reference, and resume keeps the rest."""
    out = run_in_ray_env(_ON_RAY)
    driver, cluster = out["results"]["driver"], out["results"]["cluster"]
    assert len(out["reference"]) > 500
    for result in (driver, cluster, out["results"]["cluster_sort_shuffle"]):
        assert result["first"] == out["reference"]
        assert result["errors"] == out["ref_errors"]
        assert result["repeats"] == out["ref_repeats"] > 1500  # ids of failed rows repeat too
        assert result["todo"] == sorted(set(out["sources"]) - set(out["staged"]))
    assert driver["marked"] == cluster["marked"] == out["results"]["cluster_sort_shuffle"]["marked"]
    reasons = [error for _, error in driver["marked"] if error and error.startswith("duplicate id")]
    assert len(reasons) == 4500 - out["ref_errors"] - len({s for s, e in driver["marked"] if e is None})
