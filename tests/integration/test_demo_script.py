"""scripts/demo.sh, the README's first command, run for real: two dates of the daily DAG through
`airflow dags test`, the output printed, the second date on the engines the first left warm.

It runs on the session's Ray head and tiny model, as a user runs it against a head already up: the
virtualenvs are scripts/test.sh's (``SKIP_SETUP``), and the demo's jobs ride the session's warm engine
pool instead of building an engine of their own (the demo's engine settings are the tests'). What it
does not run here, test.sh and the session's fixtures run: scripts/setup_envs.sh, make_tiny_model.py
and local_ray_cluster.sh's start of a new head.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.conftest import (
    CPU_ENGINE_KWARGS,
    CPU_REPLICA,
    ROOT,
    TEST_KEEP_WARM_SECONDS,
    LocalRayCluster,
)
from tests.run_record import note

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

#: The demo's date and the day before it, which it runs second (no other test's dates).
DAY, PREV = "2026-09-15", "2026-09-14"
ROWS = 250  # the demo's own count


def _rendered_fields(airflow_db: Path) -> list[dict]:
    """Each run's rendered batch task parameters, from the demo's Airflow database."""
    with sqlite3.connect(airflow_db) as db:
        rows = db.execute(
            "SELECT rendered_fields FROM rendered_task_instance_fields WHERE task_id = 'classify_industry'"
        ).fetchall()
    return [json.loads(fields) for (fields,) in rows]


def _value(rendered: object) -> object:
    """A parameter rendered from ``{{ ... | tojson }}``: its JSON text, as the operator reads it."""
    return json.loads(rendered) if isinstance(rendered, str) else rendered


def test_the_demo_runs_two_dates_on_a_head_already_up(
    ray_cluster: LocalRayCluster, tiny_model: Path, tmp_path: Path
) -> None:
    state = tmp_path / "demo"
    state.mkdir()
    # The head's token, copied into the demo's own folder: the demo reads it from there, and a `stop`
    # with that folder could not end the session's head (local_ray_cluster.sh stops the processes
    # whose environment names its token file).
    shutil.copy(ray_cluster.state_dir / "auth_token", state / "auth_token")
    # The session's keep-warm window: a job's own setting becomes its pool's.
    keep_warm = f"{TEST_KEEP_WARM_SECONDS or 120:g}"
    env = {
        **ray_cluster.env,  # the head's ports
        "RAYBATCH_STATE": str(state),
        "RAYBATCH_DEMO_MODEL": str(tiny_model),
        "RAYBATCH_DEMO_KEEP_WARM_SECONDS": keep_warm,
        "SKIP_SETUP": "1",
    }
    note("dags_test", dag_id="daily_company_industry")
    note("dags_test", dag_id="daily_company_industry")

    demo = subprocess.run(
        [str(ROOT / "scripts" / "demo.sh"), DAY], env=env, capture_output=True, text=True, timeout=840
    )

    logs = "".join(
        f"\n--- {log.name}\n{log.read_text()[-3000:]}" for log in sorted(state.glob("dags_test*.log"))
    )
    assert demo.returncode == 0, f"{demo.stdout[-3000:]}\n{demo.stderr[-3000:]}{logs}"
    out = demo.stdout
    output = state / "data" / "company_industry" / DAY
    assert f"Output: {output}/versions/" in out, out
    assert f"rows in {ROWS}, out {ROWS}, failed 0" in out, out
    assert "] industry " in out, out  # the DAG's downstream task logged the counts
    assert f"Two dates on one warm engine pool (keep_warm_seconds={keep_warm}):" in out, out
    assert re.search(rf"{DAY}: {ROWS} rows, replicas warm \d+/\d+", out), out
    # The second date ran on the engines the first left warm, every replica of them.
    assert re.search(rf"{PREV}: {ROWS} rows, replicas warm (\d+)/\1,", out), out
    assert re.search(r"demo finished in \d+ s", out), out
    for day in (DAY, PREV):
        manifest = json.loads((state / "data" / "company_industry" / day / "manifest.json").read_text())
        assert (manifest["rows_in"], manifest["rows_out"], manifest["rows_failed"]) == (ROWS, ROWS, 0)

    # It ran the tests' engine settings on the session's model (so, on their warm pool), and left the
    # head it found running.
    runs = _rendered_fields(state / "airflow" / "airflow.db")
    assert len(runs) == 2, runs
    for fields in runs:
        assert fields["model"] == str(tiny_model)
        assert _value(fields["engine_kwargs"]) == CPU_ENGINE_KWARGS, fields["engine_kwargs"]
        assert _value(fields["replica_resources"]) == CPU_REPLICA, fields["replica_resources"]
    assert httpx.get(f"{ray_cluster.address}/api/version", timeout=10).status_code in (200, 401)
