"""Tests of airflow_provider_raybatch/pipeline/stage/replica_staging.py: when a replica's finished
rows are staged."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_raybatch.pipeline.stage.replica_staging import TRACE_ROWS_ENV, RowStager, flush_rows_for


def _row(n: int) -> dict[str, Any]:  # Any: row values.
    return {"source": f"in.jsonl:{n}", "generated_text": "x"}


@pytest.mark.parametrize(("batch_size", "flush_rows"), [(64, 32), (8, 4), (3, 1), (1, 1)])
def test_the_buffer_is_half_a_batch(batch_size: int, flush_rows: int) -> None:
    assert flush_rows_for(batch_size) == flush_rows


def test_rows_are_staged_every_flush_rows_and_at_a_flush() -> None:
    parts: list[list[str]] = []
    stager = RowStager(lambda rows: parts.append([row["source"] for row in rows]), flush_rows=3)

    async def finish(count: int) -> list[bool]:
        due = []
        for n in range(count):
            due.append(stager.finished(_row(n)))
            if due[-1]:
                await stager.flush()
        await stager.flush()  # the batch ends
        await stager.flush()  # nothing left: writes no empty part
        return due

    due = asyncio.run(finish(7))

    assert due == [False, False, True, False, False, True, False]
    assert parts == [
        ["in.jsonl:0", "in.jsonl:1", "in.jsonl:2"],
        ["in.jsonl:3", "in.jsonl:4", "in.jsonl:5"],
        ["in.jsonl:6"],
    ]


def test_a_flush_returns_only_once_the_write_before_it_is_done() -> None:
    """A batch that ends while another batch's rows (and some of its own) are being written must not
    leave the replica before they are staged: writes run one at a time, in order."""
    writing = threading.Event()
    release = threading.Event()
    staged: list[str] = []

    def write(rows: list[dict[str, Any]]) -> None:  # Any: row values.
        writing.set()
        release.wait(5)
        staged.extend(row["source"] for row in rows)

    stager = RowStager(write, flush_rows=2)

    async def two_batches() -> list[str]:
        stager.finished(_row(0))
        stager.finished(_row(1))
        first = asyncio.create_task(stager.flush())  # batch A's half-batch write, held in its thread
        await asyncio.to_thread(writing.wait, 5)
        ending = asyncio.create_task(stager.flush())  # batch B ends; its rows went out with A's write
        await asyncio.sleep(0.05)
        done_early = ending.done()
        release.set()
        await asyncio.gather(first, ending)
        return [str(done_early), *staged]

    assert asyncio.run(two_batches()) == ["False", "in.jsonl:0", "in.jsonl:1"]


def test_the_trace_lists_each_finished_row_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TRACE_ROWS_ENV, str(tmp_path / "trace"))
    stager = RowStager(lambda rows: None, flush_rows=10)

    stager.finished(_row(4))
    stager.finished(_row(9))

    (trace,) = (tmp_path / "trace").iterdir()
    assert trace.read_text() == "in.jsonl:4\nin.jsonl:9\n"  # before any flush: a kill keeps them


def test_what_the_writes_return_is_handed_out_once() -> None:
    """The parts the writes staged go to the driver with a batch's output (engine_actor): each once."""
    written: list[list[str]] = []

    def write(rows: list[dict]) -> str:
        written.append([row["source"] for row in rows])
        return f"part-{len(written)}"

    stager = RowStager(write, flush_rows=2)

    async def run() -> tuple[list[str], list[str], list[str]]:
        stager.finished({"source": "a"})
        stager.finished({"source": "b"})
        await stager.flush()
        first = stager.take_written()
        stager.finished({"source": "c"})
        await stager.flush()
        await stager.flush()  # nothing pending: no write, nothing more to hand out
        return first, stager.take_written(), stager.take_written()

    assert asyncio.run(run()) == (["part-1"], ["part-2"], [])
    assert written == [["a", "b"], ["c"]]


def test_rows_of_long_text_are_staged_in_parts_the_commit_can_read_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A part is read back within a bound (read/staged_parquet.py): rows of images or long documents,
    half a batch of them or a burst, are cut into parts that cost at most PART_COST_BYTES once read
    back, in order; a row over it alone is a part of its own."""
    from airflow_provider_raybatch.pipeline.stage import replica_staging

    # A row here costs 5 x (its texts' bytes and 128 a value): 2,785 for 300 characters of text.
    monkeypatch.setattr(replica_staging, "PART_COST_BYTES", 10_000)
    parts: list[list[str]] = []
    stager = RowStager(lambda rows: parts.append([row["source"] for row in rows]), flush_rows=100)
    sizes = [300, 300, 300, 300, 2_500, 100, 100]

    async def finish() -> list[bool]:
        due = [
            stager.finished({"source": str(n), "generated_text": "x" * size}) for n, size in enumerate(sizes)
        ]
        await stager.flush()  # a burst: all of them at once
        return due

    due = asyncio.run(finish())

    assert parts == [["0", "1", "2"], ["3"], ["4"], ["5", "6"]]
    assert due == [False, False, False, True, True, True, True]  # due once the buffer holds the bound
