"""The Airflow side's footprint: running the operator up to its deferral loads no cluster library.

Beyond importing the provider (test_lazy_imports.py), a worker runs ``RayLLMBatchOperator.execute``:
it validates the spec, zips and uploads the pipeline package, lists and submits jobs and defers to
the trigger. None of that may pull in Ray (``ray.data`` or any of ``ray``), vLLM, torch, transformers
or pyarrow. The scenario runs in a fresh interpreter against a tiny Ray Jobs REST API served from a
thread of that same process (the point is the import set, not Ray).

Run as a script, this module is that scenario: it prints one ``FOOTPRINT_REPORT=`` JSON line with the
heavy modules found and the process's peak RSS (``ru_maxrss``). bench/footprint.py reports the RSS;
this test asserts only the import set.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

HEAVY = ("ray", "vllm", "torch", "transformers", "pyarrow")  # "ray" covers ray.data
REPORT_MARKER = "FOOTPRINT_REPORT="
TRIGGER_PATH = "airflow_provider_raybatch.triggers.ray.RayJobTrigger"
#: The one node the fake cluster reports (Ray state API shape).
NODE = {
    "node_id": "0" * 56,
    "is_head_node": True,
    "state": "ALIVE",
    "labels": {},
    "resources_total": {"CPU": 16.0, "GPU": 1.0, "memory": 64e9, "accelerator_type:H100": 1.0},
}


def run_scenario() -> dict[str, Any]:  # Any: JSON report.
    """Serve a fake Jobs API, run the operator up to its deferral, report what got loaded."""
    import os
    import resource
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    submitted: list[dict[str, Any]] = []  # Any: JSON bodies.

    class FakeRayJobsAPI(BaseHTTPRequestHandler):
        """A cluster with no jobs and no packages: list, probe, upload and submit."""

        def _reply(self, status: int, payload: Any) -> None:  # Any: JSON payload.
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.path == "/api/jobs/":
                self._reply(200, [])
            elif self.path.startswith("/api/v0/nodes"):  # the operator's layout check: one GPU node
                self._reply(
                    200, {"result": True, "msg": "", "data": {"result": {"total": 1, "result": [NODE]}}}
                )
            elif self.path == "/api/version":
                self._reply(200, {"ray_version": "2.60.0", "version": "4"})
            else:
                self._reply(404, {"error": "not found"})  # the package probe: not uploaded yet

        def do_PUT(self) -> None:  # noqa: N802
            self._body()
            self._reply(200, {})

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self._body())
            submitted.append(body)
            self._reply(200, {"submission_id": body["submission_id"]})

        def log_message(self, *args: Any) -> None:  # Any: http.server's format arguments.
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeRayJobsAPI)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    os.environ["AIRFLOW_CONN_RAY_DEFAULT"] = json.dumps(
        {
            "conn_type": "ray",
            "host": "127.0.0.1",
            "port": server.server_address[1],
            "password": "footprint-token",
        }
    )

    from airflow.sdk.exceptions import TaskDeferred

    from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator

    class WorkerTI:
        dag_id, run_id, task_id = "daily_company_industry", "scheduled__2026-11-20T00:00:00+00:00", "classify"
        map_index, try_number = -1, 1
        xcoms: dict[str, Any] = {}  # Any: XCom values.

        def xcom_push(self, key: str, value: Any) -> None:  # Any: XCom values.
            self.xcoms[key] = value

    operator = RayLLMBatchOperator(
        task_id="classify",
        model="Qwen/Qwen2.5-1.5B-Instruct",
        input_uri="s3://my-bucket/customers/2026-11-20/customers.csv",
        output_uri="s3://my-bucket/company_industry/2026-11-20",
        system_prompt="You classify companies by industry. Answer with the label only.",
        user_template="What industry is this company in: {Company}",
        sampling_params={
            "temperature": 0,
            "max_tokens": 16,
            "structured_outputs": {"choice": ["Law Firm", "Other"]},
        },
        engine_kwargs='{"max_model_len": 4096}',
        id_column="Customer Id",
        keep_columns=["Company", "Country"],
        deferrable=True,
    )
    ti = WorkerTI()
    deferred_to = None
    try:
        operator.execute({"ti": ti})  # type: ignore[arg-type]
    except TaskDeferred as deferral:
        deferred_to = deferral.trigger.serialize()[0]
    finally:
        server.shutdown()
    return {
        "deferred_to": deferred_to,
        "submitted": len(submitted),
        "job_id": ti.xcoms.get("job_id"),
        "heavy_modules": sorted(name for name in sys.modules if name.split(".")[0] in HEAVY),
        "modules_loaded": len(sys.modules),
        "ru_maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }


def read_report(stdout: str) -> dict[str, Any]:  # Any: JSON report.
    lines = [line for line in stdout.splitlines() if line.startswith(REPORT_MARKER)]
    if not lines:
        raise AssertionError(f"the scenario printed no report:\n{stdout[-3000:]}")
    return json.loads(lines[-1].removeprefix(REPORT_MARKER))


def test_operator_up_to_deferral_loads_no_cluster_libraries(tmp_path: Path) -> None:
    env = {
        "AIRFLOW_HOME": str(tmp_path),
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "AIRFLOW__RAYBATCH__JOB_IDENTITY_SECRET": "footprint-test-secret",
    }
    result = subprocess.run([sys.executable, __file__], capture_output=True, text=True, timeout=180, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    report = read_report(result.stdout)
    assert report["deferred_to"] == TRIGGER_PATH
    assert report["submitted"] == 1
    assert report["job_id"].startswith("raybatch-daily_company_industry-classify-")
    assert report["heavy_modules"] == []


if __name__ == "__main__":
    print(REPORT_MARKER + json.dumps(run_scenario()), flush=True)
