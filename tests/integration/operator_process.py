"""Run RayLLMBatchOperator.execute as a separate worker-like process, so a test can kill it.

usage: python operator_process.py PARAMS_JSON TRY_NUMBER
The task instance carries the ids a real one has; XComs are printed, one JSON line each.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field

from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator


@dataclass
class WorkerTaskInstance:
    dag_id: str
    run_id: str
    task_id: str
    try_number: int
    map_index: int = -1
    xcoms: dict = field(default_factory=dict)

    def xcom_push(self, key: str, value: object) -> None:
        print("XCOM " + json.dumps({"key": key, "value": value}), flush=True)


def main() -> None:
    params, try_number = json.loads(sys.argv[1]), int(sys.argv[2])
    operator = RayLLMBatchOperator(task_id="classify", deferrable=False, poll_interval_seconds=1, **params)
    ti = WorkerTaskInstance("fault_dag", "scheduled__2026-11-20T00:00:00+00:00", "classify", try_number)
    print("RESULT " + json.dumps(operator.execute({"ti": ti})), flush=True)


if __name__ == "__main__":
    main()
