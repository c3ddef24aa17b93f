"""The prepared rows a try keeps for a retry (pipeline/read/prepared_cache.py): used only when they are
certainly this input's, never a torn or stale cache, and read back as written on a real local Ray."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from airflow_provider_raybatch.pipeline import credentials, storage
from airflow_provider_raybatch.pipeline.read import prepared_cache
from tests.unit.pipeline.ray_env import run_in_ray_env

DIGEST = "a" * 64
GOOD = {
    "format": 1,
    "input_digest": DIGEST,
    "rows_in": 10,
    "errors": 2,
    "repeated_ids": 1,
    "rows_repeated": 3,
}


def test_a_complete_record_for_this_input_gives_its_counts() -> None:
    assert prepared_cache._counts(GOOD, DIGEST) == {
        "rows_in": 10,
        "errors": 2,
        "repeated_ids": 1,
        "rows_repeated": 3,
    }


@pytest.mark.parametrize(
    "record",
    [
        {**GOOD, "input_digest": "b" * 64},  # another input
        {**GOOD, "format": 2},  # a later layout
        {key: value for key, value in GOOD.items() if key != "errors"},
        {key: value for key, value in GOOD.items() if key != "rows_repeated"},  # an older provider's
        {**GOOD, "rows_in": -1},
        {**GOOD, "rows_in": True},  # JSON true is not a count
        {**GOOD, "rows_in": 10.0},
        {**GOOD, "repeated_ids": "1"},
        {**GOOD, "errors": None},
        [GOOD],
        "prepared",
        None,
    ],
)
def test_any_other_record_is_not_used(record: object) -> None:
    assert prepared_cache._counts(record, DIGEST) is None


def test_the_digest_changes_when_an_input_file_is_rewritten_added_or_removed(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.csv").write_text("id,text\n1,x\n")
    (folder / "notes.txt").write_text("not read")
    extensions = ["csv"]
    first = prepared_cache.input_digest(str(folder), extensions)
    assert prepared_cache.input_digest(str(folder), extensions) == first
    (folder / "notes.txt").write_text("a file the job does not read changed")
    assert prepared_cache.input_digest(str(folder), extensions) == first

    stat = os.stat(folder / "a.csv")
    os.utime(folder / "a.csv", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    rewritten = prepared_cache.input_digest(str(folder), extensions)  # same size, rewritten later
    assert rewritten != first
    (folder / "b.csv").write_text("id,text\n2,y\n")
    added = prepared_cache.input_digest(str(folder), extensions)
    assert added not in (first, rewritten)
    (folder / "b.csv").unlink()
    assert prepared_cache.input_digest(str(folder), extensions) == rewritten
    (folder / "a.csv").write_text("id,text\n1,xy\n")  # another size
    assert prepared_cache.input_digest(str(folder), extensions) != rewritten


def _listed(uri: str, extensions: list[str] | None) -> list[tuple[str, int, int]]:
    """All the digest held before it held more: each file's path, size and modification time."""
    return [(info.path, info.size, info.mtime_ns) for info in storage.input_file_infos(uri, extensions)]


