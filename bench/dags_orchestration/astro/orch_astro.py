"""astro-provider-ray's SubmitRayJob on the trivial job (bench/orchestration_vs_astro.py).

Parsed only by the astro virtualenv (.venvs/astro): this provider is not installed there.
SubmitRayJob always defers to its RayJobTrigger when it waits for completion (no ``deferrable`` flag).
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import dag
from ray_provider.operators import SubmitRayJob

#: The same trivial job as bench/dags_orchestration/ours/orch_ours.py: a driver that sleeps.
ENTRYPOINT = 'python -c "import time; time.sleep(20)"'


# poll_interval: SubmitRayJob's own default (60 s) and 5 s.
def _make(dag_id: str, **kwargs: int) -> None:
    @dag(dag_id=dag_id, schedule=None, start_date=datetime(2026, 1, 1), catchup=False, tags=["bench"])
    def _orchestration() -> None:
        SubmitRayJob(
            task_id="submit_ray_job", conn_id="ray_default", entrypoint=ENTRYPOINT, runtime_env={}, **kwargs
        )

    _orchestration()


_make("orch_astro_default")
_make("orch_astro_poll5", poll_interval=5)
