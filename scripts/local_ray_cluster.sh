#!/usr/bin/env bash
# Start or stop the embedded default: a one-machine Ray head from .venvs/ray, token auth on.
#   scripts/local_ray_cluster.sh start   # prints the dashboard address; token in $RAYBATCH_STATE/auth_token
#   scripts/local_ray_cluster.sh add-worker   # one more node on this machine (RAYBATCH_WORKER_CPUS,
#                                             # RAYBATCH_WORKER_RESOURCES as JSON), joining the head
#   scripts/local_ray_cluster.sh stop
# Token auth is on, as on a real Ray 2.60 cluster, with a token of our own kept under $RAYBATCH_STATE
# rather than ~/.ray. 8 logical CPUs: each Ray Data LLM stage's actor pool holds one, so a 2-core
# machine declaring 2 would wait forever (PLATFORM-NOTES.md).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
STATE=${RAYBATCH_STATE:-$ROOT/.demo}
PORT=${RAYBATCH_DASHBOARD_PORT:-8265}
GCS_PORT=${RAYBATCH_GCS_PORT:-6379}
NUM_CPUS=${RAYBATCH_NUM_CPUS:-8}
CLIENT_PORT=${RAYBATCH_CLIENT_PORT:-10001}
HEAD_RESOURCES=${RAYBATCH_HEAD_RESOURCES:-{\}}
export PATH=$ROOT/.venvs/ray/bin:$PATH  # job entrypoints run `python` from the cluster's PATH
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$STATE/auth_token RAY_USAGE_STATS_ENABLED=0

# Any HTTP answer (401 included: token auth guards every route) means the dashboard is up.
dashboard_up() { [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/api/version")" != 000 ]; }

case "${1:-}" in
  start)
    mkdir -p "$STATE"
    [ -s "$STATE/auth_token" ] || python -c "import secrets; print(secrets.token_hex(32), end='')" > "$STATE/auth_token"
    chmod 600 "$STATE/auth_token"
    if dashboard_up; then
      echo "Ray head already up at http://127.0.0.1:$PORT"
      exit 0
    fi
    # From the state folder, not the checkout: a job's `python -m` driver starts in the head's working
    # folder, and a checkout there would shadow the package the job ships (a module left out of the
    # package then went unnoticed in every test).
    cd "$STATE"
    ray start --head --port="$GCS_PORT" --num-cpus="$NUM_CPUS" --dashboard-host=127.0.0.1 \
      --dashboard-port="$PORT" --ray-client-server-port="$CLIENT_PORT" --resources="$HEAD_RESOURCES" \
      --disable-usage-stats > "$STATE/ray_start.log" 2>&1 \
      || { cat "$STATE/ray_start.log"; exit 1; }
    for _ in $(seq 60); do
      dashboard_up && break
      sleep 1
    done
    echo "Ray head up at http://127.0.0.1:$PORT (token in $STATE/auth_token)"
    ;;
  add-worker)
    # A second raylet on the same machine, with resources of its own: a real two-node cluster
    # (own object store, own worker processes) without a second machine.
    cd "$STATE"
    ray start --address="127.0.0.1:$GCS_PORT" --num-cpus="${RAYBATCH_WORKER_CPUS:-4}" \
      --resources="${RAYBATCH_WORKER_RESOURCES:-{\}}" --disable-usage-stats >> "$STATE/ray_worker.log" 2>&1 \
      || { cat "$STATE/ray_worker.log"; exit 1; }
    echo "Ray worker node joined 127.0.0.1:$GCS_PORT"
    ;;
  stop)
    ray stop --force > /dev/null 2>&1 || true
    echo "Ray stopped"
    ;;
  *)
    echo "usage: $0 start|stop" >&2
    exit 2
    ;;
esac
