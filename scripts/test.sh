#!/usr/bin/env bash
# Set up both virtualenvs (idempotent), run the code checks (scripts/lint.sh: ruff check, ruff format,
# mypy; under a minute on a fresh clone, seconds after; any finding stops here), then every test: unit
# tests, then the integration tests on a local Ray head with vLLM's CPU engine and real Airflow.
# Extra arguments go to pytest. SKIP_LINT=1 skips the checks, for a quick local run of a few tests;
# CI never sets it.
# RAYBATCH_TEST_INSTALL=wheel (the default, and CI's) tests what users install: scripts/test_wheel.sh
# builds and checks the sdist and the wheel and installs the wheel, not editable, into a fresh
# .venvs/airflow-wheel, where pytest runs from build/test-root so that the checkout's package is not
# on sys.path. RAYBATCH_TEST_INSTALL=editable runs the tests in .venvs/airflow against the checkout.
# Paths among the arguments replace pyproject's testpaths (tests/): `scripts/test.sh tests/unit`.
# A run without arguments then tests the oldest Airflow and Ray releases we claim
# (scripts/test_matrix.sh); RAYBATCH_TEST_MATRIX=0 leaves that out.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
scripts/setup_envs.sh
if [ "${SKIP_LINT:-0}" != 1 ]; then
  scripts/lint.sh
fi
# Headless Chromium for the Airflow UI test (Debian's package; the machines run as root).
if ! command -v chromium > /dev/null; then
  (apt-get install -y -q chromium || { apt-get update -q && apt-get install -y -q chromium; }) > /dev/null
fi
case "${RAYBATCH_TEST_INSTALL:=wheel}" in
  wheel) scripts/test_wheel.sh; VENV=$ROOT/.venvs/airflow-wheel; cd build/test-root ;;
  editable) VENV=$ROOT/.venvs/airflow ;;
  *) echo "RAYBATCH_TEST_INSTALL=$RAYBATCH_TEST_INSTALL: use wheel or editable" >&2; exit 2 ;;
esac
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
RAYBATCH_TEST_PART=unit "${PYTEST[@]}" --junitxml="$ROOT/build/junit-unit.xml" -n "${RAYBATCH_TEST_WORKERS:-2}" "$@"; unit=$?
if [ "$unit" = 2 ] || [ "$unit" = 3 ] || [ "$unit" = 4 ]; then exit "$unit"; fi  # interrupted, internal or usage error
# The tests on the real parts in one process, or in RAYBATCH_REAL_PARTS_WORKERS pytest-xdist workers,
# each with its own Ray head and S3 server and taking whole test files (a file's own servers use fixed
# ports). One process by default: on a 2-core machine two workers saved 7% of the pass and made it flaky
# (an Airflow API call past 30 s, a warm pool's window passed between two backfills; CI, 2026-11-27).
REAL_WORKERS=${RAYBATCH_REAL_PARTS_WORKERS:-0}
REAL_DIST=(); if [ "$REAL_WORKERS" != 0 ]; then REAL_DIST=(-n "$REAL_WORKERS" --dist loadfile); fi
RAYBATCH_TEST_PART=real_parts "${PYTEST[@]}" --junitxml="$ROOT/build/junit-real-parts.xml" "${REAL_DIST[@]}" "$@"; real=$?
# The oldest Airflow and Ray we claim, one side at a time (scripts/test_matrix.sh), after a whole run
# (no pytest arguments) unless RAYBATCH_TEST_MATRIX=0.
matrix=0
if [ "$MATRIX" = 1 ]; then
  # A failed preparation is shown and tried again by the matrix itself (the venvs are stamped when whole).
  wait "$PREPARE_PID" || { echo "test.sh: making the matrix's virtualenvs failed:"; tail -n 20 "$ROOT/build/matrix-prepare.log"; }
  "$ROOT/scripts/test_matrix.sh"; matrix=$?
fi
set -e
echo "scripts/test.sh: unit tests exit $unit, tests on the real parts exit $real (5: none selected)," \
  "version matrix exit $matrix"
if [ "$unit" = 5 ] && [ "$real" = 5 ]; then exit 5; fi
for rc in "$unit" "$real" "$matrix"; do
  if [ "$rc" != 0 ] && [ "$rc" != 5 ]; then exit "$rc"; fi
done
