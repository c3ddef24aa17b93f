"""The session's two `airflow standalone` deployments, each started once and shared by the tests that
need a real scheduler (a start costs a 2-core machine 80-100 s); where a session's tests use both, both
start at the first one's first request (:func:`_deployment_up`). Each has its own home, so its own
generated fernet key that signs its job identities (no ``[raybatch] job_identity_secret``): they are
two deployments of one Ray head, as test_two_deployments needs. Each test keeps to its own DAG ids,
dates or users.

- ``shared_airflow``: the example DAGs and tests/integration/dags/; the OpenAI Batch API on a local
  folder, its batches on the tiny model on the session's cluster (test_openai_batch_api); the UI and
  scheduler tests (test_airflow_ui); prod in test_two_deployments.
- ``second_airflow``: the Batch API as an attacker meets it, its store on the S3 server,
  with small limits and a batch DAG whose Ray connection is a closed port, so that nothing there
  needs a job to run (tests/security/test_openai_api.py); and dev in test_two_deployments, whose
  ticket DAG runs on the session's cluster.

Registered for every test by tests/conftest.py's ``pytest_plugins``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from airflow_provider_raybatch.openai_api.settings import DEFAULT_DAG_ID
from tests.conftest import (
    CPU_ENGINE_KWARGS,
    CPU_REPLICA,
    PARAM_DEFAULTS_FILE,
    ROOT,
    LocalRayCluster,
    S3Server,
    warm_conf,
)
from tests.integration.standalone import Airflow, Deployment, Standalones

SHARED_PORT = 8299
SECOND_PORT = 8311
TICKETS_DAG_ID = "daily_support_ticket_summary"
#: Users of each deployment: (role, password).
SHARED_USERS = {
    "admin": ("admin", "admin-pass-0"),  # the REST API and the browser
    "batchuser": ("admin", "batch-pass-1"),
    "reader": ("viewer", "reader-pass-2"),
}
SECOND_USERS = {
    "alice": ("user", "alice-pass-1"),
    "bob": ("user", "bob-pass-2"),
    "carol": ("user", "carol-pass-5"),
    "dave": ("user", "dave-pass-6"),
    "erin": ("user", "erin-pass-7"),
    "ops": ("op", "ops-pass-3"),  # the REST API
    "viewer": ("viewer", "viewer-pass-4"),
}
#: The second deployment's Batch API: its store, and limits small enough to reach in a test.
STORE_CONN_ID = "raybatch_security_store"
STORE_BUCKET = "sec-store"
MAX_UPLOAD_BYTES = 100_000
MAX_BODY_BYTES = 8192
MAX_FILES_PER_USER = 12
MAX_OPEN_BATCHES_PER_USER = 2
#: Its batch DAG's Ray connection: nothing listens there, so a batch that submits fails at once.
CLOSED_RAY_CONN_ID = "ray_closed"
CLOSED_RAY = json.dumps(
    {
        "conn_type": "ray",
        "host": "127.0.0.1",
        "port": 9,
        "password": "t",
        "extra": {"retry_window_seconds": 0},
    }
)


#: Tickets a day for the ticket DAG's scheduled runs on the shared deployment (test_airflow_ui).
SCHEDULED_TICKETS = 30


def scheduled_data_root(airflow: Airflow) -> Path:
    """Where the shared deployment's scheduled ticket runs read and write (its Param default)."""
    return airflow.home / "data"


def _write_scheduled_days(data_root: Path) -> None:
    """Tickets for the days around now, each ticket id starting with its day, so a test sees which day
    a scheduled run read (and a session that passes midnight still finds its day's tickets)."""
    today = datetime.now(UTC).date()
    for offset in (-1, 0, 1):
        day = (today + timedelta(days=offset)).isoformat()
        path = data_root / "tickets" / day / "tickets.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        tickets = [
            {"ticket_id": f"{day}/T-{i:03d}", "subject": f"Order {i} late", "body": f"Order {i} is late."}
            for i in range(SCHEDULED_TICKETS)
        ]
        path.write_text("".join(json.dumps(ticket) + "\n" for ticket in tickets))


def user_token(airflow: Airflow, user: str) -> str:
    """A JWT for ``user`` from the simple auth manager's ``/auth/token``, as a client logs in."""
    users = SHARED_USERS if airflow.url.endswith(f":{SHARED_PORT}") else SECOND_USERS
    response = httpx.post(
        f"{airflow.url}/auth/token", json={"username": user, "password": users[user][1]}, timeout=30
    )
    response.raise_for_status()
    return response.json()["access_token"]


def _auth_env(home: Path, users: dict[str, tuple[str, str]]) -> dict[str, str]:
    passwords = home / "passwords.json"
    passwords.write_text(json.dumps({user: password for user, (_, password) in users.items()}))
    return {
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(
            f"{user}:{role}" for user, (role, _) in users.items()
        ),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        # Unset: the home's generated fernet_key signs its job identities.
        "AIRFLOW__RAYBATCH__JOB_IDENTITY_SECRET": "",
    }


@pytest.fixture(scope="session")
def _standalones() -> Iterator[Standalones]:
    standalones = Standalones()
    yield standalones
    standalones.close()


#: Each deployment's fixture, and the fixture that sets its home up (started by neither).
_SET_UP = {"shared_airflow": "shared_deployment", "second_airflow": "second_deployment"}


def _session_uses(request: pytest.FixtureRequest, fixture: str) -> bool:
    return any(fixture in getattr(item, "fixturenames", ()) for item in request.session.items)


