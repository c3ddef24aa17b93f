"""A staged part planted in a run's staging folder is read back within bounds, or the commit fails
naming it.

Whoever can write the output location (a second tenant of the bucket, a local user for a file://
output) can write a run's staging, a part's data file included. A file's bytes do not bound what it
decodes to: 1.5 KB of Parquet whose 32 rows each name one 32 MiB dictionary value, read back whole,
grew the committing process by 915 MiB when commit staged the part again without its repeated rows
(``read_part``, ``part_schema.decode_parquet``) and by 3.6 GiB when it gave every part one schema
(``conform_parts``). Staged parts are now read as input files are (pipeline/read/staged_parquet.py),
and a part whose rows would cost more than a part may is refused before any value is decoded: the
commit fails, naming the file, and the staging stays as it was. No row is at fault.
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

from airflow_provider_raybatch.pipeline import storage
from airflow_provider_raybatch.pipeline.row_types import StagedRow
from airflow_provider_raybatch.pipeline.stage import commit
from airflow_provider_raybatch.pipeline.stage.parts import PartWriter
from airflow_provider_raybatch.pipeline.storage import OutputLayout
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec, OutputFormat

RUN_KEY = "classify-m-1-0123456789abcdef"
#: What the committing process may grow by while it refuses a planted part (read whole: 0.6 to 3.6 GiB).
PEAK_GROWTH_LIMIT_MIB = 150


def dictionary_bomb(rows: int = 32, value_mib: int = 32) -> bytes:
    """Parquet of ``rows`` rows (the staged parts' columns ``id`` and ``x``) whose ``x`` names one
    dictionary value of ``value_mib`` MiB."""
    value = pa.array(["A" * (value_mib << 20)])
    x = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), value)
    table = pa.table({"id": pa.array(range(rows), pa.int64()), "x": x})
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def _spec() -> BatchInferenceSpec:
    return BatchInferenceSpec.build(
        model="m", input_uri="in.jsonl", output_uri="out", user_template="{x}", run_key=RUN_KEY
    )


def _row(source: str, record: dict[str, Any]) -> StagedRow:  # Any: row values
    return StagedRow(source=source, ok=True, record=json.dumps(record))


def _staging(tmp_path: Path, output_format: OutputFormat = "parquet") -> tuple[OutputLayout, PartWriter]:
    layout = OutputLayout(str(tmp_path / "out"), RUN_KEY)
    commit.open_staging(layout, _spec())
    writer = PartWriter(
        layout.staging_uri, output_format, count_labels=False, data_uri=commit.staged_data_uri(layout)
    )
    writer.create_folders()
    return layout, writer


def _plant(writer: PartWriter, part: commit.StagedPart, data: bytes) -> str:
    """Put ``data`` in place of the part's output file; returns its name as commit names it."""
    name = f"outputs/{part.sidecar['files']['outputs']}"
    storage.write_bytes(storage.join(writer.data_uri, name), data)
    return name


#: Commits the staging under ``OUT`` in a fresh interpreter, and says what it raised and how much the
#: process grew meanwhile (its peak resident memory).
_COMMIT = """
import json, os, resource
from airflow_provider_raybatch.pipeline.stage import commit
from airflow_provider_raybatch.pipeline.stage.parts import PartWriter
from airflow_provider_raybatch.pipeline.storage import OutputLayout
from airflow_provider_raybatch.shared.specs import BatchInferenceSpec
layout = OutputLayout(os.environ["OUT"], os.environ["RUN_KEY"])
spec = BatchInferenceSpec.build(model="m", input_uri="in.jsonl", output_uri="out", user_template="{x}",
                                run_key=os.environ["RUN_KEY"])
data_uri = commit.staged_data_uri(layout)
writer = PartWriter(layout.staging_uri, os.environ["FORMAT"], count_labels=False, data_uri=data_uri)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    commit.write_version(layout, spec, int(os.environ["ROWS_IN"]), rewriter=writer)
    raised = None
except Exception as err:
    raised = f"{type(err).__name__}: {err}"
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024
print(json.dumps({"raised": raised, "grown_mib": grown}))
"""


def _commit_in_a_subprocess(
    layout: OutputLayout, rows_in: int, output_format: OutputFormat = "parquet"
) -> dict[str, Any]:  # Any: its JSON
    env = {"OUT": layout.output_uri, "RUN_KEY": RUN_KEY, "ROWS_IN": str(rows_in), "FORMAT": output_format}
    env["PATH"] = "/usr/bin:/bin"
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", _COMMIT],
        capture_output=True,
        text=True,
        timeout=280,
        env={**env, "PYTHONPATH": str(root)},
        cwd=root,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


def _assert_refused_naming(report: dict[str, Any], name: str, bound: str = "bytes once read") -> None:
    raised = report["raised"] or ""
    assert raised.startswith(f"StagedParquetTooLargeError: staged part {name}: "), report
    assert f"more than 1,073,741,824 {bound}" in raised, report
    assert "The commit refuses it" in raised and "delete the file and a retry redoes its rows" in raised
    assert report["grown_mib"] < PEAK_GROWTH_LIMIT_MIB, report


@pytest.mark.timeout(300)
def test_a_planted_part_that_decodes_to_a_gigabyte_fails_the_commit_when_parts_are_given_one_schema(
    tmp_path: Path,
) -> None:
    """``conform_parts``: x is text in one part and a number in the other, so both are read back."""
    layout, writer = _staging(tmp_path)
    writer.write_part([_row("in.jsonl:1", {"id": 1, "x": "a"})])
    planted = writer.write_part([_row("in.jsonl:2", {"id": 2, "x": 5})])
    bomb = dictionary_bomb()
    name = _plant(writer, planted, bomb)

    report = _commit_in_a_subprocess(layout, rows_in=2)

    assert len(bomb) < 2_000
    _assert_refused_naming(report, name)
    assert not storage.exists(layout.manifest_uri)
    assert storage.read_bytes(storage.join(writer.data_uri, name)) == bomb  # the staging kept as it was


@pytest.mark.timeout(300)
def test_a_planted_part_that_decodes_to_a_gigabyte_fails_the_commit_when_its_rows_are_staged_again(
    tmp_path: Path,
) -> None:
    """``read_part``: the planted part repeats one of an earlier part's rows, so commit reads its rows
    to stage the others again (parts are taken in name order: the later one is the repeat)."""
    layout, writer = _staging(tmp_path)
    one = writer.write_part(
        [_row("in.jsonl:1", {"id": 1, "x": "a"}), _row("in.jsonl:3", {"id": 3, "x": "c"})]
    )
    two = writer.write_part(
        [_row("in.jsonl:1", {"id": 1, "x": "a"}), _row("in.jsonl:2", {"id": 2, "x": "b"})]
    )
    name = _plant(writer, max(one, two, key=lambda part: part.name), dictionary_bomb())

    report = _commit_in_a_subprocess(layout, rows_in=3)

    _assert_refused_naming(report, name)
    assert not storage.exists(layout.manifest_uri)


#: A JSON value of 14M empty objects: 42 MiB of text, about 1 GiB of dicts once parsed.
_EMPTY_OBJECTS = 14_000_000


def _json_text_bomb() -> bytes:
    """Parquet of one row whose JSON text column ``x`` holds ``[{},{},...]``."""
    text = "[" + "{}," * _EMPTY_OBJECTS + "{}]"
    x = pa.field("x", pa.string(), metadata={b"raybatch.encoding": b"json"})
    table = pa.table(
        [pa.array([2], pa.int64()), pa.array([text])], schema=pa.schema([pa.field("id", pa.int64()), x])
    )
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("output_format", ["parquet", "jsonl"])
def test_a_planted_part_of_json_values_that_parse_to_a_gigabyte_fails_the_commit(
    tmp_path: Path, output_format: OutputFormat
) -> None:
    """A part's JSON text (a Parquet part's JSON text column, a JSONL part's lines) is parsed when
    commit stages its rows again: ``{},`` is 3 bytes of text and about 80 of Python."""
    layout, writer = _staging(tmp_path, output_format)
    one = writer.write_part(
        [_row("in.jsonl:1", {"id": 1, "x": "a"}), _row("in.jsonl:3", {"id": 3, "x": "c"})]
    )
    two = writer.write_part(
        [_row("in.jsonl:1", {"id": 1, "x": "a"}), _row("in.jsonl:2", {"id": 2, "x": "b"})]
    )
    jsonl = b'{"id": 2, "x": [' + b"{}," * _EMPTY_OBJECTS + b"{}]}\n"
    bomb = _json_text_bomb() if output_format == "parquet" else jsonl
    name = _plant(writer, max(one, two, key=lambda part: part.name), bomb)

    report = _commit_in_a_subprocess(layout, rows_in=3, output_format=output_format)

    _assert_refused_naming(report, name, bound="bytes once parsed")
    assert not storage.exists(layout.manifest_uri)


def test_ordinary_parts_still_commit_read_back_as_written(tmp_path: Path) -> None:
    layout, writer = _staging(tmp_path)
    writer.write_part([_row("in.jsonl:1", {"id": 1, "x": "a" * 100_000})])
    writer.write_part(
        [_row("in.jsonl:1", {"id": 1, "x": "a" * 100_000}), _row("in.jsonl:2", {"id": 2, "x": 5})]
    )

    run = commit.write_version(layout, _spec(), 2, rewriter=writer)

    assert (run.rows_out, run.rows_failed, run.json_columns["outputs"]) == (2, 0, ["x"])
    rows = [
        row for name in sorted(Path(run.outputs_uri).iterdir()) for row in pq.read_table(name).to_pylist()
    ]
    assert sorted(json.loads(row["x"]) for row in rows if row["id"] == 2) == [5]
    assert [json.loads(row["x"]) for row in rows if row["id"] == 1] == ["a" * 100_000]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (lambda: dictionary_bomb(rows=4, value_mib=1), "more than 1,000,000 bytes once read"),
        (lambda: b"x" * 1_000_001, "it is 1,000,001 bytes, more than a file read back"),
    ],
    ids=["decodes-past-the-bound", "bytes-past-the-bound"],
)
def test_a_part_past_the_bound_is_refused_naming_it_before_a_value_is_decoded(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    data: Any,
    reason: str,  # Any: a bytes factory
) -> None:
    """The bound lowered to 1 MB to keep the file small: 4 rows of one 1 MiB value, and a file whose
    bytes alone are more, refused unread."""
    from airflow_provider_raybatch.pipeline.read import staged_parquet

    monkeypatch.setattr(staged_parquet, "FILE_COST_BYTES", 1_000_000)
    layout, writer = _staging(tmp_path)
    part = writer.write_part([_row("in.jsonl:1", {"id": 1, "x": "a"})])
    name = _plant(writer, part, data())

    with pytest.raises(ValueError, match=f"^staged part {name}: ") as raised:
        writer.read_part(part)

    assert reason in str(raised.value) and "lower batch_size" in str(raised.value)
