"""GPU utilization and the CPU the run's processes use, sampled beside a run (issue 48's curve).

Every ``interval`` seconds (default 0.5): the GPU's utilization (NVML's "a kernel was running" share of
the last sample period, as nvidia-smi's utilization.gpu), its memory-controller utilization, memory used,
power and SM clock (NVML through nvidia-ml-py, which the device image has; nvidia-smi otherwise), the
host's busy cores (/proc/stat), and the cores each process group of bench/gpu/procmon.py used since the
last sample (engine_core: vLLM's EngineCores; ray_worker: Ray's tasks and actors, our replicas among
them; raw / mp_child: raw vLLM's process and its prepare workers). Each sample has its epoch time, so
a summary can keep the samples of a window (bench/gpu/rpg_summary.py: the generating window).

usage: python3 bench/gpu/gpumon.py OUT_JSON [--interval 0.5]      runs until SIGTERM / SIGINT
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from procmon import _group  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


class _Gpu:
    def __init__(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # noqa: BLE001 - no NVML binding: nvidia-smi each sample
            self._nvml = None

    def read(self) -> dict[str, float | None]:
        if self._nvml is not None:
            nvml, handle = self._nvml, self._handle
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            return {
                "gpu_util": float(rates.gpu),
                "mem_util": float(rates.memory),
                "mem_used_mib": nvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20,
                "power_w": nvml.nvmlDeviceGetPowerUsage(handle) / 1000,
                "sm_mhz": float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
            }
        fields = "utilization.gpu,utilization.memory,memory.used,power.draw,clocks.sm"
        try:
            out = subprocess.run(
                ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-i", "0"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        values: list[float | None] = []
        for value in out.split(","):
            try:
                values.append(float(value))
            except ValueError:
                values.append(None)
        values += [None] * (5 - len(values))
        return dict(
            zip(("gpu_util", "mem_util", "mem_used_mib", "power_w", "sm_mhz"), values[:5], strict=True)
        )


def _host_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all cores."""
    with open("/proc/stat") as handle:
        fields = [int(value) for value in handle.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def _process_ticks() -> dict[tuple[str, str], tuple[str, int]]:
    """(pid, start time) -> (group, utime + stime) for the processes procmon groups."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        group = _group(cmdline)
        if group is None:
            continue
        # After the ")": state is field 3, utime 14, stime 15, starttime 22 (1-based in proc(5)).
        out[(pid, fields[19].decode())] = (group, int(fields[11]) + int(fields[12]))
    return out


def main() -> None:
    out = Path(sys.argv[1])
    interval = float(sys.argv[sys.argv.index("--interval") + 1]) if "--interval" in sys.argv else 0.5
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    gpu = _Gpu()
    samples: list[dict[str, Any]] = []  # Any: JSON values.
    last_t, last_host, last_procs = time.time(), _host_ticks(), _process_ticks()
    while not done.wait(interval):
        try:
            now, host, procs = time.time(), _host_ticks(), _process_ticks()
            elapsed = max(now - last_t, 1e-3)
            groups: dict[str, float] = {}
            for key, (group, ticks) in procs.items():
                before = last_procs.get(key)
                if before is not None:
                    groups[group] = groups.get(group, 0.0) + (ticks - before[1]) / TICK / elapsed
            busy = host[0] - last_host[0]
            total = max(host[1] - last_host[1], 1)
            sample: dict[str, Any] = {"t": round(now, 3), **gpu.read()}  # Any: JSON values.
            sample["host_busy_cores"] = round(busy / total * (os.cpu_count() or 1), 2)
            sample["group_cores"] = {group: round(cores, 2) for group, cores in groups.items()}
            samples.append(sample)
            last_t, last_host, last_procs = now, host, procs
        except Exception as err:  # noqa: BLE001 - a measurement aid: never fail the run for it
            print(f"gpumon: {type(err).__name__}: {err}", file=sys.stderr)
    out.write_text(json.dumps({"interval_s": interval, "cpus": os.cpu_count(), "samples": samples}))


if __name__ == "__main__":
    main()
