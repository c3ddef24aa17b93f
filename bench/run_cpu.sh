#!/usr/bin/env bash
# The CPU benchmarks (bench/RESULTS.md). Each holds the machine's Ray lock for the cluster's whole
# life: `ray stop --force` (the cluster script's stop) kills every Ray process on the machine.
#   bench/run_cpu.sh compare [args]     raw vLLM vs our Ray job on the same batch (bench/compare.py)
#   bench/run_cpu.sh airflow [args]     the example DAG via `airflow dags test`: task vs job times
#   bench/run_cpu.sh triggerer [args]   500 RayJobTriggers in one event loop (bench/triggerer.py)
#   bench/run_cpu.sh footprint [args]   Airflow-side import set and peak RSS (bench/footprint.py; no Ray)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PY=$ROOT/.venvs/airflow/bin/python
# Measure this checkout's provider, not whichever checkout the venv has installed (editable).
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
LOCK=/tmp/raybatch-ray.lock
what=${1:-compare}
shift || true
case "$what" in
  compare)   exec flock "$LOCK" env RAYBATCH_BENCH_LOCKED=1 "$PY" bench/compare.py "$@" ;;
  airflow)   exec flock "$LOCK" env RAYBATCH_BENCH_LOCKED=1 "$PY" bench/compare.py --skip-raw --skip-ours --airflow --out bench/results/cpu_airflow.json "$@" ;;
  triggerer) exec flock "$LOCK" env RAYBATCH_BENCH_LOCKED=1 "$PY" bench/triggerer.py "$@" ;;
  footprint) exec "$PY" bench/footprint.py "$@" ;;
  *) echo "usage: $0 compare|airflow|triggerer|footprint [args]" >&2; exit 2 ;;
esac
