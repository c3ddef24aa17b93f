#!/usr/bin/env bash
# Set up both virtualenvs (idempotent), run the code checks (scripts/lint.sh: ruff check, ruff format,
# mypy; under a minute on a fresh clone, seconds after, beside the wheel's build; any finding stops
# here), then every test: unit tests, then the integration tests on a local Ray head with vLLM's CPU
# engine and real Airflow.
# Extra arguments go to pytest. SKIP_LINT=1 skips the checks, for a quick local run of a few tests;
# CI never sets it.
# RAYBATCH_TEST_INSTALL=wheel (the default, and CI's) tests what users install: scripts/test_wheel.sh
# builds and checks the sdist and the wheel and installs the wheel, not editable, into a fresh
# .venvs/airflow-wheel, where pytest runs from build/test-root so that the checkout's package is not
# on sys.path. RAYBATCH_TEST_INSTALL=editable runs the tests in .venvs/airflow against the checkout.
# Paths among the arguments replace pyproject's testpaths (tests/): `scripts/test.sh tests/unit`.
# A run without arguments then tests the oldest Airflow and Ray releases we claim
# (scripts/test_matrix.sh); RAYBATCH_TEST_MATRIX=0 leaves that out.
# Every run ends with its account (scripts/test_report.py): each phase's and each test file's time,
# the cold vLLM engine starts, `airflow standalone` starts and `airflow dags test` runs, printed as a
# table and kept in build/test-report/report.json. A whole run (no arguments) over tests/budget.toml
# fails.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
REPORT=$ROOT/build/test-report
rm -rf "$REPORT" && mkdir -p "$REPORT"
export RAYBATCH_TEST_EVENTS=$REPORT/events.jsonl
# phase NAME START: one line of the account, from START (date +%s.%N) to now.
phase() { printf '{"phase": "%s", "start": %s, "end": %s}\n' "$1" "$2" "$(date +%s.%N)" >> "$REPORT/phases.jsonl"; }
# What the run's pytest passes share (tests/conftest.py SHARED_DIR): the Ray head, started by the first
# pass that needs it and stopped when the run ends, and the tiny models, built once.
SHARED=$ROOT/build/test-shared
stop_shared_cluster() {
  local state
  for state in "$SHARED"/ray-state-*; do
    [ -d "$state" ] && RAYBATCH_STATE=$state "$ROOT/scripts/local_ray_cluster.sh" stop > /dev/null 2>&1
  done
  return 0
}
stop_shared_cluster  # one an interrupted run left
rm -rf "$SHARED" && mkdir -p "$SHARED"
trap stop_shared_cluster EXIT
export RAYBATCH_TEST_SHARED_DIR=$SHARED
started=$(date +%s.%N)
scripts/setup_envs.sh
# Headless Chromium for the Airflow UI test (Debian's package; the machines run as root).
if ! command -v chromium > /dev/null; then
  (apt-get install -y -q chromium || { apt-get update -q && apt-get install -y -q chromium; }) > /dev/null
fi
phase "set-up (virtualenvs, chromium)" "$started"
# The code checks beside the wheel's build and install: neither needs the other.
started=$(date +%s.%N)
LINT_PID=
if [ "${SKIP_LINT:-0}" != 1 ]; then
  scripts/lint.sh > "$REPORT/lint.log" 2>&1 &
  LINT_PID=$!
fi
case "${RAYBATCH_TEST_INSTALL:=wheel}" in
  wheel) scripts/test_wheel.sh; VENV=$ROOT/.venvs/airflow-wheel ;;
  editable) VENV=$ROOT/.venvs/airflow ;;
  *) echo "RAYBATCH_TEST_INSTALL=$RAYBATCH_TEST_INSTALL: use wheel or editable" >&2; exit 2 ;;
esac
if [ -n "$LINT_PID" ]; then
  lint=0; wait "$LINT_PID" || lint=$?
  cat "$REPORT/lint.log"
  [ "$lint" = 0 ] || exit "$lint"
