#!/usr/bin/env bash
# Set up both virtualenvs (idempotent), run the code checks (scripts/lint.sh: ruff check, ruff format,
# mypy; under a minute on a fresh clone, seconds after; any finding stops here), then every test: unit
# tests, then the integration tests on a local Ray head with vLLM's CPU engine and real Airflow.
# Extra arguments go to pytest. SKIP_LINT=1 skips the checks, for a quick local run of a few tests;
# CI never sets it.
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
exec .venvs/airflow/bin/python -m pytest tests -p no:cacheprovider -ra --durations=10 "$@"
