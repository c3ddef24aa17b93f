"""`airflow standalone` (API server, scheduler with LocalExecutor, dag processor, triggerer) for tests.

On SQLite, with the repository's dags/ folder and the provider installed; the caller adds settings
(auth, variables) through ``extra_env``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO
from urllib.parse import quote

import httpx

from tests.conftest import AIRFLOW_BIN, ROOT, install_warm_engine_policy
from tests.run_record import note


@dataclass(frozen=True)
class Airflow:
    url: str
    home: Path
    headers: dict[str, str] = field(default_factory=dict)  # e.g. a bearer token

    def api(self, method: str, path: str, **kwargs) -> httpx.Response:
        """One REST call; a 5xx is tried again twice. `airflow standalone` runs on SQLite, where a write
        waits at most 5 s for a lock the scheduler holds, and then the API answers 500 (seen in CI: the
        audit-log INSERT of a POST dagRuns, before the run is created). A call may wait 120 s: on a
        loaded 2-core machine the API server once took over 30 s to answer."""
        for attempt in range(3):
            response = httpx.request(
                method, f"{self.url}/api/v2{path}", timeout=120, headers=self.headers, **kwargs
            )
            if response.status_code < 500 or attempt == 2:
                break
            time.sleep(2)
        response.raise_for_status()
        return response

    def wait(self, what: str, check: Callable[[], object], timeout: float = 600, every: float = 3):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (value := check()) is not None:
                return value
            time.sleep(every)
        raise AssertionError(f"gave up waiting for {what} after {timeout} s")

    def trigger(self, dag_id: str, day: str, conf: dict) -> str:
        self.api("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
        body = {"logical_date": f"{day}T00:00:00Z", "conf": conf}
        return self.api("POST", f"/dags/{dag_id}/dagRuns", json=body).json()["dag_run_id"]

    def task_instance(self, dag_id: str, run_id: str, task_id: str) -> dict:
        return self.api("GET", f"/dags/{dag_id}/dagRuns/{quote(run_id)}/taskInstances/{task_id}").json()

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int) -> str:
        """A try's log as the UI shows it (the worker's lines, then the triggerer's)."""
        path = f"/dags/{dag_id}/dagRuns/{quote(run_id)}/taskInstances/{task_id}/logs/{try_number}"
        content = self.api("GET", path, params={"full_content": "true"}).json()["content"]
        return "\n".join(
            str(entry.get("event", "")) if isinstance(entry, dict) else str(entry) for entry in content
        )

    def exits_taken(self, dag_id: str, run_id: str, try_number: int) -> int:
        """How many exits of the try's task processes the scheduler has taken from its executor (a
        deferring process's, then the resumed one's), read from the scheduler's lines in standalone.log:
        the REST API does not show it."""
        key = f"TaskInstanceKey(dag_id='{dag_id}', task_id="
        run = f"run_id='{run_id}', try_number={try_number},"
        lines = (self.home / "standalone.log").read_text(errors="replace").splitlines()
        exits = ("Received executor event with state success", "Received executor event with state failed")
        return sum(
            line.split(" for task instance ")[0].endswith(exits) and key in line and run in line
            for line in lines
        )

    def why(self, dag_id: str, run_id: str, task_id: str, try_number: int, lines: int = 60) -> str:
        """What to print when a try ended other than expected: the try's log and the end of the
        deployment's own log (its triggerer's and scheduler's lines), since the test's temporary
        folders, and the logs in them, are gone by the time anyone reads CI's output."""
        try:
            task_log = self.task_log(dag_id, run_id, task_id, try_number)
        except httpx.HTTPError as err:
            task_log = f"(the try's log could not be read: {err})"
        standalone = (self.home / "standalone.log").read_text(errors="replace").splitlines()[-lines:]
        return f"try {try_number}'s log:\n{task_log}\n\nstandalone.log, last {lines} lines:\n" + "\n".join(
            standalone
        )

    def clear(self, dag_id: str, run_id: str, task_id: str) -> None:
        """Clear one task of a run, with what the UI's "Clear" sends: the task runs again as a new try."""
        body = {
            "dry_run": False,
            "task_ids": [task_id],
            "dag_run_id": run_id,
            "only_failed": False,
            "reset_dag_runs": True,
        }
        self.api("POST", f"/dags/{dag_id}/clearTaskInstances", json=body)


