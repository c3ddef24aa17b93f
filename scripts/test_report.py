"""The test run's account: where its time went and what it started, checked against tests/budget.toml.

scripts/test.sh runs this last: ``test_report.py REPORT_DIR [--whole]``. REPORT_DIR holds
``phases.jsonl`` (test.sh's phases: setup, lint and wheel, each pytest pass, the matrix) and
``events.jsonl`` (tests/run_record.py: each test file's time, ``airflow standalone`` starts,
``airflow dags test`` runs, engines built outside Ray) and ``cpu.log`` (test.sh's samples of the
machine's ``/proc/stat`` every few seconds: how busy both cores were in each phase and test file,
which says where a run waits and where it computes). Cold vLLM engine starts are counted from
vLLM's own line ("init engine (profile, create kv cache, warmup model) took") in the worker logs of
every Ray cluster on the machine that were written during the run, plus those the tests noted, and
put to the test file that ran at that moment.

Prints a table, writes REPORT_DIR/report.json, and with ``--whole`` (a run of the whole suite) exits 1
when the run is over its budget. Standard library only: it runs in any of the project's venvs.
"""

from __future__ import annotations

import argparse
import glob
import json
import re
import sys
import time
import tomllib
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUDGET = ROOT / "tests" / "budget.toml"
#: vLLM's line at the end of every engine build (vllm/v1/engine/core.py), with its logger's time
#: ("INFO 12-02 05:12:33 [core.py:403] init engine ...": month-day and local time, no year).
ENGINE_BUILT = re.compile(
    r"^.*(?P<month>\d\d)-(?P<day>\d\d) (?P<time>\d\d:\d\d:\d\d)\S* \[[^\]]*\] init engine \(profile.*$",
    re.MULTILINE,
)
#: Where the tests' Ray clusters keep their workers' logs: scripts/local_ray_cluster.sh's --temp-dir
#: folders (/tmp/ray-<GCS port>, /tmp/ray-raybatch-*) and Ray's default, for drivers that start their
#: own; a dead worker's under logs/old/ (not the job drivers' logs, which repeat their actors' lines).
RAY_LOG_GLOBS = tuple(
    f"/tmp/ray*/session_2*/logs/{folder}worker-*.{stream}"
    for folder in ("", "old/")
    for stream in ("err", "out")
)


@dataclass(frozen=True)
class TestFile:
    pass_name: str
    name: str
    seconds: float
    tests: int
    spans: tuple[tuple[float, float], ...]  # each test's, setup to teardown

    def ran_at(self, at: float) -> bool:
        """Whether one of its tests ran at ``at`` (log times have whole seconds: within one)."""
        return any(start - 1 <= at <= stop + 1 for start, stop in self.spans)


@dataclass(frozen=True)
class CpuSample:
    at: float
    busy: int  # jiffies of all cores not idle nor waiting on I/O, since boot
    total: int


def cpu_samples(path: Path) -> list[CpuSample]:
    """``cpu.log``'s lines: ``<epoch seconds> cpu <user> <nice> <system> <idle> <iowait> ...``."""
    samples = []
    for line in path.read_text().splitlines() if path.exists() else []:
        at, label, *fields = line.split()
        if label != "cpu" or len(fields) < 5:
            continue
        jiffies = [int(field) for field in fields]
        idle = jiffies[3] + jiffies[4]
        samples.append(CpuSample(float(at), sum(jiffies) - idle, sum(jiffies)))
    return samples


def busy_share(samples: list[CpuSample], spans: tuple[tuple[float, float], ...]) -> float | None:
    """The share of the machine's CPU time that was busy over ``spans``, from the samples that fall
    in them (None where fewer than two do: a span shorter than the sampling)."""
    busy = total = 0
    for start, stop in spans:
        inside = [sample for sample in samples if start <= sample.at <= stop]
        if len(inside) >= 2:
            busy += inside[-1].busy - inside[0].busy
            total += inside[-1].total - inside[0].total
    return round(busy / total, 2) if total else None


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass(frozen=True)
class EngineBuild:
    at: float
    #: On a cluster of scripts/local_ray_cluster.sh (the tests on the real parts'), not a Ray a unit
    #: test's interpreter started for itself in Ray's default /tmp/ray: the passes may overlap in time.
    on_test_cluster: bool


def engine_builds(since: float) -> list[EngineBuild]:
    """The vLLM engine builds logged on this machine since ``since`` (epoch seconds)."""
    year = time.localtime(since).tm_year
    builds: dict[str, EngineBuild] = {}  # by the whole line: a line Ray wrote to two files counts once
    for pattern in RAY_LOG_GLOBS:
        # glob.glob, not Path.glob: it skips a folder removed while it lists (the unit tests beside make
        # and remove /tmp/ray* folders of their own), where Path.glob raised FileNotFoundError.
        for path in map(Path, glob.glob(pattern)):
            try:
                if path.stat().st_mtime < since:
                    continue
                text = path.read_text(errors="replace")
            except OSError:
                continue  # a cluster's folder removed while we read
            for match in ENGINE_BUILT.finditer(text):
                stamp = f"{year}-{match['month']}-{match['day']} {match['time']}"
                at = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").timestamp()
                if at >= since - 1:
                    builds[match[0]] = EngineBuild(at, not path.is_relative_to("/tmp/ray"))
    return sorted(builds.values(), key=lambda build: build.at)


