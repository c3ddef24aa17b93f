"""scripts/local_ray_cluster.sh: two clusters on one machine, and `stop` ends only its own.

`ray stop --force` ends every Ray on the machine; the script's `stop` used it, and a test run's
teardown once ended a benchmark's cluster mid-run. Both clusters here also take jobs,
which needs a dashboard agent port of their own, and a job's driver must reach its own cluster: Ray's
job supervisor finds it through ``<temp dir>/ray_current_cluster``, which in a shared /tmp/ray names
whichever cluster started last (another cluster on the machine would take every CI job's driver to
the wrong GCS).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import DASHBOARD_PORT, GCS_PORT, LocalRayCluster

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "local_ray_cluster.sh"
#: The cluster this test starts and stops; the other is the session's (tests/conftest.py ray_cluster).
PORTS = ({"dashboard": 8321, "gcs": 6421, "client": 23031}, {"dashboard": DASHBOARD_PORT, "gcs": GCS_PORT})
# Not adjacent dashboard ports: a worker node's agent takes its head's agent port + 1 (the script).


def _alive_nodes(state: Path, dashboard_port: int) -> int:
    """The nodes the head's state API lists alive, now."""
    token = (state / "auth_token").read_text().strip()
    body = httpx.get(
        f"http://127.0.0.1:{dashboard_port}/api/v0/nodes",
        params={"limit": 10000},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    ).json()
    return sum(row["state"] == "ALIVE" for row in body["data"]["result"]["result"])


def _env(state: Path, ports: dict[str, int]) -> dict[str, str]:
    return {
        **os.environ,
        "RAYBATCH_STATE": str(state),
        "RAYBATCH_DASHBOARD_PORT": str(ports["dashboard"]),
        "RAYBATCH_GCS_PORT": str(ports["gcs"]),
        "RAYBATCH_CLIENT_PORT": str(ports["client"]),
        "RAYBATCH_NUM_CPUS": "1",
    }


def _answers(port: int) -> bool:
    try:
        httpx.get(f"http://127.0.0.1:{port}/api/version", timeout=3)
    except httpx.HTTPError:
        return False
    return True  # any answer (401 included: token auth) means the dashboard is up


def _port_free(port: int) -> bool:
    """No process listens on ``port`` (TCP, any address).

    Asked of the kernel's socket table, not by binding the port: a bind also fails on an outgoing
    connection that happens to have the port as its ephemeral source (52422 is in Linux's ephemeral
    range), and on a killed agent's accepted connections lingering in TIME_WAIT.
    """
    listening = subprocess.run(
        ["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout
    return not listening.strip()


def _agents() -> str:
    """The Ray agents still running (their titles) and the ports they listen on, for a failure's message."""
    titles = subprocess.run(["pgrep", "-fa", "ray::.*Agent"], capture_output=True, text=True).stdout
    listening = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    return f"{titles}\nlistening:\n{listening}"


# A driver, as our pipeline's is: ray.init() with no address, then the GCS it reached.
_DRIVER = "python -c 'import ray; ray.init(); print(\"GCS\", ray.get_runtime_context().gcs_address)'"


def _run_driver(state: Path, port: int) -> str:
    """Submit :data:`_DRIVER` to the cluster whose dashboard is on ``port``; its status and log."""
    headers = {"Authorization": f"Bearer {(state / 'auth_token').read_text().strip()}"}
    base = f"http://127.0.0.1:{port}/api/jobs/"
    reply = httpx.post(base, json={"entrypoint": _DRIVER}, headers=headers, timeout=60)
    reply.raise_for_status()
    job_id = reply.json()["submission_id"]
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        status = httpx.get(base + job_id, headers=headers, timeout=30).json()["status"]
        if status in {"SUCCEEDED", "FAILED", "STOPPED"}:
            logs = httpx.get(base + job_id + "/logs", headers=headers, timeout=30).json()["logs"]
            return f"{status}\n{logs}"
        time.sleep(1)
    return "still running after 180 s"


@pytest.fixture
def two_clusters(ray_cluster: LocalRayCluster, tmp_path: Path) -> Iterator[list[tuple[Path, dict[str, str]]]]:
    """A cluster of the test's own, started after the session's (the other one): both take jobs."""
    own = (tmp_path / "state-0", _env(tmp_path / "state-0", PORTS[0]))
    try:
        subprocess.run([str(SCRIPT), "start"], env=own[1], check=True, timeout=180, capture_output=True)
        yield [own, (ray_cluster.state_dir, ray_cluster.env)]
    finally:
        subprocess.run([str(SCRIPT), "stop"], env=own[1], timeout=120, capture_output=True)


def test_stop_ends_its_own_cluster_and_leaves_the_other_running(
    two_clusters: list[tuple[Path, dict[str, str]]],
) -> None:
    (first_state, first_env), (second_state, _) = two_clusters
    first_port, second_port = PORTS[0]["dashboard"], PORTS[1]["dashboard"]
    # Each cluster's driver reaches its own cluster, though another started after the session's.
    first = _run_driver(first_state, first_port)
    assert first.startswith("SUCCEEDED") and f":{PORTS[0]['gcs']}" in first, first[-2000:]
    second = _run_driver(second_state, second_port)  # through its own dashboard agent
    assert second.startswith("SUCCEEDED") and f":{PORTS[1]['gcs']}" in second, second[-2000:]

    # A second raylet in the first cluster: `stop` once left the head's dashboard and runtime-env
    # agents running, holding the agent port, as they rename themselves.
    added = subprocess.run(
        [str(SCRIPT), "add-worker"],
        env={**first_env, "RAYBATCH_WORKER_CPUS": "1"},
        check=True,
        timeout=180,
        capture_output=True,
        text=True,
    )
    # It returns once the head lists the node (it used to return ~5 s before).
    assert "(2 nodes alive)" in added.stdout and _alive_nodes(first_state, first_port) == 2, added.stdout
    agent_ports = [first_port + 44100, first_port + 44101]  # the head's and the worker's agents
    assert not any(_port_free(port) for port in agent_ports)

    # remove-workers ends that node alone (test_multinode's teardown): the head still runs jobs.
    removed = subprocess.run(
        [str(SCRIPT), "remove-workers"], env=first_env, timeout=120, capture_output=True, text=True
    )
    assert removed.returncode == 0, removed.stderr
    assert _port_free(agent_ports[1]) and not _port_free(agent_ports[0]), _agents()
    assert _run_driver(first_state, first_port).startswith("SUCCEEDED")
    subprocess.run(
        [str(SCRIPT), "add-worker"],
        env={**first_env, "RAYBATCH_WORKER_CPUS": "1"},
        check=True,
        timeout=180,
        capture_output=True,
    )
    assert _alive_nodes(first_state, first_port) == 2  # the removed node is dead, the new one alive

    stopped = subprocess.run(
        [str(SCRIPT), "stop"], env=first_env, timeout=120, capture_output=True, text=True
    )

    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stderr == ""
    assert not _answers(first_port)
    assert all(_port_free(port) for port in agent_ports), _agents()
    assert _answers(second_port)
    assert _run_driver(second_state, second_port).startswith("SUCCEEDED")
