"""Peak memory of the processes of a run, sampled from /proc (standard library only).

Every ``interval`` seconds each process's VmRSS and VmHWM (the kernel's own high-water mark of its
resident set, so a peak between two samples still counts) is read and the process put in a group by
its command line:

  driver        our pipeline's job driver (``airflow_provider_raybatch.pipeline``)
  raw           bench/raw_vllm.py's main process
  engine_core   vLLM's EngineCore (``VLLM::EngineCore``) and the replicas' forkservers
  ray_worker    Ray worker processes: tasks and actors (``ray::...``), the job supervisor included
  mp_child      multiprocessing children (raw_vllm.py's prepare workers, spawn)
  ray_system    raylet, GCS, dashboard and the other daemons of the head

Reported per group: the largest single process's peak (VmHWM), the peak of the group's summed RSS at
one sample, and the five largest processes; and the machine's peak used memory (MemTotal -
MemAvailable) above what it was when sampling started.

usage (standalone, for raw vLLM):  python3 bench/gpu/procmon.py OUT_JSON [--interval 0.5]
       runs until SIGTERM / SIGINT, then writes OUT_JSON.   In Python: ``with ProcMonitor() as m: ...``
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from typing import Any

GROUPS = (
    ("driver", ("airflow_provider_raybatch.pipeline",)),
    ("raw", ("raw_vllm.py",)),
    ("engine_core", ("VLLM::EngineCore", "EngineCore", "forkserver import main")),
    ("mp_child", ("multiprocessing.spawn", "multiprocessing-fork")),
    ("ray_worker", ("ray::",)),
    (
        "ray_system",
        (
            "raylet",
            "gcs_server",
            "dashboard",
            "log_monitor",
            "monitor.py",
            "runtime_env/agent",
            "ray_client_server",
            "default_worker.py",
        ),
    ),
)


def _group(cmdline: str) -> str | None:
    for name, needles in GROUPS:
        if any(needle in cmdline for needle in needles):
            return name
    return None


def _status_kib(pid: str) -> tuple[int, int] | None:
    """(VmRSS, VmHWM) in KiB, or None for a process gone or without memory (a kernel thread)."""
    rss = hwm = None
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith("VmHWM:"):
                    hwm = int(line.split()[1])
    except OSError:
        return None
    return (rss, hwm) if rss is not None and hwm is not None else None


def _used_kib() -> int:
    values = {}
    with open("/proc/meminfo") as handle:
        for line in handle:
            key, value = line.split(":", 1)
            values[key] = int(value.split()[0])
    return values["MemTotal"] - values["MemAvailable"]


class ProcMonitor:
    """Samples in a thread while the ``with`` block runs; :meth:`report` gives the peaks."""

    def __init__(self, interval: float = 0.5) -> None:
        self.interval = interval
        self._procs: dict[tuple[str, str], dict[str, Any]] = {}  # (pid, start time) -> what we know
        self._group_sum_peak: dict[str, int] = {}
        self._used_start = _used_kib()
        self._used_peak = self._used_start
        self._samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="procmon", daemon=True)

    def __enter__(self) -> ProcMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join()
            self.sample()  # a last look

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception as err:  # noqa: BLE001 - a measurement aid: never fail the run for it
                print(f"procmon: {type(err).__name__}: {err}", file=sys.stderr)
            self._stop.wait(self.interval)

    def sample(self) -> None:
        sums: dict[str, int] = {}
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat", "rb") as handle:
                    started = handle.read().rsplit(b")", 1)[1].split()[19].decode()  # field 22: start time
            except (OSError, IndexError):
                continue
            # Read each time: a child names itself after the fork (vLLM's EngineCore, Ray's "ray::<actor>").
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as handle:
                    cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            group = _group(cmdline)
            if group is None:
                continue
            known = self._procs.setdefault((pid, started), {"hwm_kib": 0, "rss_kib": 0})
            known.update(group=group, cmdline=cmdline[:160])
            memory = _status_kib(pid)
            if memory is None:
                continue
            rss, hwm = memory
            known["rss_kib"] = max(known["rss_kib"], rss)
            known["hwm_kib"] = max(known["hwm_kib"], hwm)
            sums[known["group"]] = sums.get(known["group"], 0) + rss
        for group, total in sums.items():
            self._group_sum_peak[group] = max(self._group_sum_peak.get(group, 0), total)
        self._used_peak = max(self._used_peak, _used_kib())
        self._samples += 1

    def report(self) -> dict[str, Any]:  # Any: JSON values.
        groups: dict[str, Any] = {}  # Any: JSON values.
        for (pid, _), proc in self._procs.items():
            if not proc["hwm_kib"]:
                continue
            entry = groups.setdefault(proc["group"], {"processes": 0, "peak_rss_mib": 0.0, "top": []})
            entry["processes"] += 1
            entry["peak_rss_mib"] = max(entry["peak_rss_mib"], proc["hwm_kib"] / 1024)
            entry["top"].append(
                {
                    "pid": int(pid),
                    "peak_rss_mib": round(proc["hwm_kib"] / 1024, 1),
                    "cmdline": proc["cmdline"],
                }
            )
        for group, entry in groups.items():
            entry["top"] = sorted(entry["top"], key=lambda p: -p["peak_rss_mib"])[:5]
            entry["peak_rss_mib"] = round(entry["peak_rss_mib"], 1)
            entry["peak_sum_rss_mib"] = round(self._group_sum_peak.get(group, 0) / 1024, 1)
        return {
            "interval_s": self.interval,
            "samples": self._samples,
            "machine_used_mib_at_start": round(self._used_start / 1024),
            "machine_used_peak_above_start_mib": round((self._used_peak - self._used_start) / 1024),
            "groups": groups,
        }


def main() -> None:
    out = sys.argv[1]
    interval = float(sys.argv[sys.argv.index("--interval") + 1]) if "--interval" in sys.argv else 0.5
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    monitor = ProcMonitor(interval).__enter__()
    while not done.wait(1):
        pass
    monitor.stop()
    with open(out, "w") as handle:
        json.dump(monitor.report(), handle, indent=1)


if __name__ == "__main__":
    main()