def _refuse_a_taken_port(port: int) -> None:
    """Fail at once when something already listens on ``port``: the tests would otherwise talk to it (a
    leftover Airflow of an interrupted run, whose home is gone, answered every call with a 500)."""
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", port)) == 0:
            raise RuntimeError(
                f"port {port} is already in use: stop what listens there (a leftover Airflow?)"
            )


@dataclass(frozen=True)
class Deployment:
    """One `airflow standalone` to start: its home, API port, ``ray_default`` connection, the DAGs it
    must have parsed before it counts as up, the caller's settings (auth, variables), and how to get an
    API token once the server is up (None: the API needs none)."""

    home: Path
    port: int
    ray_connection_json: str
    dag_ids: set[str]
    extra_env: dict[str, str]
    token: Callable[[Airflow], str] | None = None


class Standalones:
    """Deployments started side by side, each waited for when first asked for, all stopped by
    :meth:`close`: a start is mostly each process importing Airflow and the API server building its
    app, so two side by side are up sooner than one after the other, and one started before its tests
    need it is up by then."""

    def __init__(self) -> None:
        self._started: list[tuple[subprocess.Popen, IO[str]]] = []
        self._ports: set[int] = set()  # the started ones' API ports
        self._up: dict[int, Airflow] = {}  # by API port

    def start(self, *deployments: Deployment) -> None:
        """Start those of ``deployments`` not started yet."""
        for deployment in deployments:
            if deployment.port not in self._ports:
                self._started.append(_start(deployment))
                self._ports.add(deployment.port)

    def up(self, deployment: Deployment) -> Airflow:
        """The started ``deployment`` once its API answers and its DAGs are parsed."""
        if deployment.port not in self._up:
            self._up[deployment.port] = _wait_until_up(deployment)
        return self._up[deployment.port]

    def close(self) -> None:
        for process, _ in self._started:
            os.killpg(process.pid, signal.SIGTERM)
        for process, log in self._started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
            _end_process_group(process.pid, grace_seconds=5)
            log.close()
        self._started.clear()
        self._ports.clear()


def _start(deployment: Deployment) -> tuple[subprocess.Popen, IO[str]]:
    _refuse_a_taken_port(deployment.port)
    note("standalone_start", port=deployment.port)
    home, port = deployment.home, deployment.port
    install_warm_engine_policy(home)
    env = {
        **os.environ,
        "PATH": f"{AIRFLOW_BIN.parent}:{os.environ['PATH']}",  # standalone starts `airflow` subcommands
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        # Its DAG files are in place before it starts and never change: each is parsed once, not
        # every 30 s (Airflow's default) for the whole session beside the jobs on 2 cores.
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "60",
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "3600",
        # A task's first call to the execution API (its "run" state, a SQLite write) waits for the
        # scheduler's and the dag processor's writes; on a loaded 2-core machine it ran past the 5 s
        # default five times and the task failed before it started, its log one "Pre Execute" line
        # (as in test_two_deployments; Airflow's own advice for timeouts under load).
        "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",
        "AIRFLOW_CONN_RAY_DEFAULT": deployment.ray_connection_json,
        **deployment.extra_env,
    }
    log = (home / "standalone.log").open("w")
    process = subprocess.Popen(
        [str(AIRFLOW_BIN), "standalone"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=home,
    )
    return process, log


def _wait_until_up(deployment: Deployment) -> Airflow:
    """The deployment once its API answers and its DAGs are parsed (with the token's header, if any)."""
    instance = Airflow(f"http://127.0.0.1:{deployment.port}", deployment.home)

    def ready() -> Airflow | None:
        try:
            client = (
                Airflow(
                    instance.url, deployment.home, {"Authorization": f"Bearer {deployment.token(instance)}"}
                )
                if deployment.token
                else instance
            )
            ids = {d["dag_id"] for d in client.api("GET", "/dags", params={"limit": 100}).json()["dags"]}
        except httpx.HTTPError:
            return None
        return client if deployment.dag_ids <= ids else None

    return instance.wait("the API server and the parsed DAGs", ready, timeout=300)


def _end_process_group(group: int, grace_seconds: float) -> None:
    """Wait for what is left of the group to end, then kill it. standalone may restart a component
    that its SIGTERM ended before it ends itself: that scheduler never got the signal, outlived the
    test with its executor's idle workers (a dozen LocalExecutor processes to
    the run's end). The grace is short: the home is thrown away, and a graceful end of every
    component took 15-27 s of each test's teardown."""
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)
