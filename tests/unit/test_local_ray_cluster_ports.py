"""scripts/local_ray_cluster.sh refuses a client-server port inside Ray's worker port range.

Ray's own refusal comes from deep inside `ray start`, as a traceback, once the head has half started
(PLATFORM-NOTES.md: 10002-19999 by default); the script says which variable to change before
starting anything.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "local_ray_cluster.sh"


@pytest.mark.parametrize("port", ["10002", "10101", "19999"])
def test_a_client_port_in_rays_worker_range_is_refused_naming_the_variable(port: str, tmp_path: Path) -> None:
    env = {**os.environ, "RAYBATCH_STATE": str(tmp_path / "state"), "RAYBATCH_CLIENT_PORT": port}

    result = subprocess.run([str(SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=60)

    assert result.returncode == 2, result.stdout + result.stderr
    assert f"RAYBATCH_CLIENT_PORT={port} is inside Ray's worker port range (10002-19999)" in result.stderr
    assert not (tmp_path / "state").exists()  # nothing started, nothing written


@pytest.mark.parametrize("port", ["10001", "20000"])
def test_a_client_port_outside_the_range_passes_the_check(port: str, tmp_path: Path) -> None:
    """The check alone: past it, `start` needs the cluster's virtualenv (absent here on purpose) and
    fails at its first use of it (python, or ray), not at the check."""
    env = {
        **os.environ,
        "RAYBATCH_STATE": str(tmp_path / "state"),
        "RAYBATCH_CLIENT_PORT": port,
        "RAYBATCH_RAY_VENV": str(tmp_path / "no-venv"),
        "PATH": "/usr/bin:/bin",
    }

    result = subprocess.run([str(SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=60)

    assert "worker port range" not in result.stderr
    assert (tmp_path / "state").exists()  # it went on to start
    assert result.returncode == 127 and "command not found" in result.stderr, result.stderr  # python or ray
