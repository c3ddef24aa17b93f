"""A small input read and prepared in the driver (pipeline/read/in_driver.py): the same rows, counts and
duplicate marks as Ray Data's tasks give, on messy inputs; a large input, many rows or images go to the
tasks."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_raybatch.manifest import DUPLICATE_ID_REASON
from airflow_provider_raybatch.pipeline import row_steps
from airflow_provider_raybatch.pipeline.read import in_driver
from airflow_provider_raybatch.specs import BatchInferenceSpec
from tests.unit.pipeline.ray_env import run_in_ray_env

_JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), st.text(max_size=12)
)
_JSON_VALUES = st.recursive(
    _JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
)
#: A JSONL line as exports write them: an object with drifting columns, or not JSON, blank, or a list.
_LINES = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "id": _JSON_VALUES,
            "text": _JSON_VALUES,
            "sampling_params": _JSON_VALUES,
            "n": _JSON_VALUES,
        },
    ).map(lambda row: json.dumps(row).encode()),
    st.sampled_from(
        [b"", b"   ", b"{", b"[1, 2]", b'"text"', b'{"text": "\\ud800 lone"}', b"\xff\xfe not utf-8"]
    ),
    st.text(max_size=20).map(str.encode),
)


@settings(max_examples=150, deadline=None)
@given(lines=st.lists(_LINES, max_size=25), id_column=st.sampled_from([None, "id"]))
def test_the_drivers_table_holds_every_prepared_row_as_prepared(
    lines: list[bytes], id_column: str | None
) -> None:
    """Whatever the lines: one row per record, each column text or null, and the Arrow table the
    driver puts in the object store gives back exactly those rows."""
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        (folder / "rows.jsonl").write_bytes(b"\n".join(lines))
        rows = _prepared_in_driver(folder, id_column)
    assert len({row["source"] for row in rows}) == len(rows)  # every record once
    assert all(list(row) == list(row_steps.PREPARED_COLUMNS) for row in rows)
    assert all(value is None or isinstance(value, str) for row in rows for value in row.values())
    assert all(row["error"] or row["messages"] or row["prompt"] for row in rows)  # a prompt, or a reason
    assert pa.Table.from_pylist(rows, schema=in_driver.PREPARED_SCHEMA).to_pylist() == rows


def _prepared_in_driver(folder: Path, id_column: str | None) -> list[dict]:
    spec = BatchInferenceSpec(
        model="/m", input_uri=f"{folder}/", output_uri="/out/", user_template="{text}", input_format="jsonl",
        id_column=id_column,
    )  # fmt: skip
    return list(in_driver._prepared(spec, [str(folder / "rows.jsonl")]))


def test_an_input_with_images_or_past_the_size_is_left_to_the_tasks(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "rows.jsonl").write_text('{"text": "hi"}\n' * 10)
    spec = BatchInferenceSpec(
        model="/m", input_uri=f"{tmp_path}/", output_uri="/out/", user_template="{text}", input_format="jsonl"
    )
    monkeypatch.setenv(in_driver.DRIVER_READ_MAX_BYTES_ENV, "149")  # the file is 150 bytes
    assert in_driver.prepared_rows(spec) is None
    with_images = spec.model_copy(update={"image_column": "image"})
    monkeypatch.setenv(in_driver.DRIVER_READ_MAX_BYTES_ENV, "150")
    assert in_driver.prepared_rows(with_images) is None
    with pytest.raises(ValueError, match="RAYBATCH_DRIVER_READ_MAX_BYTES='-1'"):
        monkeypatch.setenv(in_driver.DRIVER_READ_MAX_BYTES_ENV, "-1")
        in_driver.prepared_rows(spec)


_BOTH_PATHS = """
import json, os
import ray
from airflow_provider_raybatch.pipeline import run
from airflow_provider_raybatch.pipeline.read import in_driver
from airflow_provider_raybatch.specs import BatchInferenceSpec

