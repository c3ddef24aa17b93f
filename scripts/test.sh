#!/usr/bin/env bash
# Set up both virtualenvs (idempotent), run the code checks (scripts/lint.sh: ruff check, ruff format,
# mypy; under a minute on a fresh clone, seconds after, beside the wheel's build; any finding stops
# here), then every test: the unit tests, and the integration tests on a local Ray head with vLLM's
# CPU engine and real Airflow (in a whole run side by side, the unit tests at nice 19; else one after
# the other).
# Extra arguments go to pytest. SKIP_LINT=1 skips the checks, for a quick local run of a few tests;
# CI never sets it.
# RAYBATCH_TEST_INSTALL=wheel (the default, and CI's) tests what users install: scripts/test_wheel.sh
# builds and checks the sdist and the wheel and installs the wheel, not editable, into a fresh
# .venvs/airflow-wheel, where pytest runs from build/test-root so that the checkout's package is not
# on sys.path. RAYBATCH_TEST_INSTALL=editable runs the tests in .venvs/airflow against the checkout.
# Paths among the arguments replace pyproject's testpaths (tests/): `scripts/test.sh tests/unit`.
# A run without arguments then tests the oldest Airflow and Ray releases we claim
# (scripts/test_matrix.sh); RAYBATCH_TEST_MATRIX=0 leaves that out.
# Every run ends with its account (scripts/test_report.py): each phase's and each test file's time
# and CPU use, the cold vLLM engine starts, `airflow standalone` starts and `airflow dags test` runs, printed as a
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
# The machine's CPU counters every 5 s, for the account's "CPU busy" of each phase and test file.
( while :; do echo "$(date +%s.%N) $(head -n 1 /proc/stat)"; sleep 5; done ) > "$REPORT/cpu.log" 2> /dev/null &
CPU_SAMPLER=$!
trap 'kill "$CPU_SAMPLER" 2> /dev/null; stop_shared_cluster' EXIT
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
# A whole run ends with the version matrix: its virtualenvs are made meanwhile, in the background
# (build/matrix-prepare.rc holds the exit status once they are).
MATRIX=0
if [ $# = 0 ] && [ "${RAYBATCH_TEST_MATRIX:-1}" != 0 ]; then
  MATRIX=1
  mkdir -p "$ROOT/build"
  rm -f "$ROOT/build/matrix-prepare.rc"
  # At nice 19, as the unit tests: its virtualenvs are needed only after them.
  ( nice -n 19 "$ROOT/scripts/test_matrix.sh" --prepare > "$ROOT/build/matrix-prepare.log" 2>&1
    echo $? > "$ROOT/build/matrix-prepare.rc" ) &
fi
# Two passes (tests/conftest.py's RAYBATCH_TEST_PART): the unit tests in two pytest-xdist workers
# (RAYBATCH_TEST_WORKERS), and the tests on the real parts (a Ray head, Airflow, an S3 server). A pass
# that selects no test (pytest's exit 5) is not a failure, unless neither pass ran one.
# A whole run (no arguments; RAYBATCH_TEST_BESIDE=0 turns it off) runs the unit tests, then the
# matrix's unit tests, beside the tests on the real parts, at the lowest CPU priority (nice 19):
# those tests wait much of their time (on Airflow's scheduler, a trigger's poll, a job's driver), and
# the unit tests take the cores they leave idle. Not beside the first ones, which build cold engines
# and keep both cores busy: there, even at nice 19, they slowed them by a quarter (fault injection's
# resumed run took 164 s alone and 216 s beside). The unit tests start once those are done
# (tests/conftest.py writes $COLD_DONE). Their output is kept in build/test-report/{unit,matrix-unit}.log
# and printed after the tests on the real parts.
PYTEST=("$VENV/bin/python" -m pytest -p no:cacheprovider -ra --durations=25)
BESIDE=0
if [ $# = 0 ] && [ "${RAYBATCH_TEST_BESIDE:-1}" != 0 ]; then BESIDE=1; fi
# Every test's time is kept in build/junit-<pass>.xml (--durations prints only the slowest).
unit_pass() {  # the unit tests; their exit status
  local started rc=0
  started=$(date +%s.%N)
  RAYBATCH_TEST_PART=unit "${PYTEST[@]}" --junitxml="$ROOT/build/junit-unit.xml" -n "${RAYBATCH_TEST_WORKERS:-2}" "$@" || rc=$?
  phase "unit tests$([ "$BESIDE" = 1 ] && echo ' (beside the real parts)')" "$started"
  return $rc
}
matrix_unit_pass() {  # the version matrix's unit tests, once its virtualenvs are made; their exit status
  local started rc=0
  started=$(date +%s.%N)
  while [ ! -f "$ROOT/build/matrix-prepare.rc" ]; do sleep 2; done
  phase "matrix: waiting for its virtualenvs" "$started"
  if [ "$(cat "$ROOT/build/matrix-prepare.rc")" != 0 ]; then
    # Shown, and tried again by the matrix itself (the venvs are stamped when whole).
    echo "test.sh: making the matrix's virtualenvs failed:"; tail -n 20 "$ROOT/build/matrix-prepare.log"
  fi
  started=$(date +%s.%N)
  "$ROOT/scripts/test_matrix.sh" --part unit || rc=$?
  phase "version matrix: unit tests$([ "$BESIDE" = 1 ] && echo ' (beside the real parts)')" "$started"
  return $rc
}
# The version matrix's tests on the real parts: a DAG on the oldest Airflow, on the run's Ray head
# and the engines the main pass keeps warm (scripts/test_matrix.sh). Beside the main pass, after the
# matrix's unit tests: by then that pass is on its Airflow tests, which leave a core mostly idle.
matrix_real_pass() {  # their exit status
  local started rc=0
  started=$(date +%s.%N)
  "$ROOT/scripts/test_matrix.sh" --part real_parts || rc=$?
  phase "version matrix: tests on the real parts$([ "$BESIDE" = 1 ] && echo ' (beside the real parts)')" "$started"
  return $rc
}
set +e
unit=0 matrix_unit=0 matrix=0
COLD_DONE=$REPORT/cold-engine-tests-done
rm -f "$COLD_DONE"
export RAYBATCH_TEST_COLD_DONE_FILE=$COLD_DONE
if [ "$BESIDE" = 1 ]; then
  ( renice -n 19 -p "$BASHPID" > /dev/null  # this subshell and all it starts
    while [ ! -f "$COLD_DONE" ]; do sleep 2; done
    unit_pass > "$REPORT/unit.log" 2>&1; echo $? > "$REPORT/unit.rc"
    if [ "$MATRIX" = 1 ]; then
      matrix_unit_pass > "$REPORT/matrix-unit.log" 2>&1; echo $? > "$REPORT/matrix-unit.rc"
      matrix_real_pass > "$REPORT/matrix-real.log" 2>&1; echo $? > "$REPORT/matrix-real.rc"
    fi ) &
  BESIDE_PID=$!
else
  unit_pass "$@"; unit=$?
  if [ "$unit" = 2 ] || [ "$unit" = 3 ] || [ "$unit" = 4 ]; then exit "$unit"; fi  # interrupted, internal or usage error
fi
# The tests on the real parts in one process, or in RAYBATCH_REAL_PARTS_WORKERS pytest-xdist workers,
# each with its own Ray head and S3 server and taking whole test files (a file's own servers use fixed
# ports). One process by default: on a 2-core machine two workers saved 7% of the pass and made it flaky
# (an Airflow API call past 30 s, a warm pool's window passed between two backfills; CI, 2026-11-27).
REAL_WORKERS=${RAYBATCH_REAL_PARTS_WORKERS:-0}
REAL_DIST=(); if [ "$REAL_WORKERS" != 0 ]; then REAL_DIST=(-n "$REAL_WORKERS" --dist loadfile); fi
started=$(date +%s.%N)
RAYBATCH_TEST_PART=real_parts "${PYTEST[@]}" --junitxml="$ROOT/build/junit-real-parts.xml" "${REAL_DIST[@]}" "$@"; real=$?
phase "tests on the real parts" "$started"
touch "$COLD_DONE"  # a pass that ended before it could say so
if [ "$BESIDE" = 1 ]; then
  started=$(date +%s.%N)
  wait "$BESIDE_PID"
  phase "waiting for the unit tests beside" "$started"
  echo "=== The unit tests, run beside the tests on the real parts"; cat "$REPORT/unit.log"
  unit=$(cat "$REPORT/unit.rc" 2> /dev/null || echo 1)
  if [ "$MATRIX" = 1 ]; then
    echo "=== The version matrix's unit tests, run beside"; cat "$REPORT/matrix-unit.log"
    matrix_unit=$(cat "$REPORT/matrix-unit.rc" 2> /dev/null || echo 1)
    echo "=== The version matrix's tests on the real parts, run beside"; cat "$REPORT/matrix-real.log"
    matrix=$(cat "$REPORT/matrix-real.rc" 2> /dev/null || echo 1)
  fi
elif [ "$MATRIX" = 1 ]; then
  matrix_unit_pass; matrix_unit=$?
  matrix_real_pass; matrix=$?
fi
if [ "$matrix_unit" != 0 ]; then matrix=$matrix_unit; fi
WHOLE=(); if [ $# = 0 ] && [ "$MATRIX" = 1 ]; then WHOLE=(--whole); fi
"$VENV/bin/python" "$ROOT/scripts/test_report.py" "$REPORT" "${WHOLE[@]}"; budget=$?
set -e
echo "scripts/test.sh: unit tests exit $unit, tests on the real parts exit $real (5: none selected)," \
  "version matrix exit $matrix, budget exit $budget"
if [ "$unit" = 5 ] && [ "$real" = 5 ]; then exit 5; fi
for rc in "$unit" "$real" "$matrix" "$budget"; do
  if [ "$rc" != 0 ] && [ "$rc" != 5 ]; then exit "$rc"; fi
done
