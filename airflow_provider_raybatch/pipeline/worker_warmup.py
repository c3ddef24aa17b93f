"""Start the job's Ray worker processes at the driver's start, with the modules its tasks import.

Ray starts a job's workers on demand, one process per task it cannot give to an idle worker, each with
the job's runtime env: Python, then ``ray.data`` and our row code on its first task. A warm job (its
engine already up in a pool, :mod:`.generate.engine_pool`) pays those starts in its critical path
twice: for the read, and again when its engine dataset begins (its filter, batch and preprocess tasks
find no idle worker: the read left one, which the engine stage's actor takes). On the 2-core VM that
was 4.9 s of the 6.0 s from the engine stage's start to the first row (a warm job of 2,000 rows; 1.4
to 3.4 s with four warm workers, but its read took 2.3 s longer: see :data:`WARM_WORKERS`).

So the driver (``pipeline/__main__.py``) asks for a few workers as soon as it is connected, before
it imports Ray Data and the pipeline and before it reads anything: each runs a task that
imports those modules and holds its worker for a moment, so that Ray starts them side by side instead
of reusing the first. They end as idle workers of this job, which Ray keeps (up to a node's CPU count)
and hands the job's next tasks and actors. Nothing waits for them: a busy cluster runs them later, and
a failed one changes nothing.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from airflow_provider_raybatch.shared import job_settings

if TYPE_CHECKING:
    import ray

    from airflow_provider_raybatch.shared.specs import BatchInferenceSpec

#: How many workers to start: the engine dataset's first operators (filter, batching, preprocess, the
#: engine stage's actor, the reports) each want one at once. Fewer on a small machine (a quarter of
#: the driver's cores): there the warm-up's imports take cores from the driver and the read itself
#: (on the 2-core VM, reading and preparing 2,000 rows went from ~2.3 to ~5 s). ``RAYBATCH_WARM_WORKERS``
#: in the job's environment sets it; 0 starts none.
WARM_WORKERS = 4
WARM_WORKERS_ENV = "RAYBATCH_WARM_WORKERS"
WARM_WORKERS_LIMIT = job_settings.MAXIMA[WARM_WORKERS_ENV]
#: How long each warm-up task holds its worker, so that the others cannot reuse it (seconds).
HOLD_SECONDS = 0.5


def configured_workers(replicas: int = 1) -> int:
    """The job's ``RAYBATCH_WARM_WORKERS`` (a whole number from 0 to 64), else :data:`WARM_WORKERS`
    plus one for each engine replica past the first (each has its engine-stage actor), at most a
    quarter of this machine's cores."""
    default = min(WARM_WORKERS + max(replicas, 1) - 1, (os.cpu_count() or 1) // 4)
    return job_settings.whole_number(WARM_WORKERS_ENV, default, WARM_WORKERS_LIMIT)


def replicas_of(spec: BatchInferenceSpec) -> int:
    """How many engine replicas the spec asks for at most (``concurrency``: n, or (min, max)); 1 where
    it leaves them to the default layout, which is chosen later, as the run starts."""
    from airflow_provider_raybatch.pipeline.generate.stage_swap import fixed_pool

    return fixed_pool(spec.concurrency or 1)[1]


def _warm_up(hold_seconds: float) -> int:
    """In a worker: import what the job's tasks import; its process id."""
    import ray.data  # noqa: F401 - imported for the job's Ray Data tasks

    from airflow_provider_raybatch.pipeline import row_steps  # noqa: F401 - the rows' own code

    time.sleep(hold_seconds)
    return os.getpid()


def start(workers: int, hold_seconds: float = HOLD_SECONDS) -> list[ray.ObjectRef]:
    """Ask Ray for ``workers`` warm workers of this job; returns at once, with the tasks' refs."""
    import ray

    task = ray.remote(num_cpus=0.01, max_retries=0)(_warm_up)  # a sliver: never waits on an engine's CPUs
    return [task.remote(hold_seconds) for _ in range(workers)]
