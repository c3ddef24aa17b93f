"""Check a committed run of the customers workload row by row: every input row exactly once.

Reads the input CSV or Parquet files of the spec (pyarrow, the id column as text) and the committed version's
outputs and errors (``manifest.json`` -> ``outputs_uri`` / ``errors_uri``), and checks:

* no id twice in the outputs, no source twice in the errors;
* every input row's id in exactly one place as its first occurrence: the distinct ids of the input
  (and, for a row without an id, its ``<file>:<row>`` source) = the outputs' ids + the ids of the
  error rows that are not ``duplicate id``, and those two are disjoint;
* every ``duplicate id`` error names an id whose first row is in the outputs or the errors;
* outputs + errors = the input's rows = the manifest's ``rows_in``.

usage: python3 bench/gpu/scale_check.py JOB_JSON [OUT_JSON]     (after the job committed)
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any


def _column(table: Any, name: str) -> list[Any]:  # Any: a pyarrow table, cell values.
    return table.column(name).to_pylist() if name in table.column_names else []


def _read_folder(uri: str, columns: list[str]) -> Any:  # Any: a pyarrow table.
    import pyarrow as pa
    import pyarrow.dataset as ds

    path = Path(uri.removeprefix("file://"))
    files = sorted(str(p) for p in path.glob("*") if p.is_file())
    if not files:
        return pa.table({name: pa.array([], pa.string()) for name in columns})
    fmt = "parquet" if files[0].endswith(".parquet") else "json"
    dataset = ds.dataset(files, format=fmt)
    present = [name for name in columns if name in dataset.schema.names]
    return dataset.to_table(columns=present)


def _input_id_column(path: Path, id_column: str) -> list[Any]:  # Any: cell values.
    """One input file's id column as text, in row order (a CSV's or a Parquet file's)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    if path.suffix == ".parquet":
        return pq.read_table(path, columns=[id_column]).column(id_column).cast(pa.string()).to_pylist()
    table = pacsv.read_csv(
        path,
        convert_options=pacsv.ConvertOptions(
            column_types={id_column: pa.string()}, include_columns=[id_column], strings_can_be_null=False
        ),
    )
    return table.column(id_column).to_pylist()


def input_ids(spec: dict[str, Any]) -> tuple[list[str], int]:  # Any: JSON.
    """The first-occurrence keys to expect (distinct ids; a row without one: its source), and the rows."""
    id_column = spec["id_column"]
    root = Path(spec["input_uri"])
    files = (
        [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.suffix in (".csv", ".parquet"))
    )
    keys: list[str] = []
    seen: set[str] = set()
    rows = 0
    for path in files:
        name = path.name if root.is_file() else str(path.relative_to(root))
        for number, value in enumerate(_input_id_column(path, id_column), start=1):
            rows += 1
            key = value if value else f"{name}:{number}"
            if key not in seen:
                seen.add(key)
                keys.append(key)
    return keys, rows


def check(job: dict[str, Any]) -> dict[str, Any]:  # Any: JSON values.
    t0 = time.time()
    spec = job["spec"]
    manifest = json.loads((Path(spec["output_uri"]) / "manifest.json").read_text())
    id_column = spec["id_column"] or "row_id"
    outputs = _read_folder(manifest["outputs_uri"], [id_column])
    errors = _read_folder(manifest["errors_uri"], ["id", "source", "error"])
    out_ids = _column(outputs, id_column)
    err_ids, err_sources, err_reasons = (
        _column(errors, "id"),
        _column(errors, "source"),
        _column(errors, "error"),
    )
    t_read = time.time()

    out_counts = Counter(out_ids)
    source_counts = Counter(err_sources)
    is_duplicate = [str(reason).startswith("duplicate id") for reason in err_reasons]
    first_error_ids = [i for i, dup in zip(err_ids, is_duplicate, strict=True) if not dup]
    duplicate_ids = [i for i, dup in zip(err_ids, is_duplicate, strict=True) if dup]
    expected, input_rows = input_ids(spec)
    expected_set = set(expected)
    out_set = set(out_counts)
    first_error_set = set(first_error_ids)
    placed = out_set | first_error_set
    result = {
        "outputs": len(out_ids),
        "errors": len(err_ids),
        "input_rows": input_rows,
        "manifest_rows_in": manifest["rows_in"],
        "ids_twice_in_outputs": sum(1 for c in out_counts.values() if c > 1),
        "sources_twice_in_errors": sum(1 for c in source_counts.values() if c > 1),
        "first_error_ids_twice": len(first_error_ids) - len(first_error_set),
        "ids_in_outputs_and_errors": len(out_set & first_error_set),
        "input_keys": len(expected_set),
        "input_keys_missing": len(expected_set - placed),
        "keys_not_in_input": len(placed - expected_set),
        "duplicate_errors": len(duplicate_ids),
        "duplicate_errors_without_first": sum(1 for i in duplicate_ids if i not in placed),
        "errors_by_kind": dict(Counter(str(r).split(":")[0] for r in err_reasons)),
        "read_s": round(t_read - t0, 1),
        "check_s": round(time.time() - t0, 1),
    }
    result["every_row_exactly_once"] = (
        result["ids_twice_in_outputs"] == 0
        and result["sources_twice_in_errors"] == 0
        and result["first_error_ids_twice"] == 0
        and result["ids_in_outputs_and_errors"] == 0
        and result["input_keys_missing"] == 0
        and result["keys_not_in_input"] == 0
        and result["duplicate_errors_without_first"] == 0
        and len(out_ids) + len(err_ids) == input_rows == manifest["rows_in"]
    )
    return result


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    result = check(job)
    if len(sys.argv) > 2:
        Path(sys.argv[2]).write_text(json.dumps(result, indent=1))
    print("IDCHECK " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
