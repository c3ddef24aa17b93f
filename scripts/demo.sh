#!/usr/bin/env bash
# The embedded default, end to end on one machine:
#   set up both virtualenvs, make a tiny random-weight model, write a day's customers CSV,
#   start a local Ray head (token auth on), and run the daily DAG over that day with
#   `airflow dags test` through the deferrable path. Ends by printing the output location and rows.
#   Then the day before runs too, on the engine the first day left warm (keep_warm_seconds,
#   docs/warm-engines.md): its engine start to first row is seconds, not the first day's build.
# usage: scripts/demo.sh [YYYY-MM-DD]   (default: yesterday)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
DAY=${1:-$(date -u -d yesterday +%F)}
STATE=${RAYBATCH_STATE:-$ROOT/.demo}
export RAYBATCH_STATE=$STATE
START=$(date +%s)

scripts/setup_envs.sh
.venvs/ray/bin/python scripts/make_tiny_model.py "$STATE/tiny-llama"
.venvs/ray/bin/python scripts/make_sample_customers.py "$STATE/data/customers/$DAY/customers.csv" --date "$DAY" --rows 250
scripts/local_ray_cluster.sh start
trap '[ "${KEEP_RAY:-0}" = 1 ] || scripts/local_ray_cluster.sh stop' EXIT

export AIRFLOW_HOME=$STATE/airflow
export AIRFLOW__CORE__DAGS_FOLDER=$ROOT/dags
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__UNIT_TEST_MODE=False
# The Ray connection, token included, lives only in this process's environment (never printed).
# The dashboard's port is local_ray_cluster.sh's: RAYBATCH_DASHBOARD_PORT, 8265 unless set.
AIRFLOW_CONN_RAY_DEFAULT=$(.venvs/airflow/bin/python -c '
import json, sys
print(json.dumps({"conn_type": "ray", "host": "127.0.0.1", "port": int(sys.argv[2]), "password": open(sys.argv[1]).read().strip()}))
' "$STATE/auth_token" "${RAYBATCH_DASHBOARD_PORT:-8265}")
export AIRFLOW_CONN_RAY_DEFAULT
.venvs/airflow/bin/airflow db migrate > "$STATE/airflow_db_migrate.log" 2>&1

CONF=$(cat <<JSON
{"model": "$STATE/tiny-llama", "data_root": "$STATE/data",
 "engine_kwargs": {"max_model_len": 512, "gpu_memory_utilization": 0.3, "enforce_eager": true, "kv_cache_memory_bytes": 1073741824},
 "replica_resources": {"CPU": 1}, "keep_warm_seconds": 120}
JSON
)
DAG_START=$(date +%s)
# The DAG reads the day in its data interval: the run of $DAY + 1 reads $DAY, as the scheduled run at
# midnight reads the day that just ended (dags/daily_company_industry.py).
.venvs/airflow/bin/airflow dags test daily_company_industry "$(date -u -d "$DAY + 1 day" +%F)" --conf "$CONF" 2>&1 | tee "$STATE/dags_test.log" \
  | grep -E "Submitted Ray job|Pausing task as DEFERRED|done: [0-9]+ rows in|classified|\] industry |DagRun Finished|ERROR" || true
DAG_END=$(date +%s)
grep -q "DagRun Finished.*state=success" "$STATE/dags_test.log" || { echo "DAG run failed; see $STATE/dags_test.log" >&2; exit 1; }

OUT=$STATE/data/company_industry/$DAY
.venvs/ray/bin/python - "$OUT" "$((DAG_END - DAG_START))" <<'PY'
import json, sys
import pyarrow.parquet as pq
out, dag_seconds = sys.argv[1], int(sys.argv[2])
manifest = json.load(open(f"{out}/manifest.json"))
table = pq.read_table(manifest["outputs_uri"])
job_s = manifest["timings"]["job_wall_s"]
print(f"\nOutput: {manifest['outputs_uri']} ({table.num_rows} rows)\nErrors: {manifest['errors_uri']}\n"
      f"Manifest: {out}/manifest.json")
print(f"rows in {manifest['rows_in']}, out {manifest['rows_out']}, failed {manifest['rows_failed']}; "
      f"Ray job {job_s:.1f} s, submitted to committed ({manifest['rows_in'] / job_s:.1f} rows/s); "
      f"DAG run {dag_seconds} s")
for row in table.slice(0, 5).to_pylist():
    print("  ", row)
PY
# The day before, on the engine the first day left warm.
PREV=$(date -u -d "$DAY - 1 day" +%F)
.venvs/ray/bin/python scripts/make_sample_customers.py "$STATE/data/customers/$PREV/customers.csv" --date "$PREV" --rows 250
.venvs/airflow/bin/airflow dags test daily_company_industry "$DAY" --conf "$CONF" > "$STATE/dags_test_prev.log" 2>&1
grep -q "DagRun Finished.*state=success" "$STATE/dags_test_prev.log" || { echo "DAG run of $PREV failed; see $STATE/dags_test_prev.log" >&2; exit 1; }
.venvs/ray/bin/python - "$STATE/data/company_industry" "$DAY" "$PREV" <<'PY'
import json, sys
root, days = sys.argv[1], sys.argv[2:]
print("\nTwo dates on one warm engine pool (keep_warm_seconds=120):")
for day in days:
    manifest = json.load(open(f"{root}/{day}/manifest.json"))
    pool, timings = manifest["engine_pool"], manifest["timings"]
    print(f"  {day}: {manifest['rows_out']} rows, replicas warm {pool['warm_replicas']}/{pool['replicas']}, "
          f"engine start to first row {timings['engine_start_to_first_row_s']:.1f} s, Ray job {timings['job_wall_s']:.1f} s")
PY
echo "demo finished in $(( $(date +%s) - START )) s"
