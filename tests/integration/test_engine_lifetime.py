"""A replica SIGKILLed mid-job, with no raylet clean-up to hide it, takes its EngineCore with it.

On a real cluster Ray's per-worker process-group clean-up ends the replica's EngineCore and worker
after the replica dies, but only while the raylet lives (``ray stop --force``, a node lost: no
clean-up). A cluster of its own, started with that clean-up off, shows what the EngineCore does by
itself (pipeline/generate/engine_lifetime.py). The machine is shared: only this cluster's processes
(found by its token path) are looked at, and only the ones recorded are killed.

Each job lets no replica be restarted (``RAYBATCH_ENGINE_MAX_RESTARTS=0``): a restarted replica's
engine would build beside the checks, and the first kill also shows that bound fail the job, saying
why (Ray Data's own default restarts a replica without end: an engine that crashes on every start
kept a job running with nothing done, bench/RESULTS.md 7f).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from airflow_provider_raybatch.hooks.ray import JobStatus, RayHook
from airflow_provider_raybatch.operators.llm_batch import RayLLMBatchOperator
from airflow_provider_raybatch.pipeline.generate.engine import ENGINE_MAX_RESTARTS_ENV
from tests.conftest import (
    CPU_ENGINE_KWARGS,
    CPU_REPLICA,
    ROOT,
    LocalRayCluster,
    submit_pipeline,
    wait_for_job,
)

# Its own cluster (the raylet's process-group clean-up off): each test's subject is an engine replica's
# processes, from a cold start to their end.
pytestmark = [pytest.mark.integration, pytest.mark.cold_engine, pytest.mark.timeout(900)]

#: This cluster's own ports (apart from the session cluster's and the benchmarks' 8285; its dashboard
#: agent's: 8323 + 44100) and Ray folder (scripts/local_ray_cluster.sh: one per cluster on the machine).
_CLUSTER_ENV = {
    "RAYBATCH_DASHBOARD_PORT": "8323",
    "RAYBATCH_GCS_PORT": "6423",
    "RAYBATCH_CLIENT_PORT": "23033",
    "RAYBATCH_RAY_TEMP_DIR": "/tmp/ray-raybatch-lifetime",
    # The engine core with a worker process under it, as a GPU engine of several GPUs has (the CPU
    # engine runs its model in the engine core on the other clusters: scripts/local_ray_cluster.sh).
    "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
}
_REPLICA = "ray::MapWorker(MapBatches(RaybatchvLLMEngineStageUDF"


@pytest.fixture(scope="module")
def cluster_without_group_cleanup(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> LocalRayCluster:
    """The session cluster's script on ports of its own, with the raylet's process-group clean-up off."""
    state = tmp_path_factory.mktemp("ray-state-no-pg-cleanup")
    env = {
        **os.environ,
        "RAYBATCH_STATE": str(state),
        **_CLUSTER_ENV,
        "RAY_process_group_cleanup_enabled": "false",
    }
    script = str(ROOT / "scripts" / "local_ray_cluster.sh")
    request.addfinalizer(lambda: subprocess.run([script, "stop"], env=env, check=False, timeout=120))
    subprocess.run([script, "start"], env=env, check=True, timeout=180)
    return LocalRayCluster(
        address=f"http://127.0.0.1:{_CLUSTER_ENV['RAYBATCH_DASHBOARD_PORT']}",
        token=(state / "auth_token").read_text().strip(),
        state_dir=state,
        env=env,
        temp_dir=Path(_CLUSTER_ENV["RAYBATCH_RAY_TEMP_DIR"]),
    )


def _ours(process: psutil.Process, token_path: str) -> bool:
    with contextlib.suppress(psutil.Error):
        return process.environ().get("RAY_AUTH_TOKEN_PATH") == token_path
    return False


def _replica_with_a_worker(token_path: str, timeout: float) -> tuple[psutil.Process, list[psutil.Process]]:
    """This cluster's engine replica once its vLLM worker runs, and every process under it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for process in psutil.process_iter(["cmdline"]):
            if " ".join(process.info["cmdline"] or []).startswith(_REPLICA) and _ours(process, token_path):
                with contextlib.suppress(psutil.Error):
                    under = process.children(recursive=True)
                    if any("VLLM::Worker" in " ".join(child.cmdline()) for child in under):
                        return process, under
        time.sleep(0.5)
    raise AssertionError(f"no engine replica with a VLLM::Worker in {timeout} s")


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _still_alive(recorded: list[psutil.Process], titles: list[str], seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    while (alive := [process for process in recorded if _alive(process)]) and time.monotonic() < deadline:
        time.sleep(0.5)
    return [
        f"{process.pid} {title[:80]}"
        for process, title in zip(recorded, titles, strict=True)
        if process in alive
    ]


@contextlib.contextmanager
def _engine_replica_of_a_job(
    cluster: LocalRayCluster, model: Path, folder: Path
) -> Iterator[tuple[str, psutil.Process, list[psutil.Process], list[str]]]:
    """A job of this cluster's whose one replica runs its vLLM worker: (job id, replica, the processes
    under it, their command lines). Afterwards the job is stopped and what was recorded is killed."""
    rows = [
        {"id": f"r{i}", "messages": [{"role": "user", "content": f"Count to {i}."}]} for i in range(10000)
    ]
    (folder / "in.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    operator = RayLLMBatchOperator(
        task_id="generate",
        model=str(model),
        input_uri=str(folder / "in.jsonl"),
        output_uri=str(folder / "out"),
        messages_column="messages",
        id_column="id",
        sampling_params={"temperature": 0, "max_tokens": 32},
        engine_kwargs=CPU_ENGINE_KWARGS,
        replica_resources=CPU_REPLICA,
        concurrency=1,
        runtime_env={"env_vars": {ENGINE_MAX_RESTARTS_ENV: "0"}},
    )
    job_id = submit_pipeline(operator, "lifetime", f"lifetime-{uuid.uuid4().hex[:8]}")
    recorded: list[psutil.Process] = []
    try:
        replica, recorded = _replica_with_a_worker(str(cluster.state_dir / "auth_token"), timeout=420)
        yield job_id, replica, recorded, [" ".join(process.cmdline()) for process in recorded]
    finally:
        with contextlib.suppress(Exception):
            RayHook().stop_job(job_id)
        for process in recorded:
            with contextlib.suppress(psutil.Error):  # psutil checks the start time before it signals
                process.kill()


def test_a_replica_killed_mid_job_takes_its_engine_core_worker_and_forkserver_with_it(
    cluster_without_group_cleanup: LocalRayCluster,
    tiny_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", cluster_without_group_cleanup.connection_json())
    with _engine_replica_of_a_job(cluster_without_group_cleanup, tiny_model, tmp_path) as job:
        job_id, replica, recorded, titles = job
        replica.kill()
        # SIGTERM: ~1-10 s; an EngineCore still starting: 20 s grace, then SIGKILL.
        assert _still_alive(recorded, titles, 45) == []
        # Restarted at most 0 times: the job fails at the first death, saying why, and commits nothing.
        hook = RayHook()
        assert wait_for_job(job_id, timeout=180) == JobStatus.FAILED, hook.get_job_log_tail(job_id, 60)
        log = hook.get_job_logs(job_id)
        assert "EngineStageFailed: The engine stage failed" in log, log[-3000:]
        assert f"restarted at most 0 times ({ENGINE_MAX_RESTARTS_ENV})" in log
        assert not (tmp_path / "out" / "manifest.json").exists()
        staged = [
            source
            for part in (tmp_path / "out" / "_staging" / "lifetime" / "parts").glob("*.json")
            for source in json.loads(part.read_text())["sources"]
        ]
        assert len(staged) == len(set(staged))  # kept for a retry, each row once


def test_an_engine_core_vllm_takes_for_dead_ends_with_its_replica(
    cluster_without_group_cleanup: LocalRayCluster,
    tiny_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The race seen in the wild, made certain: Ray kills the forkserver (as its exit does before the
    UDF's shutdown); vLLM then reads the EngineCore's status as dead and never signals it."""
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", cluster_without_group_cleanup.connection_json())
    with _engine_replica_of_a_job(cluster_without_group_cleanup, tiny_model, tmp_path) as job:
        job_id, replica, recorded, titles = job
        (forkserver,) = [
            p for p in replica.children() if "multiprocessing.forkserver" in " ".join(p.cmdline())
        ]
        forkserver.kill()
        time.sleep(5)  # vLLM's engine monitor reads the EngineCore's status pipe: "died", and shuts down
        RayHook().stop_job(job_id)
        wait_for_job(job_id, timeout=180)  # the driver gone, Ray ends the job's actors
        assert _still_alive(recorded, titles, 45) == []
