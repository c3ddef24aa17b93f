"""Fixtures for tests on the real parts: a local Ray head (token auth on), the tiny model, Airflow.

The tests run in .venvs/airflow (the editable install), or with RAYBATCH_TEST_INSTALL=wheel in
.venvs/airflow-wheel, where scripts/test_wheel.sh installs the built wheel; the cluster runs from
.venvs/ray (scripts/setup_envs.sh makes both), or RAYBATCH_RAY_VENV (scripts/test_matrix.sh's other Ray
release). The cluster uses its own ports so a running demo cluster is not mistaken for it.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sqlite3
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.run_record import RunRecord, note

# No time limit per generated example: in a whole run the unit tests run reniced beside the tests on
# the real parts, where an example's time says nothing about the code (a 200 ms deadline failed a
# property test there, never alone). Speed is measured by bench/, never by a test.
settings.register_profile("raybatch", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("raybatch")

#: Every Airflow home of the session, and the jobs tests submit through an operator, share one engine
#: pool scope (``[raybatch] engine_pool_scope``), so their warm engines serve each other as one
#: deployment's do. Each home has a secret of its own (test_two_deployments needs two), and the scope
#: derived from it would split every pool per home, a cold engine start each. The derived default is
#: tested in tests/security/test_shared_cluster_pools.py.
POOL_SCOPE = "raybatch-tests"
os.environ.setdefault("AIRFLOW__RAYBATCH__ENGINE_POOL_SCOPE", POOL_SCOPE)

#: The session's two `airflow standalone` deployments (``shared_airflow``, ``second_airflow``).
pytest_plugins = ["tests.integration.deployments"]

ROOT = Path(__file__).resolve().parents[1]
#: The cluster side's virtualenv: .venvs/ray, or another Ray release's (scripts/test_matrix.sh).
RAY_VENV = Path(os.environ.get("RAYBATCH_RAY_VENV") or ROOT / ".venvs" / "ray")
RAY_PYTHON = RAY_VENV / "bin" / "python"


def cluster_ray_version() -> str:
    """The Ray release the cluster's virtualenv holds (from its dist-info: no Ray import here)."""
    [dist_info] = RAY_VENV.glob("lib/python*/site-packages/ray-*.dist-info")
    return dist_info.name.removeprefix("ray-").removesuffix(".dist-info")


AIRFLOW_BIN = Path(sys.executable).parent / "airflow"


