"""What one stage actor of a pooled job may have waiting on the pool's replicas at once: rows, and
their bytes.

A replica is shared by every job on the pool, and holds each row sent to it in its memory from the
moment the call arrives until the engine answers it, behind the job's fair share of the engine
(:mod:`.pool_replica`). A count alone bounds nothing in memory: 2,048 rows near the input bound
(32 MiB each) were 64 GiB in a replica other DAGs' rows share, which ends it for everyone. So a stage
actor admits its rows in order while both their count and their bytes are within bounds; a row
larger than the byte bound alone goes when nothing else of the actor's is in flight.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import sys
from collections.abc import AsyncIterator, Iterable, Mapping

#: One stage actor's rows waiting on the pool's replicas at once, at most. A replica runs up to 10,000
#: calls at once for every job together (``engine_pool``'s ``max_concurrency``): a job whose batches
#: put more rows in flight (256-row batches x 8 per actor x several actors) would hold the other jobs'
#: rows in Ray's queue. Twice vLLM's largest ``max_num_seqs`` default keeps a replica's engine fed.
ROWS_IN_FLIGHT_PER_STAGE_ACTOR = 2048
#: One stage actor's rows' bytes waiting on the replicas at once, at most (:func:`row_bytes`): 128 image
#: rows of 2 MiB, or 2,048 rows of 128 KiB, enough to keep an engine fed.
BYTES_IN_FLIGHT_PER_STAGE_ACTOR = 256 << 20
#: What a value is charged besides its payload (a number, a None, a dict's or list's own object).
_VALUE_BYTES = 64


def row_bytes(value: object) -> int:
    """About what a row takes in a replica's memory once Ray has unpacked it, without serialising it:
    each text and bytes value as Python holds it (``sys.getsizeof``: a text at its widest
    character, 4 bytes each once one is past U+FFFF), each container's items, the objects of an
    object array one by one (Ray Data hands a row's ``messages`` to the stage as one, whose
    ``nbytes`` counts 8 bytes a pointer), a number array's data, a decoded image's pixels."""
    if isinstance(value, str | bytes | bytearray):
        return sys.getsizeof(value)
    if isinstance(value, Mapping):
        return _VALUE_BYTES + sum(row_bytes(key) + row_bytes(item) for key, item in value.items())
    if isinstance(value, list | tuple):
        return _VALUE_BYTES + sum(row_bytes(item) for item in value)
    dtype = getattr(value, "dtype", None)
    if dtype is not None and getattr(dtype, "hasobject", False):  # a numpy array of Python objects
        items: Iterable[object] = getattr(value, "flat", ())
        return _VALUE_BYTES + sum(row_bytes(item) for item in items)
    nbytes = getattr(value, "nbytes", None)  # a numpy array of numbers (an image Ray Data decoded)
    if isinstance(nbytes, int):
        return _VALUE_BYTES + nbytes
    size, bands = getattr(value, "size", None), getattr(value, "getbands", None)
    if callable(bands) and isinstance(size, tuple) and len(size) == 2:
        # a decoded PIL image (an image row's engine input): its pixels, as PIL keeps them: 4 bytes
        # each for every mode of more than one band (RGB too), a byte for one band at most 4
        width, height = size
        return _VALUE_BYTES + int(width) * int(height) * 4
    return _VALUE_BYTES


class RowsInFlight:
    """A stage actor's admission of rows to the replicas, first come first in, within
    :data:`ROWS_IN_FLIGHT_PER_STAGE_ACTOR` rows and :data:`BYTES_IN_FLIGHT_PER_STAGE_ACTOR` bytes.
    Made on the actor's event loop (the first row's)."""

    def __init__(self, most_rows: int | None = None, most_bytes: int | None = None) -> None:
        self._most_rows = ROWS_IN_FLIGHT_PER_STAGE_ACTOR if most_rows is None else most_rows
        self._most_bytes = BYTES_IN_FLIGHT_PER_STAGE_ACTOR if most_bytes is None else most_bytes
        self._rows = 0
        self._bytes = 0
        self._waiting: collections.deque[object] = collections.deque()  # in arrival order
        self._changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def admitted(self, size: int) -> AsyncIterator[None]:
        """Hold a place for a row of ``size`` bytes while it is in flight. A row cancelled while it
        waits leaves the line (or the rows behind it would wait for ever)."""
        async with self._changed:
            place = object()
            self._waiting.append(place)
            try:
                await self._changed.wait_for(lambda: self._waiting[0] is place and self._fits(size))
            finally:
                self._waiting.remove(place)
                self._changed.notify_all()  # the next in line may fit too
            self._rows += 1
            self._bytes += size
        try:
            yield
        finally:
            async with self._changed:
                self._rows -= 1
                self._bytes -= size
                self._changed.notify_all()

    def _fits(self, size: int) -> bool:
        if self._rows >= self._most_rows:
            return False
        return self._rows == 0 or self._bytes + size <= self._most_bytes
