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

* **Bounded.** The queue holds at most :data:`BLOCKS_QUEUED` blocks: the driver puts the next block
  only once a gate task took one, so the rows are made (the duplicates marked lazily, the resumed
  rows dropped) as the engines take them, with Ray Data's backpressure, not all at once into the
  object store.
* **Never stuck.** A put that finds the queue full looks, every :data:`PUT_WAIT_SECONDS`, whether the
  engine dataset ended (it failed: nothing will take a block again) and stops feeding if so.
* **No block taken twice, none lost unsaid.** A gate task is not retried (``max_retries=0``): a retry
  would take the next blocks, and the blocks its first attempt held would be lost. A gate task that
  dies fails the engine dataset, and the job with it; the rows the replicas staged before stay
  staged for the retry, and a commit never counts a row lost (``rows_in`` must equal the rows out
  plus the rows failed).
* **Light.** The gate's tasks and its queue reserve no CPU (``num_cpus=0``): they wait, and must not
  hold a core that the reads need while they do.
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
        self._closed = False

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
            if not all(self._put(ref, engine_running) for ref in bundle.block_refs):
                return rows_put
            rows_put += bundle.num_rows() or 0
        return rows_put

    def close(self) -> None:
        """No more blocks: each gate task ends once it took its end mark. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for _ in range(self.tasks):
            try:
                self._queue.put(None, timeout=PUT_WAIT_SECONDS)
            except queue.Full:
                return  # nothing takes blocks any more: the engine dataset ended

    def shut(self) -> None:
        """End the queue's actor (after :meth:`close`, once the engine dataset ended)."""
        self._queue.shutdown(force=True)

    def _put(self, block: ObjectRef, engine_running: Callable[[], bool]) -> bool:
        """Put ``block``'s ref once there is room; False (not put) once the engine dataset ended.

        In a tuple, so that Ray passes it on as a ref (a ref given as an argument itself is resolved
        first, here in the queue's actor)."""
        while True:
            try:
                self._queue.put((block,), timeout=PUT_WAIT_SECONDS)
                return True
            except queue.Full:
                if not engine_running():
                    return False


def _blocks_from_queue(_: pa.Table, gate: Queue) -> Iterator[Any]:  # Any: a Ray Data block
    """A gate task: the blocks it takes from the queue, until it takes an end mark."""
    import ray

    while (item := gate.get()) is not None:
        block = ray.get(item[0])
        if len(block):
            yield block
