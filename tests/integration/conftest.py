"""Fixtures for tests on the real parts: a local Ray head (token auth on), the tiny model, Airflow.

The tests run in .venvs/airflow; the cluster runs from .venvs/ray (scripts/setup_envs.sh makes both).
The cluster uses its own ports so a running demo cluster is not mistaken for it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RAY_PYTHON = ROOT / ".venvs" / "ray" / "bin" / "python"
AIRFLOW_BIN = Path(sys.executable).parent / "airflow"
DASHBOARD_PORT = 8275


@dataclass(frozen=True)
class LocalRayCluster:
    address: str
    token: str
    state_dir: Path

    def connection_json(self, token: str | None = None) -> str:
        host, port = self.address.removeprefix("http://").split(":")
        return json.dumps(
            {"conn_type": "ray", "host": host, "port": int(port), "password": token or self.token}
        )


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRayCluster]:
    state = tmp_path_factory.mktemp("ray-state")
    env = {
        **os.environ,
        "RAYBATCH_STATE": str(state),
        "RAYBATCH_DASHBOARD_PORT": str(DASHBOARD_PORT),
        "RAYBATCH_GCS_PORT": "6390",
        "RAYBATCH_CLIENT_PORT": "23001",
    }
    script = ROOT / "scripts" / "local_ray_cluster.sh"
    subprocess.run([str(script), "start"], env=env, check=True, timeout=180)
    try:
        yield LocalRayCluster(
            address=f"http://127.0.0.1:{DASHBOARD_PORT}",
            token=(state / "auth_token").read_text().strip(),
            state_dir=state,
        )
    finally:
        subprocess.run([str(script), "stop"], env=env, check=False, timeout=120)


@pytest.fixture
def ray_connection(ray_cluster: LocalRayCluster, monkeypatch: pytest.MonkeyPatch) -> LocalRayCluster:
    """Point the ``ray_default`` Airflow connection at the local cluster, for in-process hooks."""
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", ray_cluster.connection_json())
    return ray_cluster


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("model") / "tiny-llama"
    subprocess.run(
        [str(RAY_PYTHON), str(ROOT / "scripts" / "make_tiny_model.py"), str(out)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out


#: Engine settings that fit vLLM's CPU build on a shared 2-core, 24 GiB machine.
CPU_ENGINE_KWARGS = {"max_model_len": 512, "gpu_memory_utilization": 0.3, "enforce_eager": True}
CPU_REPLICA = {"CPU": 1}


@dataclass(frozen=True)
class AirflowEnv:
    env: dict[str, str]
    home: Path

    def dags_test(self, dag_id: str, day: str, conf: dict, timeout: int = 900) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(AIRFLOW_BIN), "dags", "test", dag_id, day, "--conf", json.dumps(conf)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


@pytest.fixture(scope="session")
def airflow_env(ray_cluster: LocalRayCluster, tmp_path_factory: pytest.TempPathFactory) -> AirflowEnv:
    home = tmp_path_factory.mktemp("airflow-home")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW_CONN_RAY_DEFAULT": ray_cluster.connection_json(),
    }
    subprocess.run([str(AIRFLOW_BIN), "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    return AirflowEnv(env=env, home=home)


def submit_pipeline(operator, run_key: str, submission_id: str) -> str:
    """Submit the operator's pipeline job exactly as the operator would (spec, entrypoint, runtime_env)."""
    from airflow_provider_raybatch.hooks.ray import RayHook

    hook = RayHook()
    spec = operator.build_spec(run_key=run_key)
    return hook.submit_job(
        operator.entrypoint(spec), submission_id=submission_id, runtime_env=operator._runtime_env(hook, spec)
    )


def wait_for_job(job_id: str, timeout: float = 840):
    """Poll until the job ends; returns its JobStatus."""
    import time

    from airflow_provider_raybatch.hooks.ray import RayHook

    hook = RayHook()
    deadline = time.monotonic() + timeout
    while not (status := hook.get_job_status(job_id)).is_terminal:
        if time.monotonic() > deadline:
            raise AssertionError(f"Ray job {job_id} still {status.value} after {timeout} s")
        time.sleep(1)
    return status
