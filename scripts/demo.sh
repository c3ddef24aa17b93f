#!/usr/bin/env bash
# The embedded default, end to end on one machine:
#   set up both virtualenvs, make a tiny random-weight model, write a day's customers CSV,
#   start a local Ray head (token auth on), and run the daily DAG over that day with
#   `airflow dags test` through the deferrable path. Ends by printing the output location and rows.
#   Then the day before runs too, on the engine the first day left warm (keep_warm_seconds,
#   docs/warm-engines.md): its engine start to first row is seconds, not the first day's build.
# usage: scripts/demo.sh [YYYY-MM-DD]   (default: yesterday)
# Settings, all optional:
#   KEEP_RAY=1       leave the Ray head running afterwards (dashboard on 127.0.0.1:8265); a head that
#                    was up before the demo started is left running anyway
#   RAYBATCH_STATE   the demo's folder (.demo): its data, Airflow home, logs, and the Ray head's token;
#                    with RAYBATCH_DASHBOARD_PORT, RAYBATCH_GCS_PORT and RAYBATCH_CLIENT_PORT, the
#                    head's (scripts/local_ray_cluster.sh): a head up on those ports with that token is used
#   RAYBATCH_DEMO_MODEL   a model folder to run instead of making the tiny random-weight Llama
#   RAYBATCH_DEMO_KEEP_WARM_SECONDS   how long each date leaves its engines warm (120)
#   SKIP_SETUP=1     the virtualenvs are made already: skip scripts/setup_envs.sh
# tests/integration/test_demo_script.py runs the demo with these on the tests' Ray head and warm engines.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
DAY=${1:-$(date -u -d yesterday +%F)}
STATE=${RAYBATCH_STATE:-$ROOT/.demo}
export RAYBATCH_STATE=$STATE
MODEL=${RAYBATCH_DEMO_MODEL:-$STATE/tiny-llama}
KEEP_WARM_SECONDS=${RAYBATCH_DEMO_KEEP_WARM_SECONDS:-120}
START=$(date +%s)

[ "${SKIP_SETUP:-0}" = 1 ] || scripts/setup_envs.sh
[ -n "${RAYBATCH_DEMO_MODEL:-}" ] || .venvs/ray/bin/python scripts/make_tiny_model.py "$MODEL"
.venvs/ray/bin/python scripts/make_sample_customers.py "$STATE/data/customers/$DAY/customers.csv" --date "$DAY" --rows 250
# A head already up (on these ports) is used and left running: only one this demo starts is stopped.
HEAD_WAS_UP=0
[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${RAYBATCH_DASHBOARD_PORT:-8265}/api/version")" = 000 ] || HEAD_WAS_UP=1
scripts/local_ray_cluster.sh start
trap '[ "${KEEP_RAY:-0}" = 1 ] || [ "$HEAD_WAS_UP" = 1 ] || scripts/local_ray_cluster.sh stop' EXIT

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

# vLLM's CPU build on a small machine; the tests' engine settings (tests/conftest.py CPU_ENGINE_KWARGS),
# so that the demo's test runs on the tests' warm engines instead of building its own.
CONF=$(cat <<JSON
{"model": "$MODEL", "data_root": "$STATE/data",
 "engine_kwargs": {"max_model_len": 512, "gpu_memory_utilization": 0.3, "enforce_eager": true, "kv_cache_memory_bytes": 1073741824,
                   "structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": true}},
 "replica_resources": {"CPU": 1}, "keep_warm_seconds": $KEEP_WARM_SECONDS}
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
.venvs/ray/bin/python - "$STATE/data/company_industry" "$KEEP_WARM_SECONDS" "$DAY" "$PREV" <<'PY'
import json, sys
root, keep_warm, days = sys.argv[1], sys.argv[2], sys.argv[3:]
print(f"\nTwo dates on one warm engine pool (keep_warm_seconds={keep_warm}):")
for day in days:
    manifest = json.load(open(f"{root}/{day}/manifest.json"))
    pool, timings = manifest["engine_pool"], manifest["timings"]
    print(f"  {day}: {manifest['rows_out']} rows, replicas warm {pool['warm_replicas']}/{pool['replicas']}, "
          f"engine start to first row {timings['engine_start_to_first_row_s']:.1f} s, Ray job {timings['job_wall_s']:.1f} s")
PY
echo "demo finished in $(( $(date +%s) - START )) s"
