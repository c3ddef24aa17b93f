"""Many RayJobTriggers in one asyncio event loop, as Airflow's triggerer runs them, against a real Ray head.

Starts a local Ray head (token auth, the bench's own ports), submits a few short jobs (``time.sleep``)
through RayHook, and runs N ``RayJobTrigger``s pointed at them in one event loop the way
``TriggerRunner.run_trigger`` does (greenback portal, ``async for event in trigger.run()``), with the
triggers' log lines going to a file as a triggerer's go to its log files. Measured over the window:
  - event-loop stalls: a 10 ms ticker task records how late each tick wakes (worst, p99), and
    Airflow's own watchdog rule (a 100 ms sleep that takes > 0.2 s: "Triggerer's async thread was blocked");
  - CPU of this process (getrusage, user + system) as % of one core, and of the Ray dashboard's processes;
  - the Jobs API calls: count, latency p50/p99/max, errors; events fired and their delay after the job end.

Windows (``--windows``, run in this order by default):
  - ``idle``: the ticker alone, no triggers: how late the loop wakes on this VM anyway (other load);
  - ``spread``: trigger start times uniform over one poll interval (a triggerer in steady state);
  - ``burst``: all at once (a triggerer restart picks up every deferred task together);
  - ``spread-cached-ssl``: a what-if, not the shipped code: the bench patches, in its own process
    only, ``RayConnectionSettings.client_kwargs`` to hand httpx one prebuilt SSL context instead of
    ``verify=True`` (httpx builds a new SSL context, loading the CA bundle, for every AsyncClient the
    hook opens per call). Run 1 only: the hook has shared one context since, and its async twin (all
    the triggers use) has spoken aiohttp since run 4, so the patch no longer touches the triggers.
Each window with triggers gets two fresh short jobs that end inside it (their triggers fire) and
shares three long ones; 500 triggers are spread over the five. Each job first prints ``--job-log-kib``
(256) KiB of log lines, because the trigger's progress relay fetches the whole driver log (every
60 s per trigger by default) and a real LLM job's log is that size (a 20,000-row GPU job: 165 KB).
All output of this process (the triggers' per-poll log lines included) goes to a log file, as a
triggerer writes its logs; the table goes to the terminal.

usage (under the Ray lock; bench/run_cpu.sh does that):
  .venvs/airflow/bin/python bench/triggerer.py [--triggers 500] [--poll 0 (paced)] [--window 90] [--out ...]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import resource
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(1, str(ROOT))  # this checkout's provider, even where another one is installed editable

from cluster import LocalCluster  # noqa: E402

TICK_SECONDS = 0.010
WATCHDOG_SECONDS, WATCHDOG_THRESHOLD = (
    0.1,
    0.2,
)  # TriggerRunner.block_watchdog; blocked_main_thread_warning_threshold


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


class Probe:
    """What the window measures, filled by the ticker, the watchdog and the timed Jobs API calls."""

    def __init__(self) -> None:
        self.lateness: list[float] = []
        self.watchdog_blocked: list[float] = []
        self.calls: list[float] = []
        self.call_errors = 0
        self.events: list[tuple[float, dict[str, Any]]] = []  # Any: event payloads.
        self.gc_pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self.gc_full: list[tuple[float, float, int]] = []  # (s into the window, pause s, objects left)
        self.window_started = time.perf_counter()
        self._gc_started = 0.0
        self.stop = False

    def gc_callback(self, phase: str, info: dict[str, int]) -> None:
        """Time each garbage collection (a diagnostic: a full collection stalls the loop too)."""
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            pause = time.perf_counter() - self._gc_started
            self.gc_pauses[info["generation"]].append(pause)
            if info["generation"] == 2:
                # When in the window, and how large the heap is after it (it sets when the next one comes).
                left = len(gc.get_objects(generation=2))
                self.gc_full.append((self._gc_started - self.window_started, pause, left))

    async def ticker(self) -> None:
        while not self.stop:
            t0 = time.monotonic()
            await asyncio.sleep(TICK_SECONDS)
            self.lateness.append(time.monotonic() - t0 - TICK_SECONDS)

    async def watchdog(self) -> None:
        while not self.stop:
            t0 = time.monotonic()
            await asyncio.sleep(WATCHDOG_SECONDS)
            elapsed = time.monotonic() - t0
            if elapsed > WATCHDOG_THRESHOLD:
                self.watchdog_blocked.append(elapsed)


_PROBE: list[Probe] = []  # the current window's probe


def _time_api_calls() -> None:
    """Time every async Jobs API call the triggers make (RayHook._a_send: one call, retries included)."""
    from airflow_provider_raybatch.hooks.ray import RayHook

    a_send = RayHook._a_send

    async def timed(self: RayHook, request: Any) -> Any:  # Any: the hook's private request type.
        t0 = time.monotonic()
        try:
            return await a_send(self, request)
        except Exception:
            _PROBE[-1].call_errors += 1
            raise
        finally:
            _PROBE[-1].calls.append(time.monotonic() - t0)

    RayHook._a_send = timed  # type: ignore[method-assign]


async def run_trigger(trigger: Any, delay: float, probe: Probe) -> None:  # Any: RayJobTrigger.
    """TriggerRunner.run_trigger, reduced to what costs time in the loop."""
    import greenback

    await asyncio.sleep(delay)
    await greenback.ensure_portal()
    async for event in trigger.run():
        probe.events.append((time.time(), event.payload))
        break


def _process_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _dashboard_cpu_seconds() -> float:
    import psutil

    total = 0.0
    for process in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if "dashboard/dashboard.py" in cmdline or "dashboard/agent.py" in cmdline:
            try:
                times = process.cpu_times()
                total += times.user + times.system
            except psutil.Error:
                pass
    return total


async def window(
    job_ids: list[str], n: int, poll: float, seconds: float, start: str
) -> dict[str, Any]:  # Any
    from airflow_provider_raybatch.triggers.ray import RayJobTrigger

    probe = Probe()
    _PROBE.append(probe)
    rng = random.Random(0)
    from airflow_provider_raybatch.triggers.poll_pace import paced_interval

    # --poll 0: the triggers' default, paced by how many wait (triggers/poll_pace.py).
    fixed = poll if poll > 0 else None
    triggers = [
        RayJobTrigger(job_id=job_ids[i % len(job_ids)], poll_interval_seconds=fixed) for i in range(n)
    ]
    cycle = poll if poll > 0 else paced_interval(n)
    delays = [rng.uniform(0, cycle) if start == "spread" else 0.0 for _ in triggers]
    helpers = [asyncio.create_task(probe.ticker()), asyncio.create_task(probe.watchdog())]
    await asyncio.sleep(0.5)  # the ticker's baseline before the triggers start
    load_1m = os.getloadavg()[0]
    gc.callbacks.append(probe.gc_callback)
    probe.window_started = time.perf_counter()
    cpu0, dash0, t0 = _process_cpu_seconds(), _dashboard_cpu_seconds(), time.monotonic()
    tasks = [asyncio.create_task(run_trigger(t, d, probe)) for t, d in zip(triggers, delays, strict=True)]
    await asyncio.sleep(seconds)
    wall = time.monotonic() - t0
    cpu, dash = _process_cpu_seconds() - cpu0, _dashboard_cpu_seconds() - dash0
    probe.stop = True
    gc.callbacks.remove(probe.gc_callback)
    for task in tasks:
        task.cancel()  # as the triggerer does on shutdown: not on_kill
    await asyncio.gather(*tasks, *helpers, return_exceptions=True)
    return {
        "start": start,
        "triggers": n,
        "poll_interval_seconds": poll if poll > 0 else f"paced ({paced_interval(n)} s for {n})",
        "window_s": wall,
        "max_stall_ms": 1000 * max(probe.lateness, default=0),
        "p99_stall_ms": 1000 * (_quantile(probe.lateness, 0.99) or 0),
        "ticks_late_over_100ms": sum(1 for x in probe.lateness if x > 0.1),
        "watchdog_blocked_over_0_2s": len(probe.watchdog_blocked),
        "cpu_percent_of_one_core": 100 * cpu / wall,
        "process_peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "dashboard_cpu_percent_of_one_core": 100 * dash / wall,
        "api_calls": len(probe.calls),
        "api_calls_per_s": len(probe.calls) / wall,
        "api_call_p50_ms": 1000 * (_quantile(probe.calls, 0.5) or 0),
        "api_call_p99_ms": 1000 * (_quantile(probe.calls, 0.99) or 0),
        "api_call_max_ms": 1000 * max(probe.calls, default=0),
        "api_call_mean_ms": 1000 * statistics.fmean(probe.calls) if probe.calls else None,
        "api_errors": probe.call_errors,
        "events": len(probe.events),
        "event_statuses": sorted({e["termination_reason"] for _, e in probe.events}),
        "_event_times": [(t, e["job_id"]) for t, e in probe.events],
        "load_avg_1m_at_window_start": load_1m,
        "gc_collections": {str(g): len(p) for g, p in probe.gc_pauses.items()},
        "gc_max_pause_ms": {str(g): 1000 * max(p, default=0) for g, p in probe.gc_pauses.items()},
        "gc_total_ms": {str(g): 1000 * sum(p) for g, p in probe.gc_pauses.items()},
        "gc_full_at_s_pause_ms_objects": [(round(t, 1), round(1000 * p, 1), n) for t, p, n in probe.gc_full],
    }


def _capture_output(path: Path) -> Any:  # Any: a text stream.
    """Send this process's stdout and stderr (every log line) to ``path``; return a stream to the terminal."""
    terminal = os.fdopen(os.dup(1), "w", buffering=1)
    log_file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log_file, 1)
    os.dup2(log_file, 2)
    return terminal


