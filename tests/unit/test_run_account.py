"""scripts/test_report.py, the test run's account: phases, CPU use, engine builds put to their test file."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_account_module():
    spec = importlib.util.spec_from_file_location("test_report_script", ROOT / "scripts" / "test_report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


report_script = _load_account_module()

#: After any log on this machine: the account's log scan finds no real engine build this late.
T0 = time.time() + 10**7


def _cpu_line(at: float, busy: int, idle: int) -> str:
    # /proc/stat's first line: user nice system idle iowait irq softirq steal
    return f"{at} cpu {busy} 0 0 {idle} 0 0 0 0"


def _write_run(folder: Path, cpu: list[str], files: dict, phases: list[dict]) -> None:
    (folder / "cpu.log").write_text("\n".join(cpu) + "\n")
    (folder / "phases.jsonl").write_text("".join(json.dumps(phase) + "\n" for phase in phases))
    events = [
        {"kind": "test_files", "at": T0, "pass_name": name, "files": by_file}
        for name, by_file in files.items()
    ]
    (folder / "events.jsonl").write_text("".join(json.dumps(event) + "\n" for event in events))


def test_each_phase_and_file_says_how_busy_the_cpu_was(tmp_path: Path) -> None:
    # 0-100 s: 50 of 100 jiffies busy per 10 s (half busy); 100-200 s: all busy.
    cpu = [
        _cpu_line(T0 + t, busy=t // 2 if t <= 100 else 50 + (t - 100), idle=t // 2 if t <= 100 else 50)
        for t in range(0, 201, 10)
    ]
    files = {
        "unit": {"tests/unit/a.py": {"seconds": 100.0, "tests": 3, "spans": [[T0, T0 + 100]]}},
        "real_parts": {
            "tests/integration/b.py": {"seconds": 100.0, "tests": 1, "spans": [[T0 + 100, T0 + 200]]}
        },
    }
    phases = [
        {"phase": "unit tests", "start": T0, "end": T0 + 100},
        {"phase": "tests on the real parts", "start": T0 + 100, "end": T0 + 200},
    ]
    _write_run(tmp_path, cpu, files, phases)

    report = report_script.account(tmp_path)

    assert [(p["phase"], p["cpu_busy"]) for p in report["phases"]] == [
        ("unit tests", 0.5),
        ("tests on the real parts", 1.0),
    ]
    busy = {row["file"]: row["cpu_busy"] for row in report["test_files"]}
    assert busy == {"tests/unit/a.py": 0.5, "tests/integration/b.py": 1.0}
    assert report["whole_run_s"] == 200.0


def test_a_span_shorter_than_the_sampling_has_no_cpu_figure(tmp_path: Path) -> None:
    cpu = [_cpu_line(T0 + t, busy=t, idle=t) for t in range(0, 21, 10)]
    files = {"unit": {"tests/unit/a.py": {"seconds": 2.0, "tests": 1, "spans": [[T0 + 11, T0 + 13]]}}}
    _write_run(tmp_path, cpu, files, [{"phase": "unit tests", "start": T0, "end": T0 + 20}])

    report = report_script.account(tmp_path)

    assert report["test_files"][0]["cpu_busy"] is None
    assert report["phases"][0]["cpu_busy"] == 0.5


@pytest.mark.parametrize(("on_test_cluster", "expected"), [(True, "real_parts"), (False, "unit")])
def test_a_build_while_two_passes_overlap_goes_to_the_pass_whose_cluster_logged_it(
    on_test_cluster: bool, expected: str
) -> None:
    """The unit pass runs beside the tests on the real parts: a build on a test cluster is the real
    parts' file's, one in a unit test's own Ray (Ray's default /tmp/ray) the unit file's."""
    unit = report_script.TestFile("unit", "tests/unit/a.py", 10.0, 1, ((T0, T0 + 10),))
    real = report_script.TestFile("real_parts", "tests/integration/b.py", 10.0, 1, ((T0, T0 + 10),))
    build = report_script.EngineBuild(T0 + 5, on_test_cluster)

    assert report_script.owner(build, [unit, real]).startswith(expected + ": ")
    assert report_script.owner(build, [real, unit]).startswith(expected + ": ")
    assert report_script.owner(report_script.EngineBuild(T0 + 50, on_test_cluster), [unit, real]) == (
        "(between test files)"
    )


def test_a_whole_run_over_its_budget_is_named() -> None:
    budget = {"whole_run_minutes": 40, "cold_engine_starts": 20, "standalone_starts": 2}
    report = {"whole_run_s": 41 * 60, "counts": {"cold_engine_starts": 21, "standalone_starts": 2}}

    problems = report_script.over_budget(report, budget)

    assert len(problems) == 2, problems
    assert any("41" in problem for problem in problems) and any("21" in problem for problem in problems)
