#!/usr/bin/env bash
# Set up both virtualenvs (idempotent) and run every test: unit tests, then the integration tests on
# a local Ray head with vLLM's CPU engine and real Airflow. Extra arguments go to pytest.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
scripts/setup_envs.sh
# Headless Chromium for the Airflow UI test (Debian's package; the machines run as root).
if ! command -v chromium > /dev/null; then
  (apt-get install -y -q chromium || { apt-get update -q && apt-get install -y -q chromium; }) > /dev/null
fi
exec .venvs/airflow/bin/python -m pytest tests -p no:cacheprovider -ra --durations=10 "$@"