fi
phase "lint beside the wheel" "$started"
if [ "$RAYBATCH_TEST_INSTALL" = wheel ]; then cd build/test-root; fi
export RAYBATCH_TEST_INSTALL
# A whole run ends with the version matrix: its virtualenvs are made meanwhile, in the background.
MATRIX=0
if [ $# = 0 ] && [ "${RAYBATCH_TEST_MATRIX:-1}" != 0 ]; then
  MATRIX=1
  mkdir -p "$ROOT/build"
  "$ROOT/scripts/test_matrix.sh" --prepare > "$ROOT/build/matrix-prepare.log" 2>&1 &
  PREPARE_PID=$!
fi
# Two passes (tests/conftest.py's RAYBATCH_TEST_PART): the unit tests in two pytest-xdist workers
# (RAYBATCH_TEST_WORKERS), then the tests on the real parts (a Ray head, Airflow, an S3 server). A pass
# that selects no test (pytest's exit 5) is not a failure, unless neither pass ran one.
PYTEST=("$VENV/bin/python" -m pytest -p no:cacheprovider -ra --durations=25)
set +e
# Every test's time is kept in build/junit-<pass>.xml (--durations prints only the slowest).
started=$(date +%s.%N)
RAYBATCH_TEST_PART=unit "${PYTEST[@]}" --junitxml="$ROOT/build/junit-unit.xml" -n "${RAYBATCH_TEST_WORKERS:-2}" "$@"; unit=$?
phase "unit tests" "$started"
if [ "$unit" = 2 ] || [ "$unit" = 3 ] || [ "$unit" = 4 ]; then exit "$unit"; fi  # interrupted, internal or usage error
# The tests on the real parts in one process, or in RAYBATCH_REAL_PARTS_WORKERS pytest-xdist workers,
# each with its own Ray head and S3 server and taking whole test files (a file's own servers use fixed
# ports). One process by default: on a 2-core machine two workers saved 7% of the pass and made it flaky
# (an Airflow API call past 30 s, a warm pool's window passed between two backfills; CI, 2026-11-27).
REAL_WORKERS=${RAYBATCH_REAL_PARTS_WORKERS:-0}
REAL_DIST=(); if [ "$REAL_WORKERS" != 0 ]; then REAL_DIST=(-n "$REAL_WORKERS" --dist loadfile); fi
started=$(date +%s.%N)
RAYBATCH_TEST_PART=real_parts "${PYTEST[@]}" --junitxml="$ROOT/build/junit-real-parts.xml" "${REAL_DIST[@]}" "$@"; real=$?
phase "tests on the real parts" "$started"
# The oldest Airflow and Ray we claim, one side at a time (scripts/test_matrix.sh), after a whole run
# (no pytest arguments) unless RAYBATCH_TEST_MATRIX=0.
matrix=0
if [ "$MATRIX" = 1 ]; then
  started=$(date +%s.%N)
  # A failed preparation is shown and tried again by the matrix itself (the venvs are stamped when whole).
  wait "$PREPARE_PID" || { echo "test.sh: making the matrix's virtualenvs failed:"; tail -n 20 "$ROOT/build/matrix-prepare.log"; }
  phase "matrix: waiting for its virtualenvs" "$started"
  started=$(date +%s.%N)
  "$ROOT/scripts/test_matrix.sh"; matrix=$?
  phase "version matrix" "$started"
fi
WHOLE=(); if [ $# = 0 ] && [ "$MATRIX" = 1 ]; then WHOLE=(--whole); fi
"$VENV/bin/python" "$ROOT/scripts/test_report.py" "$REPORT" "${WHOLE[@]}"; budget=$?
set -e
echo "scripts/test.sh: unit tests exit $unit, tests on the real parts exit $real (5: none selected)," \
  "version matrix exit $matrix, budget exit $budget"
if [ "$unit" = 5 ] && [ "$real" = 5 ]; then exit 5; fi
for rc in "$unit" "$real" "$matrix" "$budget"; do
  if [ "$rc" != 0 ] && [ "$rc" != 5 ]; then exit "$rc"; fi
done