def test_files(events: list[dict]) -> list[TestFile]:
    return [
        TestFile(
            event["pass_name"],
            name,
            entry["seconds"],
            entry["tests"],
            tuple((start, stop) for start, stop in entry["spans"]),
        )
        for event in events
        if event["kind"] == "test_files"
        for name, entry in event["files"].items()
    ]


def owner(build: EngineBuild, files: list[TestFile]) -> str:
    """The test file one of whose tests ran at the build's time: of a pass on the real parts for a
    build on a test cluster, else of another pass (a unit test's own Ray), when both ran then."""
    running = [f for f in files if f.ran_at(build.at)]
    preferred = [f for f in running if ("real_parts" in f.pass_name) == build.on_test_cluster]
    if running:
        chosen = (preferred or running)[0]
        return f"{chosen.pass_name}: {chosen.name}"
    return "(between test files)"


def account(report_dir: Path) -> dict:
    phases = read_jsonl(report_dir / "phases.jsonl")
    events = read_jsonl(report_dir / "events.jsonl")
    started = min((phase["start"] for phase in phases), default=time.time())
    ended = max((phase["end"] for phase in phases), default=time.time())
    files = test_files(events)
    cpu = cpu_samples(report_dir / "cpu.log")
    # On the Ray clusters, from their logs; outside any (a test's own interpreter), as the tests noted.
    builds = engine_builds(started) + [
        EngineBuild(event["at"], on_test_cluster=False)
        for event in events
        if event["kind"] == "engine_builds"
        for _ in range(event["count"])
    ]
    builds_by_file = Counter(owner(build, files) for build in builds)
    kinds = Counter(event["kind"] for event in events)
    return {
        "whole_run_s": round(ended - started, 1),
        "phases": [
            {
                "phase": p["phase"],
                "seconds": round(p["end"] - p["start"], 1),
                "cpu_busy": busy_share(cpu, ((p["start"], p["end"]),)),
            }
            for p in phases
        ],
        "counts": {
            "cold_engine_starts": len(builds),
            "standalone_starts": kinds["standalone_start"],
            "dags_test_runs": kinds["dags_test"],
        },
        "test_files": sorted(
            (
                {
                    "pass": f.pass_name,
                    "file": f.name,
                    "seconds": f.seconds,
                    "tests": f.tests,
                    "engine_starts": builds_by_file.get(f"{f.pass_name}: {f.name}", 0),
                    "cpu_busy": busy_share(cpu, f.spans),
                }
                for f in files
            ),
            key=lambda row: -row["seconds"],
        ),
        "engine_starts_outside_test_files": builds_by_file.get("(between test files)", 0),
    }


def over_budget(report: dict, budget: dict) -> list[str]:
    limits = {
        "whole run (minutes)": (report["whole_run_s"] / 60, budget["whole_run_minutes"]),
        "cold engine starts": (report["counts"]["cold_engine_starts"], budget["cold_engine_starts"]),
        "airflow standalone starts": (report["counts"]["standalone_starts"], budget["standalone_starts"]),
    }
    return [f"{what}: {value:g} > {limit:g}" for what, (value, limit) in limits.items() if value > limit]


def print_table(report: dict, budget: dict, rows: int = 30) -> None:
    print("\n== Test run: phases ==")
    print(f"  {'':<34} {'seconds':>10} {'CPU busy':>9}")
    for phase in report["phases"]:
        print(f"  {phase['phase']:<34} {phase['seconds']:>8.1f} s {_share(phase['cpu_busy']):>9}")
    print(
        f"  {'whole run':<34} {report['whole_run_s']:>8.1f} s ({report['whole_run_s'] / 60:.1f} min; "
        f"budget {budget['whole_run_minutes']} min)"
    )
    counts = report["counts"]
    print("== Starts ==")
    for label, key in (
        ("cold vLLM engine starts", "cold_engine_starts"),
        ("airflow standalone starts", "standalone_starts"),
    ):
        print(f"  {label:<28} {counts[key]:>4} (budget {budget[key]})")
    print(f"  {'airflow dags test runs':<28} {counts['dags_test_runs']:>4}")
    print(f"== Test files, slowest first (the {rows} slowest; all in report.json) ==")
    print(f"  {'seconds':>8} {'tests':>5} {'engines':>7} {'CPU busy':>8}  pass: file")
    for row in report["test_files"][:rows]:
        where = f"{row['pass']}: {row['file']}"
        counts = f"{row['seconds']:>8.1f} {row['tests']:>5} {row['engine_starts']:>7}"
        print(f"  {counts} {_share(row['cpu_busy']):>8}  {where}")
    if report["engine_starts_outside_test_files"]:
        print(f"  (engine starts outside any test file's time: {report['engine_starts_outside_test_files']})")


def _share(share: float | None) -> str:
    return "-" if share is None else f"{share:.0%}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report_dir", type=Path)
    parser.add_argument("--whole", action="store_true", help="a whole run: check it against the budget")
    args = parser.parse_args()
    budget = tomllib.loads(BUDGET.read_text())
    report = account(args.report_dir)
    (args.report_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print_table(report, budget)
    if not args.whole:
        print("(a partial run: not checked against tests/budget.toml)")
        return 0
    problems = over_budget(report, budget)
    for problem in problems:
        print(f"test_report: over budget (tests/budget.toml): {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
