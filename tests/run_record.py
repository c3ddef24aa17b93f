"""What a test run spends, for scripts/test_report.py: each test file's time and the expensive starts.

scripts/test.sh names one events file for a whole run (``RAYBATCH_TEST_EVENTS``); every pytest pass
of the run (unit, real parts, each version-matrix cell) appends to it:

- ``test_files``: each file's seconds (setup, call and teardown of its tests, so a module-scoped
  fixture counts where it starts) and each of its tests' time span, from this pass;
- ``standalone_start``, ``dags_test``: one line each time a test starts ``airflow standalone`` or
  runs ``airflow dags test`` (:func:`note`);
- ``engine_builds``: vLLM engines a test built in an interpreter of its own, outside any Ray cluster
  (tests/unit/pipeline/ray_env.py). Those on the clusters are counted by scripts/test_report.py
  from vLLM's own "init engine" lines in the clusters' worker logs.

A file, not a counter in memory: the tests import ``tests.conftest`` while pytest loads the same
file as ``conftest``, and the unit pass runs in pytest-xdist workers: each process appends whole
lines to one file (``O_APPEND``), the only state they share.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

import pytest

EVENTS_ENV = "RAYBATCH_TEST_EVENTS"


def note(kind: str, **fields: object) -> None:
    """Append one event to the run's events file; nothing when no run asked for one."""
    path = os.environ.get(EVENTS_ENV)
    if not path:
        return
    line = json.dumps({"kind": kind, "at": time.time(), **fields})
    with open(path, "a", encoding="utf-8") as events:
        events.write(line + "\n")


@dataclass
class _FileTime:
    seconds: float = 0.0
    tests: int = 0
    #: Each test's time span, setup to teardown: [start, stop] by test id (a file's tests need not
    #: run together: tests/conftest.py orders them by what they start).
    spans: dict[str, list[float]] = field(default_factory=dict)


@dataclass(eq=False)  # a plugin: pluggy keeps plugins in sets
class RunRecord:
    """A pytest plugin: sums each test file's reports; writes them when the session ends."""

    files: dict[str, _FileTime] = field(default_factory=dict)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = self.files.setdefault(report.nodeid.split("::", 1)[0], _FileTime())
        entry.seconds += report.duration
        entry.tests += report.when == "call"
        span = entry.spans.setdefault(report.nodeid, [report.start, report.stop])
        span[:] = [min(span[0], report.start), max(span[1], report.stop)]

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workerinput") or not self.files:
            return  # an xdist worker: its controller gets the same reports
        note(
            "test_files",
            pass_name=os.environ.get("RAYBATCH_TEST_PASS") or os.environ.get("RAYBATCH_TEST_PART", ""),
            files={
                name: {
                    "seconds": round(entry.seconds, 1),
                    "tests": entry.tests,
                    "spans": list(entry.spans.values()),
                }
                for name, entry in self.files.items()
            },
        )
