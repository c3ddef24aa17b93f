"""Where a cold engine's start-up waits: every process's CPU time over time, and py-spy stacks of some.

Issue 48 point 3 (bench/RESULTS.md 18e): on a fresh machine the first job's engine replica spent ~25 s in
its constructor before vLLM's engine started, ~17 s of it idle. This samples /proc every ``--interval``
seconds (standard library only): for each process its title as it is then (Ray retitles its workers:
``ray::IDLE``, ``ray::MapWorker(...).__init__``), its parent and its CPU seconds (user + system). A
process idle for a stretch shows as flat CPU seconds. Processes whose title matches ``--spy`` are
dumped with ``py-spy dump --nonblocking`` every ``--spy-every`` seconds (what each thread waits on),
for the first ``--spy-for`` seconds.

usage: python3 bench/gpu/startmon.py OUT_PREFIX [--interval 0.25] [--spy REGEX] [--spy-every 1]
       [--spy-for 200]    runs until SIGTERM / SIGINT, then writes OUT_PREFIX-procs.json
       (and OUT_PREFIX-spy.txt as it goes)
       python3 bench/gpu/startmon.py --summary OUT_PREFIX-procs.json [REGEX ...]
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

TICKS = os.sysconf("SC_CLK_TCK")
#: Processes worth following: Python, Ray's workers and daemons, vLLM's EngineCore.
KEEP = re.compile(r"python|ray::|VLLM|EngineCore|forkserver|raylet|gcs_server|raw_vllm")
PY_SPY = shutil.which("py-spy") or "/tmp/site/bin/py-spy"


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            return handle.read().decode(errors="replace")
    except OSError:
        return None


def _stat(pid: str) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of a live process; None if gone."""
    text = _read(f"/proc/{pid}/stat")
    if text is None:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS


class Monitor:
    def __init__(self, prefix: str, interval: float, spy: str | None, spy_every: float, spy_for: float):
        self.prefix, self.interval = prefix, interval
        self.spy = re.compile(spy) if spy else None
        self.spy_every, self.spy_until = spy_every, time.time() + spy_for
        self.t0 = time.time()
        self.procs: dict[str, dict[str, Any]] = {}  # "pid:start" -> its record
        self.titles: dict[str, str] = {}  # pid -> current title
        self.stop = threading.Event()

    def sample(self) -> None:
        now = round(time.time(), 3)
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            title = _read(f"/proc/{pid}/cmdline")
            if not title:
                continue
            title = title.replace("\0", " ").strip()[:200]
            if not KEEP.search(title):
                continue
            stat = _stat(pid)
            if stat is None:
                continue
            ppid, cpu = stat
            record = self.procs.setdefault(pid, {"pid": int(pid), "ppid": ppid, "titles": [], "cpu": []})
            if not record["titles"] or record["titles"][-1][1] != title:
                record["titles"].append([now, title])
            if not record["cpu"] or record["cpu"][-1][1] != round(cpu, 2):
                record["cpu"].append([now, round(cpu, 2)])
            record["last"] = now
            self.titles[pid] = title

    def run_sampler(self) -> None:
        while not self.stop.is_set():
            try:
                self.sample()
            except Exception as err:  # noqa: BLE001 - a measurement aid: never fail the run for it
                print(f"startmon: {type(err).__name__}: {err}", file=sys.stderr)
            self.stop.wait(self.interval)

    def run_spy(self) -> None:
        if self.spy is None or not os.path.exists(PY_SPY):
            return
        with open(f"{self.prefix}-spy.txt", "w") as out:
            while not self.stop.is_set() and time.time() < self.spy_until:
                started = time.time()
                for pid, title in list(self.titles.items()):
                    if not self.spy.search(title) or not os.path.exists(f"/proc/{pid}"):
                        continue
                    try:
                        dump = subprocess.run(
                            [PY_SPY, "dump", "--nonblocking", "--pid", pid],
                            capture_output=True,
                            text=True,
                            timeout=5,
                        ).stdout
                    except (OSError, subprocess.TimeoutExpired) as err:
                        dump = f"py-spy: {type(err).__name__}"
                    out.write(f"=== {time.time():.3f} pid {pid} {title[:100]}\n")
                    out.write("\n".join(dump.splitlines()[:90]) + "\n")
                out.flush()
                self.stop.wait(max(0.0, self.spy_every - (time.time() - started)))

    def write(self) -> None:
        Path(f"{self.prefix}-procs.json").write_text(
            json.dumps({"t0": self.t0, "interval": self.interval, "procs": list(self.procs.values())})
        )


def summary(path: str, patterns: list[str]) -> None:
    """Per process whose title matches one of ``patterns``: when seen, its titles, CPU busy per second,
    and its idle stretches (>= 2 s with under 10% of a core)."""
    data = json.loads(Path(path).read_text())
    wanted = [re.compile(p) for p in patterns or [r"vLLMEngineStage|EngineCore|forkserver|registry|raw_vllm"]]
    for proc in sorted(data["procs"], key=lambda p: p["titles"][0][0]):
        if not any(w.search(t) for w in wanted for _, t in proc["titles"]):
            continue
        cpu = proc["cpu"]
        first, last = proc["titles"][0][0], proc.get("last", proc["titles"][0][0])
        print(
            f"pid {proc['pid']} (parent {proc['ppid']}): {first:.1f} .. {last:.1f} ({last - first:.1f} s), "
            f"CPU {cpu[-1][1] - cpu[0][1]:.1f} s"
        )
        for t, title in proc["titles"]:
            print(f"   {t:.2f} {title[:120]}")
        for (t1, c1), (t2, c2) in zip(cpu, cpu[1:], strict=False):
            if t2 - t1 >= 2 and (c2 - c1) / (t2 - t1) < 0.1:
                print(f"   idle {t1:.2f} .. {t2:.2f} ({t2 - t1:.1f} s, {c2 - c1:.2f} CPU s)")


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["--summary"]:
        return summary(args[1], args[2:])
    prefix = args[0]
    options = {"--interval": "0.25", "--spy": "", "--spy-every": "1", "--spy-for": "200"}
    for key, value in zip(args[1::2], args[2::2], strict=False):
        options[key] = value
    monitor = Monitor(
        prefix,
        float(options["--interval"]),
        options["--spy"] or None,
        float(options["--spy-every"]),
        float(options["--spy-for"]),
    )
    signal.signal(signal.SIGTERM, lambda *_: monitor.stop.set())
    signal.signal(signal.SIGINT, lambda *_: monitor.stop.set())
    spy = threading.Thread(target=monitor.run_spy, daemon=True)
    spy.start()
    monitor.run_sampler()
    spy.join(6)
    monitor.write()


if __name__ == "__main__":
    main()
