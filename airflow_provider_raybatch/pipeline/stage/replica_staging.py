"""How an engine replica stages its finished rows: a few at a time, as they finish, across its batches.

vLLM finishes a batch's rows one by one, and a replica works on several batches at once
(``max_concurrent_batches``). Staged a batch at a time, a killed job lost every finished row of every
batch still in flight: up to ``max_concurrent_batches x batch_size`` per replica. Staged here, each
row joins one replica-wide buffer the moment the engine returns it, and the buffer becomes a staged
part whenever it holds ``flush_rows`` rows (half a batch) or rows that cost ``PART_COST_BYTES`` once
the commit reads them back, and whenever a batch ends (so that no batch leaves the replica with rows
unstaged). A kill then loses only the
buffer and the part being written: at most one batch per replica while writes keep up with the
engine. Under a burst (many rows ending at one engine step) the buffer grows while a write is on, and
the next write takes all of it: fewer, larger writes rather than a queue of small ones, each part
still at most ``PART_COST_BYTES``.

Writes run one at a time, in a thread, so that the event loop keeps feeding the engine. What each
write returns (the part it staged) is kept until :meth:`RowStager.take_written`: the replica hands
those parts on with a batch's output, so the driver commits without reading each sidecar back.

``RAYBATCH_TRACE_ROWS=<folder>`` in the job's environment (a diagnostic for fault-injection
measurements) makes each replica append the source of every row the engine finishes to a file of
its own in that folder, line by line, so the list survives the process being killed.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow_provider_raybatch.pipeline.read import staged_parquet
from airflow_provider_raybatch.shared.json_types import Row

if TYPE_CHECKING:
    from typing import TextIO

TRACE_ROWS_ENV = "RAYBATCH_TRACE_ROWS"
#: Column of a row leaving the engine stage: the parts its replica staged since its last report, as
#: JSON ``[{"name", "sidecar"}]`` (one row of a batch carries it; see :mod:`.engine_actor`).
REPORTED_PARTS = "__raybatch_parts__"


#: The most one staged part's rows may cost once the commit reads them back, as
#: ``staged_parquet.staged_row_cost`` charges each row (at most what it costs). The commit reads a part
#: within ``staged_parquet.FILE_COST_BYTES`` (1 GiB): a part cut by its text alone held 32 rows of
#: 100,000 small numbers (9 MiB of text, 810 MB read back), and 32 of 400,000 cost 3.2 GB, which the
#: commit refused every try. Half of it: in a part's table, a column some rows lack is a null cell in
#: each of them. A single row over it is a part of its own.
PART_COST_BYTES = staged_parquet.FILE_COST_BYTES // 2


def _parts_of(rows: list[Row], sizes: list[int]) -> list[list[Row]]:
    """``rows`` cut, in order, into runs that cost at most :data:`PART_COST_BYTES` each (``sizes``)."""
    parts: list[list[Row]] = [[]]
    held = 0
    for row, size in zip(rows, sizes, strict=True):
        if parts[-1] and held + size > PART_COST_BYTES:
            parts.append([])
            held = 0
        parts[-1].append(row)
        held += size
    return parts


def flush_rows_for(batch_size: int) -> int:
    """Half a batch: the buffer plus the part being written then stay under one batch."""
    return max(1, batch_size // 2)


class RowStager:
    """One replica's buffer of finished rows, staged in parts by ``write``.

    :param write: stages a list of rows as one part (blocking; run in a thread); what it returns, if
        not None, is kept for :meth:`take_written`.
    :param flush_rows: stage the buffer once it holds this many rows.
    """

    def __init__(self, write: Callable[[list[dict[str, Any]]], Any], flush_rows: int) -> None:
        self._write = write
        self._flush_rows = flush_rows
        self._pending: list[Row] = []
        self._pending_sizes: list[int] = []  # each pending row's cost read back (staged_row_cost)
        self._pending_bytes = 0
        self._written: list[Any] = []  # Any: what the writes returned (staged parts)
        self._lock: asyncio.Lock | None = None  # made in the replica's event loop, on first use
        self._trace = _open_trace(os.environ.get(TRACE_ROWS_ENV))

    def finished(self, row: dict[str, Any]) -> bool:
        """Take a row the engine finished; True when the buffer is due to be staged."""
        if self._trace is not None:
            self._trace.write(f"{row['source']}\n")
        self._pending.append(row)
        self._pending_sizes.append(staged_parquet.staged_row_cost(row))
        self._pending_bytes += self._pending_sizes[-1]
        return len(self._pending) >= self._flush_rows or self._pending_bytes >= PART_COST_BYTES

    async def flush(self) -> None:
        """Stage what the buffer holds; on return, every row given before the call is staged."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        # FIFO: a flush that finds the buffer empty still waits for the write of its rows before it.
        async with self._lock:
            rows, self._pending = self._pending, []
            sizes, self._pending_sizes, self._pending_bytes = self._pending_sizes, [], 0
            for part in _parts_of(rows, sizes) if rows else []:
                written = await asyncio.to_thread(self._write, part)
                if isinstance(written, list):  # a write may stage its rows as several parts
                    self._written.extend(written)
                elif written is not None:
                    self._written.append(written)

    def take_written(self) -> list[Any]:  # Any: what the writes returned
        """What the writes since the last call returned, each handed out once."""
        written, self._written = self._written, []
        return written


def _open_trace(folder: str | None) -> TextIO | None:
    if not folder:
        return None
    os.makedirs(folder, exist_ok=True)
    name = f"{os.getpid()}-{uuid.uuid4().hex[:8]}.txt"  # one file per replica, never shared
    return open(os.path.join(folder, name), "a", buffering=1)  # noqa: SIM115 - lives with the replica