SPECS = __SPECS__
ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR")
ray.data.DataContext.get_current().enable_progress_bars = False

def prepared(spec, driver):
    os.environ[in_driver.DRIVER_READ_MAX_BYTES_ENV] = str(in_driver.DRIVER_READ_MAX_BYTES if driver else 0)
    kept = run._prepared_rows(spec)
    took = in_driver.prepared_rows(spec) is not None
    rows = sorted(kept.rows.take_all(), key=lambda row: row["source"])
    return {"rows": rows, "counts": [kept.rows_in, kept.errors, kept.repeated_ids], "in_driver": took}

report = {}
for name, spec in json.loads(SPECS).items():
    spec = BatchInferenceSpec(**spec)
    report[name] = {"driver": prepared(spec, True), "tasks": prepared(spec, False)}
few = BatchInferenceSpec(**json.loads(SPECS)["jsonl"])
report["over_the_row_cap"] = in_driver.prepared_rows(few, max_rows=3) is None
print(json.dumps(report))
"""


def _messy_inputs(folder: Path) -> dict[str, dict]:
    """Three exports as users have them, each with duplicate ids, bad rows and drifting types."""
    jsonl = folder / "jsonl"
    jsonl.mkdir()
    (jsonl / "a.jsonl").write_bytes(
        b'{"id": 1, "text": "first"}\n{"id": "1", "text": "again, as text"}\n\n{not json\n'
        b'{"id": 2, "text": {"nested": [1, 2]}}\n{"id": 3}\n{"id": 4, "text": "caf\\u00e9 \\ud800"}\n'
        b'{"id": 5, "text": "five", "sampling_params": {"max_tokens": 3}}\n[1, 2]\n\xff\xfe\n'
    )
    (jsonl / "b.jsonl").write_text(
        '{"id": 2, "text": "repeat of 2"}\n{"id": 6, "text": ""}\n{"id": null, "text": "x"}\n'
    )
    csv = folder / "csv"
    csv.mkdir()
    (csv / "rows.csv").write_text(
        'id,text\n1,one\n2,"two, quoted"\n2,dup\nthree,3\n,empty id\n4\n5,five,extra\n'
    )
    parquet = folder / "parquet"
    parquet.mkdir()
    import pyarrow.parquet as pq

    pq.write_table(
        pa.table({"id": ["a", "b", "a", None], "text": ["x", None, "y", "z"]}), parquet / "p.parquet"
    )
    common = {"model": "/m", "output_uri": "/out/", "user_template": "{text}", "id_column": "id"}
    return {
        "jsonl": {**common, "input_uri": f"{jsonl}/", "input_format": "jsonl"},
        "csv": {**common, "input_uri": f"{csv}/", "input_format": "csv"},
        "parquet": {**common, "input_uri": f"{parquet}/", "input_format": "parquet"},
    }


def test_the_driver_and_ray_datas_tasks_prepare_the_same_rows_on_messy_inputs(tmp_path: Path) -> None:
    specs = _messy_inputs(tmp_path)
    report = run_in_ray_env(_BOTH_PATHS.replace("__SPECS__", repr(json.dumps(specs))))
    for name in specs:
        driver, tasks = report[name]["driver"], report[name]["tasks"]
        assert driver.pop("in_driver") is True and tasks.pop("in_driver") is False, name
        assert driver == tasks, name
        rows_in, errors, repeated = driver["counts"]
        assert rows_in == len(driver["rows"]) >= 4 and errors >= 1 and repeated >= 1, (name, driver["counts"])
        marked = [row for row in driver["rows"] if (row["error"] or "").startswith(DUPLICATE_ID_REASON)]
        assert len(marked) >= repeated, (name, driver["rows"])
        # Every later copy of a repeated id is marked, and every row has a prompt or a reason.
        assert all(row["error"] or row["messages"] or row["prompt"] for row in driver["rows"])
    assert report["over_the_row_cap"] is True