def _deployment_up(request: pytest.FixtureRequest, fixture: str) -> Airflow:
    """``fixture``'s deployment, up. The first request starts every deployment the session's tests use
    (a file run alone starts its own only): the second is up by the time its tests come, its start
    spread over the first one's tests instead of waited for (80-100 s of a 2-core machine)."""
    standalones: Standalones = request.getfixturevalue("_standalones")
    wanted = [name for name in _SET_UP if name == fixture or _session_uses(request, name)]
    standalones.start(*(request.getfixturevalue(_SET_UP[name]) for name in wanted))
    return standalones.up(request.getfixturevalue(_SET_UP[fixture]))


@pytest.fixture(scope="session")
def shared_airflow(request: pytest.FixtureRequest) -> Airflow:
    """The first deployment, its REST API called as ``admin``."""
    return _deployment_up(request, "shared_airflow")


@pytest.fixture(scope="session")
def second_airflow(request: pytest.FixtureRequest) -> Airflow:
    """The second deployment, its REST API called as ``ops``."""
    return _deployment_up(request, "second_airflow")


@pytest.fixture(scope="session")
def shared_deployment(
    ray_cluster: LocalRayCluster, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Deployment:
    """The first deployment's home, not started."""
    home = tmp_path_factory.mktemp("airflow-shared")
    dags = home / "dags"  # the example DAGs and the tests' own
    dags.mkdir()
    for path in [*ROOT.joinpath("dags").glob("*.py"), *Path(__file__).with_name("dags").glob("*.py")]:
        shutil.copy(path, dags)
    # The ticket DAG's scheduled runs (no conf) run on the tiny model and the session's warm engines.
    (home / PARAM_DEFAULTS_FILE).write_text(
        json.dumps(
            {
                TICKETS_DAG_ID: {
                    "model": str(tiny_model),
                    "data_root": str(home / "data"),
                    "engine_kwargs": CPU_ENGINE_KWARGS,
                    "replica_resources": CPU_REPLICA,
                    **warm_conf(),
                },
            }
        )
    )
    _write_scheduled_days(home / "data")
    extra_env = {
        **_auth_env(home, SHARED_USERS),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__RAYBATCH__OPENAI_FILES_URI": str(home / "openai-files"),
        "AIRFLOW_VAR_RAYBATCH_OPENAI_MODEL": str(tiny_model),
        "AIRFLOW_VAR_RAYBATCH_OPENAI_ENGINE_KWARGS": json.dumps(CPU_ENGINE_KWARGS),
        "AIRFLOW_VAR_RAYBATCH_OPENAI_REPLICA_RESOURCES": json.dumps(CPU_REPLICA),
    }
    dag_ids = {
        TICKETS_DAG_ID,
        "support_summary_digest",
        "raybatch_worker_kill",
        "openai_provider_batch",
        DEFAULT_DAG_ID,
    }
    return Deployment(
        home,
        SHARED_PORT,
        ray_cluster.connection_json(),
        dag_ids,
        extra_env,
        token=lambda instance: user_token(instance, "admin"),
    )


@pytest.fixture(scope="session")
def second_deployment(
    ray_cluster: LocalRayCluster, s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory
) -> Deployment:
    """The second deployment's home, not started."""
    home = tmp_path_factory.mktemp("airflow-second")
    dags = home / "dags"
    dags.mkdir()
    shutil.copy(ROOT / "dags" / f"{TICKETS_DAG_ID}.py", dags)
    batch_dag = (ROOT / "dags" / "openai_batch_api.py").read_text()
    assert batch_dag.count('ray_conn_id="ray_default"') == 1, "dags/openai_batch_api.py names no ray_conn_id"
    (dags / "openai_batch_api.py").write_text(
        batch_dag.replace('ray_conn_id="ray_default"', f'ray_conn_id="{CLOSED_RAY_CONN_ID}"')
    )
    extra_env = {
        **_auth_env(home, SECOND_USERS),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        f"AIRFLOW_CONN_{CLOSED_RAY_CONN_ID.upper()}": CLOSED_RAY,
        f"AIRFLOW_CONN_{STORE_CONN_ID.upper()}": s3_server.connection_json(),
        "AIRFLOW__RAYBATCH__OPENAI_FILES_URI": f"s3://{STORE_BUCKET}/root",
        "AIRFLOW__RAYBATCH__OPENAI_FILES_CONN_ID": STORE_CONN_ID,
        "AIRFLOW__RAYBATCH__OPENAI_MAX_UPLOAD_BYTES": str(MAX_UPLOAD_BYTES),
        "AIRFLOW__RAYBATCH__OPENAI_MAX_BODY_BYTES": str(MAX_BODY_BYTES),
        "AIRFLOW__RAYBATCH__OPENAI_MAX_FILES_PER_USER": str(MAX_FILES_PER_USER),
        "AIRFLOW__RAYBATCH__OPENAI_MAX_OPEN_BATCHES_PER_USER": str(MAX_OPEN_BATCHES_PER_USER),
        "AIRFLOW_VAR_RAYBATCH_OPENAI_MODEL": "/nonexistent/model",
    }
    return Deployment(
        home,
        SECOND_PORT,
        ray_cluster.connection_json(),
        {TICKETS_DAG_ID, DEFAULT_DAG_ID},
        extra_env,
        token=lambda instance: user_token(instance, "ops"),
    )
