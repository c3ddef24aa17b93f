"""The engine dataset started before its rows are ready, so that a job's engines build while it reads.

Ray Data asks for an actor pool's actors when the dataset that holds the pool starts executing
(``ActorPoolMapOperator.start``), never before. A job's engine dataset used to start once its input
was read, prepared and its repeated ids found: on the seeds' 200,000-row CSV its engines were asked
for 26 s after the submit, then built for a minute, where a warm pool's job asks for its replicas at
the driver's start (bench/RESULTS.md 19, lever b). Every job now starts its engine dataset on a gate
(:meth:`RowsGate.dataset`): a few tasks that take the prepared rows' blocks from a Ray queue
(``ray.util.queue.Queue``) as the driver puts them there (:meth:`RowsGate.feed`), then end
(:meth:`RowsGate.close`). Until then the dataset's operators, the engine replicas first, start and
wait; what follows the gate is the job's engine dataset as before.

* **Made as taken.** The driver feeds the accepted rows as Ray Data makes them (the duplicates marked
  lazily, the resumed rows dropped), a block at a time into a queue of at most :data:`BLOCKS_QUEUED`;
  the gate tasks take them into the engine dataset, whose own backpressure (its object store budget)
  then paces them, as it paced those passes when they ran inside the engine dataset.
* **Never stuck.** A put that finds the queue full looks, every :data:`PUT_WAIT_SECONDS`, whether the
  engine dataset ended (it failed: nothing will take a block again) and stops feeding if so; so does
  the feed before each block. The end marks wait for room behind the blocks, as blocks do.
* **No block taken twice, none lost unsaid.** A gate task is not retried (``max_retries=0``): a retry
  would take the next blocks, and the blocks its first attempt held would be lost. A gate task that
  dies fails the engine dataset, and the job with it; the rows the replicas staged before stay
  staged for the retry, and a commit never counts a row lost (``rows_in`` must equal the rows out
  plus the rows failed).
* **Light.** The gate's tasks and its queue reserve no CPU (``num_cpus=0``): they wait, and must not
  hold a core that the reads need while they do. The engine dataset's actors do hold theirs from its
  start now, beside the reads: a cluster needs a CPU free beyond them, as the engine dataset's own
  tasks (its filter, its batches) always needed one beside them.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from ray import ObjectRef
    from ray.data import Dataset
    from ray.util.queue import Queue

#: A block in the queue: its ref, and the rows of it the dataset holds (start, stop), None for all.
_Block = tuple["ObjectRef", tuple[int, int] | None]
#: How many gate tasks take blocks from the queue at once (the engine dataset's first operator).
GATE_TASKS = 2
#: How many blocks the queue holds at most before the driver waits for a gate task to take one.
BLOCKS_QUEUED = 16
#: How often a full queue's put looks whether the engine dataset is still there to take its blocks.
PUT_WAIT_SECONDS = 1.0


class RowsGate:
    """The queue between the driver's prepared rows and the engine dataset that started before them."""

    def __init__(self, tasks: int = GATE_TASKS, blocks_queued: int = BLOCKS_QUEUED) -> None:
        from ray.util.queue import Queue

        self.tasks = tasks
        self._queue: Queue = Queue(maxsize=blocks_queued, actor_options={"num_cpus": 0})
        self._closed = self._shut = False
        self.fed = False  # whether a block went in

    def dataset(self) -> Dataset:
        """The engine dataset's input: the blocks fed, as they are fed, until the gate closes."""
        import ray

        return ray.data.range(self.tasks, override_num_blocks=self.tasks).map_batches(
            _blocks_from_queue,
            fn_kwargs={"gate": self._queue},
            batch_size=None,
            num_cpus=0,
            max_retries=0,
        )

    def feed(self, rows: Dataset, engine_running: Callable[[], bool]) -> int:
        """Put ``rows``' blocks into the gate as they are made; the rows put. Stops early, returning the
        rows put so far, once ``engine_running()`` says the engine dataset ended."""
        rows_put = 0
        for bundle in rows.iter_internal_ref_bundles():
            # A bundle may hold a slice of a block (Ray 2.60's RefBundle.slices): the slice is what it holds.
            slices = getattr(bundle, "slices", None) or [None] * len(bundle.block_refs)
            for ref, metadata, part in zip(bundle.block_refs, bundle.metadata, slices, strict=True):
                span = None if part is None else (part.start_offset, part.end_offset)
                # Looked at before each block too, not only on a full queue: a failed engine dataset's
                # gate tasks may go on taking blocks for a while, and the rest need not be made.
                if not engine_running() or not self._put((ref, span), engine_running):
                    return rows_put
                self.fed = True
                rows_put += (span[1] - span[0]) if span else (metadata.num_rows or 0)
        return rows_put

    def close(self, engine_running: Callable[[], bool]) -> None:
        """No more blocks: each gate task ends once it took its end mark, behind the blocks fed (which
        may fill the queue yet: the end marks wait for room as the blocks do). Idempotent; nothing
        once the queue is shut."""
        if self._closed or self._shut:
            return
        self._closed = True
        for _ in range(self.tasks):
            if not self._put(None, engine_running):
                return  # nothing takes from the queue any more: the engine dataset ended

    def shut(self) -> None:
        """End the queue's actor: after :meth:`close`, once the engine dataset ended; or before it, to
        end a dataset fed nothing (its gate tasks fail). Idempotent."""
        self._shut = True
        self._queue.shutdown(force=True)

    def _put(self, item: _Block | None, engine_running: Callable[[], bool]) -> bool:
        """Put ``item`` (None: an end mark) once there is room; False (not put) once the engine dataset
        ended. A block's ref goes in a tuple, so that Ray passes it on as a ref (a ref given as an
        argument itself is resolved first, here in the queue's actor)."""
        while True:
            try:
                self._queue.put(item, timeout=PUT_WAIT_SECONDS)
                return True
            except queue.Full:
                if not engine_running():
                    return False


def _blocks_from_queue(_: pa.Table, gate: Queue) -> Iterator[Any]:  # Any: a Ray Data block
    """A gate task: the blocks it takes from the queue, until it takes an end mark."""
    import ray
    from ray.data.block import BlockAccessor

    while (item := gate.get()) is not None:
        ref, span = item
        block = ray.get(ref)
        if span is not None:
            block = BlockAccessor.for_block(block).slice(span[0], span[1], copy=False)
        if BlockAccessor.for_block(block).num_rows():
            yield block