def _cached_ssl(enabled: bool) -> None:
    """What-if (bench process only): one SSL context for every client the hook opens."""
    import ssl

    from airflow_provider_raybatch.hooks.ray import RayConnectionSettings

    if not hasattr(RayConnectionSettings, "_bench_client_kwargs"):
        RayConnectionSettings._bench_client_kwargs = RayConnectionSettings.client_kwargs  # type: ignore[attr-defined]
    original = RayConnectionSettings._bench_client_kwargs  # type: ignore[attr-defined]
    if not enabled:
        RayConnectionSettings.client_kwargs = original  # type: ignore[method-assign]
        return
    contexts: dict[Any, ssl.SSLContext] = {}  # Any: the verify value (True or a CA bundle path)

    def client_kwargs(self: Any) -> dict[str, Any]:  # Any: httpx keyword arguments.
        kwargs = original(self)
        verify = kwargs["verify"]
        if verify is not False and not isinstance(verify, ssl.SSLContext):
            if verify not in contexts:
                contexts[verify] = ssl.create_default_context(cafile=None if verify is True else verify)
            kwargs["verify"] = contexts[verify]
        return kwargs

    RayConnectionSettings.client_kwargs = client_kwargs  # type: ignore[method-assign]


def _machine(load_at_start: tuple[float, float, float]) -> dict[str, Any]:  # Any: JSON values.
    import platform

    cpu_model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model,
        "python": platform.python_version(),
        "load_avg_at_start": load_at_start,
        "load_avg_at_end": os.getloadavg(),
    }


