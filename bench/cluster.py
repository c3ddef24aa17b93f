"""A local Ray head for the benchmarks (scripts/local_ray_cluster.sh on the bench's own ports).

Benchmarks share the machine's cores, so whatever starts a cluster holds /tmp/raybatch-ray.lock for
the cluster's whole life (``scripts/local_ray_cluster.sh stop`` ends only its own cluster, on ports of
its own; a test run beside a benchmark no longer ends the benchmark's cluster, but would skew it).
bench/run_cpu.sh takes the lock and sets RAYBATCH_BENCH_LOCKED=1; :func:`require_lock`
refuses to start a cluster without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "local_ray_cluster.sh"
LOCK_FILE = "/tmp/raybatch-ray.lock"


def require_lock() -> None:
    if os.environ.get("RAYBATCH_BENCH_LOCKED") != "1":
        sys.exit(
            f"Run this under the Ray lock: flock {LOCK_FILE} env RAYBATCH_BENCH_LOCKED=1 <command> "
            "(bench/run_cpu.sh does); `ray stop --force` would otherwise kill other people's clusters."
        )


@dataclass
class LocalCluster:
    state: Path
    dashboard_port: int = 8285
    gcs_port: int = 6400
    client_port: int = 23011
    num_cpus: int = 8
    started_at: float = field(default=0.0, init=False)

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def token(self) -> str:
        return (self.state / "auth_token").read_text().strip()

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "RAYBATCH_STATE": str(self.state),
            "RAYBATCH_DASHBOARD_PORT": str(self.dashboard_port),
            "RAYBATCH_GCS_PORT": str(self.gcs_port),
            "RAYBATCH_CLIENT_PORT": str(self.client_port),
            "RAYBATCH_NUM_CPUS": str(self.num_cpus),
        }

    def connection_json(self) -> str:
        return json.dumps(
            {"conn_type": "ray", "host": "127.0.0.1", "port": self.dashboard_port, "password": self.token}
        )

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def start(self) -> None:
        require_lock()
        self.state.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        subprocess.run(
            [str(SCRIPT), "start"], env=self.env(), check=True, timeout=240, stdout=subprocess.DEVNULL
        )
        if not self._dashboard_answers(timeout_seconds=30):
            log = (self.state / "ray_start.log").read_text()[-2000:]
            self.stop()
            raise RuntimeError(
                f"Ray dashboard at {self.address} did not come up (killed by someone's "
                f"`ray stop --force`?); end of ray_start.log:\n{log}"
            )
        self.started_at = time.time()
        print(f"[bench] Ray head up at {self.address} in {self.started_at - t0:.1f} s", flush=True)

    def _dashboard_answers(self, timeout_seconds: float) -> bool:
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            request = urllib.request.Request(f"{self.address}/api/version", headers=self.auth_headers())
            try:
                urllib.request.urlopen(request, timeout=5).read()
                return True
            except urllib.error.HTTPError:
                return True  # an HTTP answer: the dashboard is up
            except OSError:
                time.sleep(1)
        return False

    def stop(self) -> None:
        subprocess.run(
            [str(SCRIPT), "stop"], env=self.env(), check=False, timeout=180, stdout=subprocess.DEVNULL
        )

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
