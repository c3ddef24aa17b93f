"""CPU per Jobs API call of the async HTTP stacks, against a real local Ray dashboard.

Starts a local Ray head (token auth, the bench's ports), submits one job that prints ``--log-kib`` KiB
and sleeps, then in this one process makes ``--calls`` sequential calls per stack on one kept-alive
connection and reports the process CPU (``getrusage``, user + system) per call, median of ``--repeats``:
  - ``GET /api/jobs/<id>`` (a trigger's status poll) and ``GET /api/jobs/<id>/logs`` (the progress relay);
  - stacks: a shared ``httpx.AsyncClient``, a shared ``aiohttp.ClientSession``, and ``RayHook``'s
    async twin as this checkout ships it (tenacity, semaphore, error mapping, JSON, ``JobInfo``).

usage (under the Ray lock): flock /tmp/raybatch-ray.lock env RAYBATCH_BENCH_LOCKED=1 \
    .venvs/airflow/bin/python bench/http_cpu.py [--calls 1000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(1, str(ROOT))

from cluster import LocalCluster  # noqa: E402


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _per_call_ms(call: Callable[[], Awaitable[object]], calls: int, repeats: int) -> float:
    await call()  # connect, warm up
    samples = []
    for _ in range(repeats):
        t0 = _cpu()
        for _ in range(calls):
            await call()
        samples.append(1000 * (_cpu() - t0) / calls)
    return statistics.median(samples)


async def measure(cluster: LocalCluster, job_id: str, calls: int, repeats: int) -> dict[str, float]:
    import aiohttp
    import httpx

    from airflow_provider_raybatch.hooks.ray import RayHook

    headers = cluster.auth_headers()
    status, logs = f"/api/jobs/{job_id}", f"/api/jobs/{job_id}/logs"
    results: dict[str, float] = {}
    async with httpx.AsyncClient(base_url=cluster.address, headers=headers) as client:

        async def httpx_get(path: str) -> object:
            return (await client.get(path)).json()

        results["httpx status"] = await _per_call_ms(lambda: httpx_get(status), calls, repeats)
        results["httpx logs"] = await _per_call_ms(lambda: httpx_get(logs), calls // 10, repeats)
    async with aiohttp.ClientSession(base_url=cluster.address, headers=headers) as session:

        async def aiohttp_get(path: str) -> object:
            async with session.get(path) as response:
                return json.loads(await response.read())

        results["aiohttp status"] = await _per_call_ms(lambda: aiohttp_get(status), calls, repeats)
        results["aiohttp logs"] = await _per_call_ms(lambda: aiohttp_get(logs), calls // 10, repeats)
    hook = RayHook()
    results["RayHook.a_get_job_info"] = await _per_call_ms(
        lambda: hook.a_get_job_info(job_id), calls, repeats
    )
    results["RayHook.a_get_job_logs"] = await _per_call_ms(
        lambda: hook.a_get_job_logs(job_id), calls // 10, repeats
    )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--log-kib", type=int, default=256)
    parser.add_argument("--state", type=Path, default=Path("/tmp/raybatch-bench/ray-http-cpu"))
    args = parser.parse_args()
    with LocalCluster(args.state) as cluster:
        os.environ["AIRFLOW_CONN_RAY_DEFAULT"] = cluster.connection_json()
        from airflow_provider_raybatch.hooks.ray import RayHook

        lines = args.log_kib * 1024 // 64
        code = (
            "import sys, time; sys.stdout.write(('bench-filler-' + 'x' * 49 + chr(10))"
            f" * {lines}); sys.stdout.flush(); time.sleep(600)"
        )
        hook = RayHook()
        job_id = hook.submit_job(f'python -c "{code}"')
        while hook.get_job_status(job_id).value == "PENDING":
            time.sleep(0.5)
        time.sleep(3)  # the log written
        try:
            results = asyncio.run(measure(cluster, job_id, args.calls, args.repeats))
        finally:
            hook.stop_job(job_id)
    print(f"load average {os.getloadavg()}")
    for name, ms in results.items():
        print(f"{name:26s} {ms:.3f} ms CPU per call")


if __name__ == "__main__":
    main()