def use_s3_server(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:  # Any: conftest S3Server
    """The job's S3 settings point at the test's S3 server (as the job's credentials would)."""
    settings = {
        "endpoint_url": s3_server.endpoint_url,
        "region": "us-east-1",
        "access_key": s3_server.access_key,
        "secret_key": s3_server.secret_key,
    }
    monkeypatch.setattr(credentials, "_settings", settings)
    monkeypatch.setattr(storage, "_s3_options", None)  # built again from the settings above


def _rewrite_keeping_size_and_mtime(path: Path, content: bytes, *, by_rename: bool) -> None:
    """Rewrite ``path`` with ``content`` (as many bytes as it holds) and set its times back, as
    ``rsync -t`` or ``cp -p`` do: in place (``open(..., "w")``), or as a new file renamed over it."""
    before = os.stat(path)
    assert len(content) == before.st_size
    target = path.with_name(path.name + ".tmp") if by_rename else path
    target.write_bytes(content)
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    if by_rename:
        os.replace(target, path)


@pytest.mark.parametrize("by_rename", [False, True], ids=["in_place", "renamed_over"])
def test_a_file_rewritten_with_as_many_bytes_and_its_mtime_set_back_changes_the_digest(
    tmp_path: Path, by_rename: bool
) -> None:
    """Path, size and modification time are all as they were: the status-change time is not (every
    write and rename sets it, and utime cannot set it back)."""
    folder = tmp_path / "in"
    folder.mkdir()
    path = folder / "a.jsonl"
    path.write_bytes(b'{"id": "a"}\n{"id": "b"}\n')
    first = prepared_cache.input_digest(str(folder), ["jsonl"])
    listed = _listed(str(folder), ["jsonl"])
    # Before Linux 6.13 the kernel stamps ctime from a clock that ticks once a jiffy (up to 10 ms): a
    # rewrite within the tick of the write before it would keep its ctime.
    time.sleep(0.02)
    _rewrite_keeping_size_and_mtime(path, b'{"id": "b"}\n{"id": "a"}\n', by_rename=by_rename)
    assert _listed(str(folder), ["jsonl"]) == listed
    assert prepared_cache.input_digest(str(folder), ["jsonl"]) != first


def test_an_unchanged_input_keeps_its_digest_when_read(tmp_path: Path) -> None:
    """No spurious change: reading the files (their access time) changes nothing the digest holds."""
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.csv").write_text("id,text\n1,x\n")
    (folder / "b.csv").write_text("id,text\n2,y\n")
    first = prepared_cache.input_digest(str(folder), ["csv"])
    time.sleep(0.02)  # a clock tick (see above): a change now would show
    assert [path.read_text() for path in sorted(folder.iterdir())]
    assert prepared_cache.input_digest(str(folder), ["csv"]) == first


@pytest.mark.parametrize("one_object", [False, True], ids=["folder", "one_object"])
def test_an_s3_object_rewritten_with_as_many_bytes_changes_the_digest(
    s3_server: Any,
    monkeypatch: pytest.MonkeyPatch,
    one_object: bool,  # Any: conftest S3Server
) -> None:
    """S3 gives modification times in whole seconds: a same-size rewrite within the second lists as
    the object did. Its ETag differs."""
    client = s3_server.client()
    bucket = f"input-digest-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    use_s3_server(s3_server, monkeypatch)
    uri, extensions = (f"s3://{bucket}/in/a.csv", None) if one_object else (f"s3://{bucket}/in/", ["csv"])
    client.put_object(Bucket=bucket, Key="in/b.csv", Body=b"id,text\n2,y\n")

    for _ in range(5):  # until both writes fall in one second
        client.put_object(Bucket=bucket, Key="in/a.csv", Body=b"id,text\n1,x\n")
        before, first = _listed(uri, extensions), prepared_cache.input_digest(uri, extensions)
        assert prepared_cache.input_digest(uri, extensions) == first  # nothing changed: the same digest
        client.put_object(Bucket=bucket, Key="in/a.csv", Body=b"id,text\n1,z\n")
        if _listed(uri, extensions) == before:
            break
    else:
        pytest.fail("five rewrites in a row listed another modification time: none tests the case")
    assert prepared_cache.input_digest(uri, extensions) != first


@pytest.mark.parametrize(
    ("setting", "rows", "kept"),
    [(None, 19_999, False), (None, 20_000, True), ("0", 1, True), ("0", 0, False), (" 5 ", 5, True)],
)
def test_small_inputs_are_not_kept(
    setting: str | None, rows: int, kept: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if setting is None:
        monkeypatch.delenv(prepared_cache.KEEP_MIN_ROWS_ENV, raising=False)
    else:
        monkeypatch.setenv(prepared_cache.KEEP_MIN_ROWS_ENV, setting)
    assert prepared_cache.worth_keeping(rows) is kept


@pytest.mark.parametrize("value", ["oops", "-1", "2.5", "1e6", "٣", "9" * 40])
def test_a_keep_threshold_that_is_not_a_whole_number_is_refused_naming_the_setting(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(prepared_cache.KEEP_MIN_ROWS_ENV, value)
    with pytest.raises(ValueError, match=f"{prepared_cache.KEEP_MIN_ROWS_ENV}=.*whole number"):
        prepared_cache.worth_keeping(25_000)


def test_an_all_null_column_is_written_as_text() -> None:
    batch = pa.table({"id": ["1", "2"], "error": pa.nulls(2), "prompt": ["p", None]})
    out = prepared_cache._nulls_as_text(batch)
    assert out.schema == pa.schema([("id", pa.string()), ("error", pa.string()), ("prompt", pa.string())])
    assert out.to_pylist() == batch.to_pylist()


@pytest.mark.parametrize(
    ("costs", "runs"),
    [
        ([3, 3, 3, 10, 1, 1], [(0, 2), (2, 3), (3, 4), (4, 6)]),  # 10 alone: a row is never cut
        ([6, 6], [(0, 1), (1, 2)]),  # exactly the bound
        ([1] * 5, [(0, 5)]),
        ([], []),
    ],
)
def test_a_block_is_cut_into_runs_of_rows_within_a_file_cost(
    costs: list[int], runs: list[tuple[int, int]]
) -> None:
    assert prepared_cache._file_runs(np.array(costs, np.int64), 6) == runs


# address="local": a cluster of its own, never one already running on the machine.
_RAY_AND_ROWS = """
import json, os
import pyarrow as pa, pyarrow.parquet as pq
import ray, ray.data
from airflow_provider_raybatch.pipeline import storage
from airflow_provider_raybatch.pipeline.read import prepared_cache
from airflow_provider_raybatch.pipeline.read.prepared_cache import PreparedRows
ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR")
ray.data.DataContext.get_current().enable_progress_bars = False
staging = os.environ["STAGING"]
columns = ("id", "source", "row", "messages", "prompt", "sampling", "request", "error")
def row(n, error=None):
    good = error is None
    return {"id": str(n), "source": f"in.csv:{n + 2}", "row": json.dumps({"n": n, "text": "é\\u2028"}),
            "messages": json.dumps([{"role": "user", "content": f"row {n}"}]) if good else None,
            "prompt": None, "sampling": json.dumps({"max_tokens": 4}) if good else None,
            "request": None, "error": error}
"""
_ON_RAY = (
    _RAY_AND_ROWS
    + """
# Block 1: every row good (its error column is Arrow's null type); block 2: some errors.
blocks = [[row(n) for n in range(0, 40)], [row(n, "missing id" if n % 3 else None) for n in range(40, 70)]]
written = [r for block in blocks for r in block]
dataset = ray.data.from_arrow([pa.Table.from_pylist(block) for block in blocks]).materialize()
out = {}
def read(digest):
    kept = prepared_cache.read(staging, digest, staging)
    if kept is None:
        return None
    return {"rows": sorted(kept.rows.take_all(), key=lambda r: r["source"]), "rows_in": kept.rows_in,
            "errors": kept.errors, "repeated_ids": kept.repeated_ids, "rows_repeated": kept.rows_repeated,
            "reused": kept.reused}
out["before_any_write"] = read("d1")
# A try that died while writing left Parquet files and no record; a stale file of another input too.
os.makedirs(f"{staging}/prepared")
pq.write_table(pa.Table.from_pylist([row(999)]), f"{staging}/prepared/stale.parquet")
out["torn"] = read("d1")
prepared_cache.write(staging, PreparedRows(dataset, len(written), 20, 3, 5), "d1", staging)
out["kept"] = read("d1")
out["other_input"] = read("d2")
record = json.load(open(f"{staging}/prepared.json"))
json.dump({**record, "rows_in": 71}, open(f"{staging}/prepared.json", "w"))
out["count_mismatch"] = read("d1")
open(f"{staging}/prepared.json", "w").write("{not json")
out["unreadable"] = read("d1")
prepared_cache.write(staging, PreparedRows(dataset.limit(0).materialize(), 0, 0, 0, 0), "d3", staging)
out["empty"] = read("d3")
out["written"] = sorted(written, key=lambda r: r["source"])
print(json.dumps(out))
"""
)


@pytest.mark.timeout(300)
def test_kept_rows_are_read_back_as_written_and_never_from_a_torn_or_stale_cache(tmp_path: Path) -> None:
    staging = tmp_path / "_staging" / "run-1"
    staging.mkdir(parents=True)
    out = run_in_ray_env(f"import os; os.environ['STAGING'] = {str(staging)!r}\n" + _ON_RAY)
    assert out["before_any_write"] is None
    assert out["torn"] is None, "Parquet files without prepared.json were taken"
    kept = out["kept"]
    assert kept["rows"] == out["written"]  # the stale file is gone; every value, nulls included
    counts = (kept["rows_in"], kept["errors"], kept["repeated_ids"], kept["rows_repeated"], kept["reused"])
    assert counts == (70, 20, 3, 5, True)
    assert out["other_input"] is None
    assert out["count_mismatch"] is None
    assert out["unreadable"] is None
    assert out["empty"] is None  # an empty input is read again: nothing to keep


# One block, as one input file is read, whose rows cost three times what a file read back may: the bound
# lowered (the write takes it from the driver) instead of a million rows.
_ONE_BLOCK_PAST_A_FILE = (
    _RAY_AND_ROWS
    + """
import logging
from airflow_provider_raybatch.pipeline.read import row_costs, staged_parquet
warnings = []
class Warnings(logging.Handler):
    def emit(self, record):
        warnings.append(record.getMessage())
logging.getLogger("airflow_provider_raybatch.pipeline").addHandler(Warnings())
written = [row(n, "missing id" if n % 7 == 0 else None) for n in range(400)]
block = pa.Table.from_pylist(written)
dataset = ray.data.from_arrow(block).materialize()
staged_parquet.FILE_COST_BYTES = int(row_costs.row_costs(block).held.sum()) // 3
kept_it = prepared_cache.write(staging, PreparedRows(dataset, 400, 58, 0, 0), "d1", staging)
folder = f"{staging}/prepared"
files = sorted(os.listdir(folder))
def read_cost(name):
    table = pq.read_table(f"{folder}/{name}")
    return int(row_costs.row_costs(table).held.sum())
kept = prepared_cache.read(staging, "d1", staging)
out = {"kept_it": kept_it, "bound": staged_parquet.FILE_COST_BYTES, "files": len(files),
       "costs": [read_cost(name) for name in files], "warnings": warnings[:]}
out["kept"] = None if kept is None else sorted(kept.rows.take_all(), key=lambda r: int(r["id"]))
# The read side still refuses a file past the bound, planted among the ones the write cut.
pq.write_table(block, f"{folder}/planted.parquet")
out["planted_taken"] = prepared_cache.read(staging, "d1", staging) is not None
out["planted_warning"] = warnings[-1]
out["written"] = written
print(json.dumps(out))
"""
)


@pytest.mark.timeout(300)
def test_one_block_past_what_a_file_may_cost_is_kept_in_files_a_retry_reads_back(tmp_path: Path) -> None:
    """One input file is one Ray Data block, and Ray Data writes a file per block: at a million rows
    that file cost more than a file read back from the staging may (``FILE_COST_BYTES``), so no retry
    ever used the cache. The write cuts each block into files within what the read allows."""
    staging = tmp_path / "_staging" / "run-1"
    staging.mkdir(parents=True)
    out = run_in_ray_env(f"import os; os.environ['STAGING'] = {str(staging)!r}\n" + _ONE_BLOCK_PAST_A_FILE)
    assert out["kept_it"] is True
    assert out["kept"] is not None, f"the kept rows were not read back: {out['warnings']}"
    assert out["kept"] == out["written"]
    assert out["files"] >= 3
    assert all(cost <= out["bound"] for cost in out["costs"]), (out["costs"], out["bound"])
    assert out["planted_taken"] is False, "a file past the bound was read back"
    assert "planted.parquet: its first " in out["planted_warning"]
    assert f"more than {out['bound']:,} bytes once read" in out["planted_warning"]