def _worker_port_offset() -> int:
    """pytest-xdist's worker N (``gwN``) runs its own Ray head and S3 server, on ports 200 x N up: the
    real-parts pass runs test files in two workers (scripts/test.sh), each file in one of them."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    return 200 * int(worker) if worker.isdigit() else 0


# The test cluster's ports and Ray folder; RAYBATCH_TEST_PORTS=<dashboard>,<gcs>,<client> moves them, to
# run a few tests beside another test run on the same machine.
DASHBOARD_PORT, GCS_PORT, CLIENT_PORT = (
    int(port) + _worker_port_offset()
    for port in os.environ.get("RAYBATCH_TEST_PORTS", "8275,6390,23001").split(",")
)
RAY_TEMP_DIR = "/tmp/ray-raybatch-tests" + ("" if DASHBOARD_PORT == 8275 else f"-{DASHBOARD_PORT}")


REPLICA_SLOT = "replica_slot"

#: scripts/test.sh's RAYBATCH_TEST_INSTALL=wheel: every test exercises the installed wheel.
WHEEL_MODE = os.environ.get("RAYBATCH_TEST_INSTALL") == "wheel"


def provider_origin() -> Path | None:
    """The file ``import airflow_provider_raybatch`` would load here, found without importing it."""
    spec = importlib.util.find_spec("airflow_provider_raybatch")
    return Path(spec.origin).resolve() if spec and spec.origin else None


def site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"]).resolve()


def pytest_configure(config: pytest.Config) -> None:
    """Record the run's time (tests/run_record.py). In wheel mode, stop before collecting anything
    when the provider would not come from site-packages.

    pytest run from the repository root (``python -m pytest`` puts the cwd first on sys.path) imports
    the checkout's airflow_provider_raybatch, which shadows the installed one, and so would every
    ``python -c`` the tests start there: scripts/test.sh runs pytest from build/test-root instead.
    """
    _refuse_workers_on_the_real_parts(config)
    config.pluginmanager.register(RunRecord(), "raybatch_run_record")
    origin = provider_origin()
    if WHEEL_MODE and (origin is None or not origin.is_relative_to(site_packages())):
        raise pytest.UsageError(
            f"RAYBATCH_TEST_INSTALL=wheel, but airflow_provider_raybatch would be imported from "
            f"{origin}, not from the installed wheel in {site_packages()}. Run scripts/test.sh (it "
            "installs the wheel and runs pytest from build/test-root), or unset RAYBATCH_TEST_INSTALL "
            "to test the checkout."
        )


#: The session fixtures that start a real part on a fixed port (the Ray head, Airflow, the S3 server)
#: or build one (the tiny models). A test that uses one of them, or is marked ``integration``, is a
#: test "on the real parts": those run one at a time, in one process.
REAL_PARTS = frozenset(
    {
        "ray_cluster",
        "ray_connection",
        "airflow_env",
        "s3_server",
        "tiny_model",
        "tiny_vlm",
        "shared_airflow",
        "second_airflow",
    }
)
#: scripts/test.sh runs the tests in two passes: ``unit`` (the rest, in pytest-xdist workers, whose
#: CPU-bound tests would otherwise slow the real parts' timed waits: a headless Chromium timed out
#: beside them on the 2-core machine) and then ``real_parts``; unset, one pass runs everything.
TEST_PART_ENV = "RAYBATCH_TEST_PART"


def on_real_parts(item: pytest.Item) -> bool:
    fixtures = set(getattr(item, "fixturenames", ()))
    return item.get_closest_marker("integration") is not None or bool(fixtures & REAL_PARTS)


def _refuse_workers_on_the_real_parts(config: pytest.Config) -> None:
    """Each worker starts its own Ray head and S3 server (:func:`_worker_port_offset`), but a test
    file's own servers listen on fixed ports: the real parts' workers must take whole files."""
    workers = getattr(config.option, "numprocesses", None)
    dist = getattr(config.option, "dist", "no")
    if os.environ.get(TEST_PART_ENV) == "real_parts" and workers not in (None, 0, "0") and dist != "loadfile":
        raise pytest.UsageError(
            f"The tests on the real parts run in workers only with --dist loadfile (a file's own servers "
            f"listen on fixed ports), not -n {workers} --dist {dist}."
        )


@pytest.hookimpl(tryfirst=True)  # before -m and -k see the items
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    part = os.environ.get(TEST_PART_ENV, "")
    if part not in ("", "unit", "real_parts"):
        raise pytest.UsageError(f"{TEST_PART_ENV}={part!r}: use unit, real_parts or leave it unset")
    if part:
        keep = [item for item in items if on_real_parts(item) == (part == "real_parts")]
        dropped = [item for item in items if on_real_parts(item) != (part == "real_parts")]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = keep
    items.sort(key=_session_order)
    _needed_setups.update(
        name for item in items for name in getattr(item, "fixturenames", ()) if name in _EARLY_SETUP_FIXTURES
    )


def _session_order(item: pytest.Item) -> int:
    """The order of the tests on the real parts (a stable sort: files and tests keep theirs within):

    0. ``cold_engine`` tests, whose subject is an engine's start, lifetime or placement: on a cluster
       no warm pool holds yet, so their jobs find every CPU and replica slot free;
    1. a ``cold_engine`` test marked ``session_pool``: the pool it starts cold is the one the session's
       text jobs share, left warm for them;
    2. the rest, on the session's warm engine pools (:data:`TEST_KEEP_WARM_SECONDS`);
    3. the tests on the session's `airflow standalone` deployments, last: their schedulers, triggerers
       and dag processors then run beside no other test.
    """
    if item.get_closest_marker("cold_engine") is not None:
        return 1 if item.get_closest_marker("session_pool") is not None else 0
    return 3 if {"shared_airflow", "second_airflow"} & set(getattr(item, "fixturenames", ())) else 2


#: A file scripts/test.sh names (``RAYBATCH_TEST_COLD_DONE_FILE``), written when the first test after
#: the ``cold_engine`` ones starts, or when the session ends: the unit tests it runs beside start then.
COLD_DONE_FILE_ENV = "RAYBATCH_TEST_COLD_DONE_FILE"


def _say_cold_engine_tests_done() -> None:
    if (done := os.environ.get(COLD_DONE_FILE_ENV)) and not os.path.exists(done):
        Path(done).touch()


def pytest_runtest_setup(item: pytest.Item) -> None:
    if _session_order(item) > 1:
        _say_cold_engine_tests_done()


def pytest_sessionfinish(session: pytest.Session) -> None:
    _say_cold_engine_tests_done()


@dataclass(frozen=True)
class LocalRayCluster:
    address: str
    token: str
    state_dir: Path
    env: dict[str, str]
    temp_dir: Path  # Ray's sessions and logs (scripts/local_ray_cluster.sh: one folder per cluster)

    def add_worker_node(self, num_cpus: int, resources: dict[str, float]) -> None:
        """Start one more raylet on this machine that joins the head: a second node."""
        env = {
            **self.env,
            "RAYBATCH_WORKER_CPUS": str(num_cpus),
            "RAYBATCH_WORKER_RESOURCES": json.dumps(resources),
        }
        subprocess.run(
            [str(ROOT / "scripts" / "local_ray_cluster.sh"), "add-worker"], env=env, check=True, timeout=180
        )

    def remove_worker_nodes(self) -> None:
        """Stop the nodes :meth:`add_worker_node` started. A second raylet left running cost the rest
        of the session its log monitor, dashboard agent and idle workers: 10-15% of a core."""
        script = str(ROOT / "scripts" / "local_ray_cluster.sh")
        subprocess.run([script, "remove-workers"], env=self.env, check=True, timeout=120)

    def connection_json(self, token: str | None = None) -> str:
        host, port = self.address.removeprefix("http://").split(":")
        return json.dumps(
            {"conn_type": "ray", "host": host, "port": int(port), "password": token or self.token}
        )


#: scripts/test.sh's folder for what the pytest passes of one run share (``RAYBATCH_TEST_SHARED_DIR``):
#: the Ray head, which the first pass that needs it starts and test.sh stops when the run ends (the
#: version matrix's Airflow cell runs its DAG on it, on the engines the main pass left warm), and the
#: tiny models, built once. Unset (a pytest run of its own): each session starts and stops its own.
SHARED_DIR = (
    Path(os.environ["RAYBATCH_TEST_SHARED_DIR"]) if os.environ.get("RAYBATCH_TEST_SHARED_DIR") else None
)
#: A cluster of another Ray release (scripts/test_matrix.sh's Ray cell) is its session's own.
SHARED_CLUSTER = SHARED_DIR is not None and not os.environ.get("RAYBATCH_RAY_VENV")


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRayCluster]:
    start_early_setups(tmp_path_factory)
    if SHARED_CLUSTER and SHARED_DIR:  # one per pytest-xdist worker's ports
        state = SHARED_DIR / f"ray-state-{DASHBOARD_PORT}"
    else:
        state = tmp_path_factory.mktemp("ray-state")
    env = {
        **os.environ,
        "RAYBATCH_STATE": str(state),
        "RAYBATCH_DASHBOARD_PORT": str(DASHBOARD_PORT),
        "RAYBATCH_GCS_PORT": str(GCS_PORT),
        "RAYBATCH_CLIENT_PORT": str(CLIENT_PORT),
        "RAYBATCH_RAY_TEMP_DIR": RAY_TEMP_DIR,
        # One replica slot per node, so a test can place one engine replica on each (test_multinode).
        "RAYBATCH_HEAD_RESOURCES": json.dumps({REPLICA_SLOT: 1}),
    }
    script = ROOT / "scripts" / "local_ray_cluster.sh"
    # A shared head an earlier pass started is up already: the script says so and returns.
    subprocess.run([str(script), "start"], env=env, check=True, timeout=180)
    try:
        yield LocalRayCluster(
            address=f"http://127.0.0.1:{DASHBOARD_PORT}",
            token=(state / "auth_token").read_text().strip(),
            state_dir=state,
            env=env,
            temp_dir=Path(RAY_TEMP_DIR),
        )
    finally:
        if not SHARED_CLUSTER:
            subprocess.run([str(script), "stop"], env=env, check=False, timeout=120)


@pytest.fixture
def ray_connection(ray_cluster: LocalRayCluster, monkeypatch: pytest.MonkeyPatch) -> LocalRayCluster:
    """Point the ``ray_default`` Airflow connection at the local cluster, for in-process hooks."""
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", ray_cluster.connection_json())
    return ray_cluster


def _make_model(script: str, out: Path) -> Path:
    """Run one of scripts/make_tiny_*.py with the cluster's Python (they need torch and transformers);
    in the run's shared folder, once per run (``complete`` marks a whole one)."""
    if (out / "complete").exists():
        return out
    subprocess.run(
        [str(RAY_PYTHON), str(ROOT / "scripts" / script), str(out)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (out / "complete").touch()
    return out


def _model_folder(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    if SHARED_DIR is not None:
        return SHARED_DIR / "models" / name
    return tmp_path_factory.mktemp("model") / name


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return early_setup("tiny_model", tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight Idefics3 vision-language model (scripts/make_tiny_vlm.py), made once per run."""
    return early_setup("tiny_vlm", tmp_path_factory)


#: The session fixtures whose slow set-up :func:`start_early_setups` starts side by side, and those the
#: tests of this session use (pytest_collection_modifyitems).
_EARLY_SETUP_FIXTURES = ("tiny_model", "tiny_vlm", "airflow_env")
_needed_setups: set[str] = set()
_early_setups: dict[str, Future] = {}


def _setup_starts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Callable[[], Path]]:
    def model(script: str, name: str) -> Callable[[], Path]:
        return lambda: _make_model(script, _model_folder(tmp_path_factory, name))

    return {
        "tiny_model": model("make_tiny_model.py", "tiny-llama"),
        "tiny_vlm": model("make_tiny_vlm.py", "tiny-vlm"),
        "airflow_env": lambda: _migrated_airflow_home(tmp_path_factory.mktemp("airflow-home")),
    }


def start_early_setups(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Start the slow set-ups this session's tests need (the tiny models' builds, ``airflow db
    migrate``), all at once in threads, the first time any real part is asked for: mostly processes
    importing torch or Airflow, they overlap each other and the Ray head's start."""
    if _early_setups:
        return
    pool = ThreadPoolExecutor(max_workers=len(_EARLY_SETUP_FIXTURES), thread_name_prefix="early-setup")
    for name, start in _setup_starts(tmp_path_factory).items():
        if name in _needed_setups:
            _early_setups[name] = pool.submit(start)
    pool.shutdown(wait=False)


def early_setup(name: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The set-up's result: started early, or now (a fixture the collected tests did not name)."""
    start_early_setups(tmp_path_factory)
    if name not in _early_setups:
        return _setup_starts(tmp_path_factory)[name]()
    return _early_setups[name].result()


#: Engine settings that fit vLLM's CPU build on a shared 2-core, 24 GiB machine. An explicit 1 GiB KV
#: cache: left to gpu_memory_utilization, vLLM takes 6.5 GiB per engine and spends ~10 s more building
#: it (a warm-up pass to size it, then allocating; "init engine" 11.2 s against 1.5 s).
#: Compact JSON: a random-weight model in a grammar that allows whitespace pads JSON with it up to
#: max_tokens (docs/openai-batch-api.md). Every test's engines have it, so the tests that need it (the
#: common.ai and OpenAI chat tests) share one warm pool with the others: its settings are the pool's.
CPU_ENGINE_KWARGS = {
    "max_model_len": 512,
    "gpu_memory_utilization": 0.3,
    "enforce_eager": True,
    "kv_cache_memory_bytes": 1 << 30,
    "structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True},
}
CPU_REPLICA = {"CPU": 1}
#: The replica resources of a job that must still run when a test acts on it: its engine waits for a
#: replica slot the test holds (:func:`replica_slots_held`), RUNNING, until the test lets it go. Not on
#: a warm pool: a pool job that cannot place its replica ends other pools' idle ones to make room.
HELD_REPLICA = {**CPU_REPLICA, REPLICA_SLOT: 1}


def run_date(day: str) -> str:
    """The logical date of a manual run of an example daily DAG that reads ``day``'s partition. They
    read their data interval's start, and a manual run's interval is the day before its date, as the
    scheduled run at midnight reads the day that just ended (dags/daily_company_industry.py)."""
    return (date.fromisoformat(day) + timedelta(days=1)).isoformat()


@dataclass(frozen=True)
class AirflowEnv:
    env: dict[str, str]
    home: Path

    def dags_test(self, dag_id: str, day: str, conf: dict, timeout: int = 900) -> subprocess.CompletedProcess:
        note("dags_test", dag_id=dag_id)
        return subprocess.run(
            [str(AIRFLOW_BIN), "dags", "test", dag_id, day, "--conf", json.dumps(conf)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def with_env(self, **extra: str) -> AirflowEnv:
        return AirflowEnv(env={**self.env, **extra}, home=self.home)

    def xcoms(self, dag_id: str, day: str) -> dict[tuple[str, str], object]:
        """(task_id, key) -> value of the XComs of the DAG's run of ``day``, read from Airflow's DB."""
        with sqlite3.connect(self.home / "airflow.db") as db:
            rows = db.execute(
                "SELECT x.task_id, x.key, x.value FROM xcom x JOIN dag_run r ON x.dag_run_id = r.id "
                "WHERE x.dag_id = ? AND date(r.logical_date) = ?",
                (dag_id, day),
            ).fetchall()
        return {(task_id, key): json.loads(value) for task_id, key, value in rows}


#: How long the tests' engine pools stay warm after their last job: the whole session (the cluster's
#: stop at the session's end ends them). Used by the batch tasks of the tests' Airflow deployments
#: whose DAG leaves ``keep_warm_seconds`` unset, and by the tests that submit jobs themselves and whose
#: subject is not an engine's start (``RAYBATCH_TEST_KEEP_WARM_SECONDS``; 0: each job starts its own).
TEST_KEEP_WARM_SECONDS = float(os.environ.get("RAYBATCH_TEST_KEEP_WARM_SECONDS", "3600"))


def warm_conf() -> dict[str, float]:
    """The run conf of a DAG with a ``keep_warm_seconds`` Param (the examples'), set as the policy
    below sets an operator's: a rendered Param is no longer unset when the policy runs."""
    return {"keep_warm_seconds": TEST_KEEP_WARM_SECONDS} if TEST_KEEP_WARM_SECONDS > 0 else {}


#: In an Airflow home: {dag_id: {param: default}}, which the home's cluster policy sets on those DAGs,
#: as a deployment sets its own defaults (what a scheduled run, which has no conf, runs with).
PARAM_DEFAULTS_FILE = "param_defaults.json"


def install_warm_engine_policy(home: Path) -> None:
    """Give an Airflow home a cluster policy: batch tasks that leave ``keep_warm_seconds`` unset run on
    a warm engine pool for :data:`TEST_KEEP_WARM_SECONDS`, as a deployment that backfills would set;
    DAGs named in the home's :data:`PARAM_DEFAULTS_FILE` get those Param defaults.

    Why: most Airflow-driven tests are about Airflow, the row path or the API, not about an engine's
    start, and each cold job spent ~40 s of a 2-core CI machine starting vLLM (two processes importing
    it, then building): about a quarter of the tests' time. Their jobs now share the engines an earlier
    job of the same settings left warm. The cold path keeps its own tests, which submit from the test
    process (no Airflow home, no policy): test_pipeline_job, test_fault_injection, test_multinode,
    test_engine_lifetime; test_warm_pool starts the session's pool these share, and the backfill test
    sets its own keep-warm window.
    Airflow runs the policy wherever it parses a DAG (``airflow dags test``, the dag processor, each
    task's process): ``$AIRFLOW_HOME/config`` is on its ``sys.path``.
    """
    config = home / "config"
    config.mkdir(parents=True, exist_ok=True)
    warm = (
        "def task_policy(task):\n"
        '    if getattr(task, "keep_warm_seconds", "") is None:  # our batch operators, argument unset\n'
        f"        task.keep_warm_seconds = {TEST_KEEP_WARM_SECONDS!r}\n\n\n"
    )
    (config / "airflow_local_settings.py").write_text(
        '"""The tests\' cluster policy (tests/conftest.py install_warm_engine_policy)."""\n\n'
        "import json\n"
        "from pathlib import Path\n\n\n"
        f"{warm if TEST_KEEP_WARM_SECONDS > 0 else ''}"
        "def dag_policy(dag):\n"
        "    # A scheduled run has no conf: this home's Param defaults, where it names some.\n"
        f'    defaults = Path(__file__).parent.parent / "{PARAM_DEFAULTS_FILE}"\n'
        "    if defaults.exists():\n"
        "        for name, value in json.loads(defaults.read_text()).get(dag.dag_id, {}).items():\n"
        "            # A task keeps its own copy of the DAG's params, which a run's context holds.\n"
        "            for params in [dag.params, *(task.params for task in dag.tasks)]:\n"
        "                params[name] = value\n"
    )


def _airflow_env(home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
    }


def _migrated_airflow_home(home: Path) -> Path:
    install_warm_engine_policy(home)
    subprocess.run(
        [str(AIRFLOW_BIN), "db", "migrate"],
        env=_airflow_env(home),
        check=True,
        capture_output=True,
        timeout=300,
    )
    return home


@pytest.fixture(scope="session")
def airflow_env(ray_cluster: LocalRayCluster, tmp_path_factory: pytest.TempPathFactory) -> AirflowEnv:
    home = early_setup("airflow_env", tmp_path_factory)
    env = {**_airflow_env(home), "AIRFLOW_CONN_RAY_DEFAULT": ray_cluster.connection_json()}
    return AirflowEnv(env=env, home=home)


def submit_pipeline(
    operator, run_key: str, submission_id: str, metadata: dict[str, str] | None = None
) -> str:
    """Submit the operator's pipeline job exactly as the operator would (spec, entrypoint, runtime_env),
    with ``metadata`` for the job (e.g. that it may take its run's committed version)."""
    from airflow_provider_raybatch.hooks.ray import RayHook

    hook = RayHook()
    spec = operator.build_spec(run_key=run_key)
    return hook.submit_job(
        operator.entrypoint(spec),
        submission_id=submission_id,
        runtime_env=operator._runtime_env(hook, spec),
        metadata=metadata,
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


_HOLD_SLOTS = """
import ray, time
ray.init()
@ray.remote(num_cpus=0, resources={{{slot!r}: 1}})
def hold():
    print("HOLDING", flush=True)
    time.sleep({seconds})
ray.get([hold.remote() for _ in range({slots})])
"""


def hold_replica_slots(hook, seconds: float) -> str:
    """Hold every REPLICA_SLOT of the cluster for ``seconds`` (a Ray job of tasks that take them);
    return the holding job's id once all are held. A job whose replicas ask for a slot then waits,
    RUNNING, until the hold ends or is stopped (:func:`replica_slots_held`)."""
    import shlex
    import time
    import uuid

    slots = int(sum(node.resources.get(REPLICA_SLOT, 0) for node in hook.get_cluster_resources().nodes))
    script = _HOLD_SLOTS.format(slot=REPLICA_SLOT, seconds=seconds, slots=slots)
    job_id = hook.submit_job(f"python -c {shlex.quote(script)}", submission_id=f"hold-{uuid.uuid4().hex[:8]}")
    deadline = time.monotonic() + 120
    while hook.get_job_logs(job_id).count("HOLDING") < slots:
        assert time.monotonic() < deadline, hook.get_job_logs(job_id)[-2000:]
        time.sleep(1)
    return job_id


_HOLD_CPUS = """
import ray, time
ray.init()
free = int(ray.available_resources().get("CPU", 0))
@ray.remote(num_cpus=1)
def hold():
    time.sleep({seconds})
refs = [hold.remote() for _ in range(free)]
while ray.available_resources().get("CPU", 0) >= 1:  # until every task holds its CPU
    time.sleep(0.2)
print("ALL CPUS HELD", flush=True)
ray.get(refs)
"""


def hold_free_cpus(hook, seconds: float) -> str:
    """Hold every CPU of the cluster that is free now for ``seconds`` (a Ray job of one-CPU tasks);
    return the holding job's id once all are held. A job on a warm pool then runs, its driver started
    (it takes no CPU) and its replicas warm, while its read tasks wait for a CPU: it stays RUNNING
    until the hold ends or is stopped, however fast the machine, with no engine of its own."""
    import shlex
    import time
    import uuid

    script = _HOLD_CPUS.format(seconds=seconds)
    job_id = hook.submit_job(f"python -c {shlex.quote(script)}", submission_id=f"hold-{uuid.uuid4().hex[:8]}")
    deadline = time.monotonic() + 120
    while "ALL CPUS HELD" not in (logs := hook.get_job_logs(job_id)):
        assert time.monotonic() < deadline, logs[-2000:]
        time.sleep(1)
    return job_id


@contextmanager
def free_cpus_held(hook) -> Iterator[None]:
    """Every CPU free now held while the block runs (:func:`hold_free_cpus`): a job on the session's
    warm engines stays RUNNING, its reads waiting for a CPU, until the test lets it go. It waits on
    this event, not on how slowly it generates, and builds no engine of its own."""
    holder = hold_free_cpus(hook, seconds=3600)
    try:
        yield
    finally:
        hook.stop_job(holder)


@contextmanager
def replica_slots_held(hook) -> Iterator[None]:
    """Every REPLICA_SLOT held while the block runs: a job whose replicas need one stays RUNNING, its
    engine unplaced, until the test lets it go. A job that must still run when the test acts on it
    waits on this event, not on how slowly it generates."""
    holder = hold_replica_slots(hook, seconds=3600)
    try:
        yield
    finally:
        hook.stop_job(holder)


def engine_plan(driver_log: str) -> str:
    """The operators of the job's engine dataset, from Ray Data's "Execution plan" line in its log."""
    plans = [
        line.split("Execution plan of Dataset ", 1)[1]
        for line in driver_log.splitlines()
        if "Execution plan of Dataset " in line
    ]
    [plan] = [plan.split(": ", 1)[1] for plan in plans if "EngineStage" in plan]
    return plan


# -- S3: a real S3-compatible server (moto in server mode) on loopback ----------------------------

S3_PORT = 8295 + _worker_port_offset()
S3_ACCESS_KEY = "AKIARAYBATCHTEST0001"
#: A secret that must never show up anywhere: the leak tests search for it.
S3_SECRET_KEY = "rbSecret/" + "9f3c1e7a5b2d4f6e8a0c1b3d5e7f9a2c4e6b8d0f"


@dataclass(frozen=True)
class S3Server:
    endpoint_url: str
    access_key: str
    secret_key: str

    def client(self):  # boto3 S3 client; imported here so unit runs need no boto3
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
        )

    def connection_json(self) -> str:
        """An Airflow AWS connection to this server (the way users configure MinIO, Ceph or moto)."""
        return json.dumps(
            {
                "conn_type": "aws",
                "login": self.access_key,
                "password": self.secret_key,
                "extra": {"endpoint_url": self.endpoint_url, "region_name": "us-east-1"},
            }
        )

    def upload_tree(self, folder: Path, bucket: str, prefix: str) -> str:
        client = self.client()
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(folder).as_posix()}")
        return f"s3://{bucket}/{prefix}"


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per S3 request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=S3_PORT, verbose=False)
    server.start()
    try:
        yield S3Server(f"http://127.0.0.1:{S3_PORT}", S3_ACCESS_KEY, S3_SECRET_KEY)
    finally:
        server.stop()


#: Where Airflow finds each secret that may sign this deployment's jobs (jobs/deployment_secret.py).
SECRET_OPTIONS = {
    "raybatch": "AIRFLOW__RAYBATCH__JOB_IDENTITY_SECRET",
    "fernet": "AIRFLOW__CORE__FERNET_KEY",
    "jwt": "AIRFLOW__API_AUTH__JWT_SECRET",
}


@pytest.fixture
def only_secrets(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Set exactly these secrets (:data:`SECRET_OPTIONS`' short names) in the environment, others empty."""

    def set_only(**values: str) -> None:
        for name, variable in SECRET_OPTIONS.items():
            monkeypatch.setenv(variable, values.get(name, ""))

    return set_only