def _code() -> dict[str, Any]:  # Any: JSON values.
    """Which provider was measured: its path and the checkout's commit (+ whether it had edits)."""
    import subprocess

    import airflow_provider_raybatch

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    return {
        "provider_path": str(Path(airflow_provider_raybatch.__file__).parent),
        "commit": git("rev-parse", "--short", "HEAD"),
        "uncommitted_paths": git("status", "--porcelain").splitlines(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--triggers", type=int, default=500)
    parser.add_argument("--poll", type=float, default=0.0, help="a fixed interval; 0: the default, paced")
    parser.add_argument("--job-log-kib", type=int, default=256, help="driver log each job prints first")
    parser.add_argument("--window", type=float, default=90.0, help="seconds measured per window")
    parser.add_argument("--windows", default="idle,spread,burst")
    parser.add_argument("--state", type=Path, default=Path("/tmp/raybatch-bench"))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "triggerer.json")
    args = parser.parse_args()
    windows = args.windows.split(",")
    run_dir = args.state / "triggerer" / datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    run_dir.mkdir(parents=True)
    terminal = _capture_output(run_dir / "process.log")

    def say(message: str) -> None:
        print(f"[bench {datetime.now():%H:%M:%S}] {message}", file=terminal, flush=True)

    load_at_start = os.getloadavg()
    with LocalCluster(args.state / "ray-triggerer") as cluster:
        os.environ["AIRFLOW_CONN_RAY_DEFAULT"] = cluster.connection_json()
        from airflow_provider_raybatch.hooks.ray import RayHook

        _time_api_calls()
        hook = RayHook()

        def submit(name: str, seconds: float) -> str:
            # A driver log of --job-log-kib first: the trigger's progress relay fetches the whole log.
            lines = args.job_log_kib * 1024 // 64
            code = (
                "import sys, time; sys.stdout.write(('bench-filler-' + 'x' * 49 + chr(10))"
                f" * {lines}); sys.stdout.flush(); time.sleep({seconds:.0f})"
            )
            return hook.submit_job(
                f'python -c "{code}"', submission_id=f"bench-triggerer-{run_dir.name}-{name}"
            )

        def wait_running(job_ids: list[str]) -> None:
            deadline = time.monotonic() + 120
            while (
                any(hook.get_job_status(j).value == "PENDING" for j in job_ids)
                and time.monotonic() < deadline
            ):
                time.sleep(0.5)

        long_jobs = [submit(f"long-{i}", args.window * len(windows) + 300) for i in range(3)]
        wait_running(long_jobs)
        results = []
        for window_name in windows:
            short = (
                []
                if window_name == "idle"
                else [submit(f"{window_name}-short-{i}", args.window * f) for i, f in enumerate((0.4, 0.7))]
            )
            wait_running(short)
            jobs = short + long_jobs
            start = "burst" if window_name.startswith("burst") else "spread"
            triggers = 0 if window_name == "idle" else args.triggers
            _cached_ssl(window_name.endswith("cached-ssl"))
            say(f"{triggers} triggers on {len(jobs)} jobs, window {window_name}, {args.window:.0f} s")
            result = asyncio.run(window(jobs, triggers, args.poll, args.window, start))
            result["window"] = window_name
            ends = {j: hook.get_job_info(j).end_time_ms for j in short}
            delays = [t - ends[j] / 1000 for t, j in result.pop("_event_times") if ends.get(j)]
            result["event_delay_after_job_end_s_mean"] = statistics.fmean(delays) if delays else None
            result["event_delay_after_job_end_s_max"] = max(delays, default=None)
            results.append(result)
            stall, cpu = result["max_stall_ms"], result["cpu_percent_of_one_core"]
            say(f"  worst stall {stall:.0f} ms, CPU {cpu:.0f}% of a core")
        _cached_ssl(False)
        for job_id in long_jobs:
            hook.stop_job(job_id)

    rows = [
        ("worst event-loop stall (10 ms ticker), ms", "max_stall_ms", "{:.0f}", "<= 100"),
        ("p99 stall, ms", "p99_stall_ms", "{:.1f}", ""),
        ("ticks more than 100 ms late", "ticks_late_over_100ms", "{:d}", ""),
        ("Airflow watchdog 'blocked > 0.2 s' count", "watchdog_blocked_over_0_2s", "{:d}", "0"),
        ("triggerer CPU, % of one core", "cpu_percent_of_one_core", "{:.1f}", "<= 10"),
        ("Ray dashboard CPU, % of one core", "dashboard_cpu_percent_of_one_core", "{:.1f}", ""),
        ("bench process peak RSS so far, MiB", "process_peak_rss_mib", "{:.0f}", ""),
        ("Jobs API calls / s (500 / 10 s = 50 expected)", "api_calls_per_s", "{:.1f}", ""),
        ("API call p50 / p99 / max, ms", None, "", ""),
        ("API errors", "api_errors", "{:d}", ""),
        ("events fired (2 jobs x 100 triggers end in the window)", "events", "{:d}", "200"),
        ("triggers", "triggers", "{:d}", ""),
        ("1-min load average at window start", "load_avg_1m_at_window_start", "{:.2f}", ""),
        ("event delay after job end, mean / max s", None, "", "<= poll"),
    ]
    lines = [
        "| | " + " | ".join(r["window"] for r in results) + " | target |",
        "|---|" + "---|" * (len(results) + 1),
    ]
    for label, key, fmt, target in rows:
        if key is None and label.startswith("API call"):
            cells = [
                f"{r['api_call_p50_ms']:.0f} / {r['api_call_p99_ms']:.0f} / {r['api_call_max_ms']:.0f}"
                for r in results
            ]
        elif key is None:
            cells = [
                f"{r['event_delay_after_job_end_s_mean'] or 0:.1f} / "
                f"{r['event_delay_after_job_end_s_max'] or 0:.1f}"
                for r in results
            ]
        else:
            cells = [fmt.format(r[key]) for r in results]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {target} |")
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "machine": _machine(load_at_start),
        "code": _code(),
        "results": results,
        "table": "\n".join(lines),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(
        "\n" + report["table"] + f"\n\nJSON: {args.out}\nprocess log: {run_dir / 'process.log'}",
        file=terminal,
    )


if __name__ == "__main__":
    main()
