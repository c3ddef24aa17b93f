"""A try's prepared rows planted in a run's staging folder are checked within bounds before Ray reads
them, or not used.

The prepared cache (pipeline/read/prepared_cache.py) is Parquet under ``_staging/<run_key>/prepared/``,
which whoever can write the output can write too. Its types were checked, not what it decodes to: a
1.5 KB file whose 32 rows each name one 32 MiB dictionary value went to Ray's ``read_parquet`` as it
was, 1 GiB of text once decoded in the workers that read it and every stage after. Each cache file is
now read as an input file is, a batch at a time (pipeline/read/staged_parquet.py), and one whose rows
cost more than a file read back may is not used: the job logs why and reads its input again.

Ray's reader is stood in for here (no Ray cluster is started): it records the files it was given.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

#: What the process checking the cache may grow by while it refuses the planted file.
PEAK_GROWTH_LIMIT_MIB = 150

#: Writes a cache of FILE (one Parquet file) under STAGING, reads it with Ray's reader stood in, and
#: says whether it was used, what Ray was given, the warnings and the growth of the process.
_READ_CACHE = """
import json, logging, os, resource, sys, types
import pyarrow.parquet as pq

given = []
class _Dataset:
    def __init__(self, files):
        self.files = files
    def materialize(self):
        return self
    def count(self):
        return sum(pq.ParquetFile(file).metadata.num_rows for file in self.files)
def read_parquet(files, filesystem=None, file_extensions=None):
    given.extend(files)
    return _Dataset(files)
ray = types.ModuleType("ray")
ray.data = types.ModuleType("ray.data")
ray.data.read_parquet = read_parquet
sys.modules.update({"ray": ray, "ray.data": ray.data})

from airflow_provider_raybatch.pipeline.read import prepared_cache
warnings = []
class Keep(logging.Handler):
    def emit(self, record):
        warnings.append(record.getMessage())
logging.getLogger("airflow_provider_raybatch.pipeline").addHandler(Keep())
staging = os.environ["STAGING"]
os.makedirs(f"{staging}/prepared")
os.rename(os.environ["FILE"], f"{staging}/prepared/part-0.parquet")
rows = int(os.environ["ROWS"])
counts = {"rows_in": rows, "errors": 0, "repeated_ids": 0, "rows_repeated": 0}
record = {"format": 1, "input_digest": "d1", **counts}
with open(f"{staging}/prepared.json", "w") as file:
    json.dump(record, file)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
kept = prepared_cache.read(staging, "d1", staging)
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024
print(json.dumps({"kept": kept is not None, "given": given, "warnings": warnings, "grown_mib": grown}))
"""


def _cache_file(table: pa.Table, path: Path) -> Path:
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    path.write_bytes(sink.getvalue())
    return path


def _read_cache(tmp_path: Path, file: Path, rows: int) -> dict[str, Any]:  # Any: the snippet's JSON
    root = Path(__file__).resolve().parents[2]
    env = {
        "STAGING": str(tmp_path / "out" / "_staging" / "run-1"),
        "FILE": str(file),
        "ROWS": str(rows),
        "PYTHONPATH": str(root),
        "PATH": "/usr/bin:/bin",
    }
    result = subprocess.run(
        [sys.executable, "-c", _READ_CACHE], capture_output=True, text=True, timeout=280, env=env, cwd=root
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


def _prepared_rows(rows: int, row: pa.Array) -> pa.Table:
    """Prepared rows as a try keeps them (every column text), their ``row`` column given."""
    text = pa.array([None] * rows, pa.string())
    return pa.table(
        {
            "id": pa.array([str(n) for n in range(rows)]),
            "source": pa.array([f"in.csv:{n + 2}" for n in range(rows)]),
            "row": row,
            **{name: text for name in ("messages", "prompt", "sampling", "request", "error")},
        }
    )


@pytest.mark.timeout(300)
def test_a_planted_cache_file_that_decodes_to_a_gigabyte_is_not_used_and_never_reaches_ray(
    tmp_path: Path,
) -> None:
    value = pa.array(["A" * (32 << 20)])
    bomb = pa.DictionaryArray.from_arrays(pa.array([0] * 32, pa.int32()), value)
    file = _cache_file(_prepared_rows(32, bomb), tmp_path / "bomb.parquet")
    size = file.stat().st_size

    report = _read_cache(tmp_path, file, rows=32)

    assert size < 5_000
    assert (report["kept"], report["given"]) == (False, []), report
    [warning] = report["warnings"]
    assert warning.startswith("Ignoring the prepared rows an earlier try kept at "), warning
    assert (
        "prepared/part-0.parquet: its first " in warning
        and "more than 1,073,741,824 bytes once read" in warning
    )
    assert report["grown_mib"] < PEAK_GROWTH_LIMIT_MIB, report


@pytest.mark.timeout(300)
def test_an_ordinary_cache_file_is_still_read_by_ray(tmp_path: Path) -> None:
    rows = [json.dumps({"text": f"row {n} é"}) for n in range(2_000)]
    file = _cache_file(_prepared_rows(2_000, pa.array(rows)), tmp_path / "ordinary.parquet")

    report = _read_cache(tmp_path, file, rows=2_000)

    assert report["kept"] and report["warnings"] == [], report
    assert [Path(path).name for path in report["given"]] == ["part-0.parquet"]


class _Rows:
    """A dataset of one table, one block: its ``map_batches`` gives the function the whole table, as
    Ray Data does with ``batch_size=None``."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    # Any: the cache's batch function and its keywords
    def map_batches(self, fn: Any, batch_size: None, batch_format: str, fn_kwargs: dict[str, Any]) -> _Rows:
        return _Rows(fn(self.table, **fn_kwargs))

    def take_all(self) -> list[dict[str, Any]]:  # Any: the table's values
        return self.table.to_pylist()


def test_a_cache_of_long_rows_the_job_writes_is_within_the_bounds_it_is_read_back_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1,024 prepared rows of 80 KiB: with pyarrow's default batches, one 84 MB dictionary page, which
    a retry would refuse to read back (it would read the input again every time)."""
    import types

    from airflow_provider_raybatch.pipeline.read import prepared_cache

    given: list[str] = []

    def read_parquet(files: list[str], **_: Any) -> _Counted:  # Any: Ray's keywords
        given.extend(files)
        return _Counted(len(files))

    ray = types.ModuleType("ray")
    ray.data = types.SimpleNamespace(read_parquet=read_parquet)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.data", ray.data)
    text = "".join(chr(ord("a") + (n * 7919) % 26) for n in range(80 << 10))
    rows = _prepared_rows(1024, pa.array([text[n:] + text[:n] for n in range(1024)]))
    staging = str(tmp_path / "_staging" / "run-1")

    kept = prepared_cache.write(
        staging, prepared_cache.PreparedRows(_Rows(rows), 1024, 0, 0, 0), "d1", staging
    )

    assert kept
    assert prepared_cache.read(staging, "d1", staging) is not None
    assert len(given) == 1


class _Counted:
    def __init__(self, files: int) -> None:
        self.files = files

    def materialize(self) -> _Counted:
        return self

    def count(self) -> int:
        return 1024 * self.files
