#!/usr/bin/env bash
# Start or stop the embedded default: a one-machine Ray head from .venvs/ray, token auth on.
#   scripts/local_ray_cluster.sh start   # prints the dashboard address; token in $RAYBATCH_STATE/auth_token
#   scripts/local_ray_cluster.sh add-worker   # one more node on this machine (RAYBATCH_WORKER_CPUS,
#                                             # RAYBATCH_WORKER_RESOURCES as JSON), joining the head
#   scripts/local_ray_cluster.sh remove-workers   # stop the nodes add-worker started
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
# The dashboard agent's HTTP port (Ray's default 52365 for the default dashboard port 8265): one per
# raylet on the machine, or a second cluster's jobs get "No available agent to submit job".
AGENT_PORT=${RAYBATCH_AGENT_PORT:-$((PORT + 44100))}
# Ray's files (sessions, logs, sockets, and ray_current_cluster) in a folder of this cluster's own:
# the job supervisor finds its cluster through <temp dir>/ray_current_cluster, which in the shared
# /tmp/ray names whichever cluster on the machine started last, so another cluster's start sent this
# one's jobs to the wrong GCS (2026-11-26). Short: Ray's socket paths must stay under 107 characters.
RAY_TEMP_DIR=${RAYBATCH_RAY_TEMP_DIR:-/tmp/ray-$GCS_PORT}
# The cluster side's virtualenv: .venvs/ray, or another Ray release's (scripts/test_matrix.sh).
RAY_VENV=${RAYBATCH_RAY_VENV:-$ROOT/.venvs/ray}
export PATH=$RAY_VENV/bin:$PATH  # job entrypoints run `python` from the cluster's PATH
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$STATE/auth_token RAY_USAGE_STATS_ENABLED=0
# vLLM's CPU build (this cluster's engine) turns Ray Data LLM's one-process "uni" executor into "mp"
# unless VLLM_ENABLE_V1_MULTIPROCESSING=0 (vllm/platforms/cpu.py): one more process importing torch and
# vLLM. The tiny model's engine built in 35 s against 17 s on 2 cores, and generated slower (2026-11-28).
# The engine core is a process of its own either way (AsyncLLM); a GPU engine of one GPU is "uni" anyway.
export VLLM_ENABLE_V1_MULTIPROCESSING=${VLLM_ENABLE_V1_MULTIPROCESSING:-0}
# Ray's log monitor (one per node) globs the logs folder for new worker files on every pass, ten a
# second when idle, until the folder holds RAY_LOG_MONITOR_MANY_FILES_THRESHOLD files (1,000); only
# then every LOG_NAME_UPDATE_INTERVAL_S (0.5 s). With a few hundred files, after an hour of jobs, the
# two log monitors of the tests' two-node cluster took 10-15% of a core (2026-11-28). Every 0.5 s from
# the start: a new worker's output reaches its job's log at most half a second later.
export RAY_LOG_MONITOR_MANY_FILES_THRESHOLD=${RAY_LOG_MONITOR_MANY_FILES_THRESHOLD:-0}

# Any HTTP answer (401 included: token auth guards every route) means the dashboard is up.
dashboard_up() { [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/api/version")" != 000 ]; }

# How many nodes the head's state API lists alive (its JSON: data.result.result[].state); -1 while the
# dashboard does not answer.
alive_nodes() {
  curl -s -H "Authorization: Bearer $(cat "$STATE/auth_token")" "http://127.0.0.1:$PORT/api/v0/nodes?limit=10000" \
    | python -c 'import json, sys
try:
    rows = json.load(sys.stdin)["data"]["result"]["result"]
except (ValueError, KeyError, TypeError):
    print(-1)
else:
    print(sum(row.get("state") == "ALIVE" for row in rows))'
}

# The pids whose environment names this cluster's token file, and their descendants (a raylet's
# ray::DashboardAgent and ray::RuntimeEnvAgent rename themselves, which blanks their environment as
# /proc shows it: a head's agents outlived `stop` on a two-raylet cluster), less this script and its
# callers.
# With an argument (a VAR=value line), only the processes whose environment also has it, and theirs.
own_processes() {
  local dir pid ppid environ self=" $$ $(ancestors) " own=" " found=1 marker=${1:-}
  declare -A parent=()
  for dir in /proc/[0-9]*; do
    pid=${dir#/proc/}
    ppid=$(awk '{print $4}' "$dir/stat" 2> /dev/null) || continue
    parent[$pid]=$ppid
    case "$self" in *" $pid "*) continue ;; esac
    environ=$({ tr '\0' '\n' < "$dir/environ"; } 2> /dev/null) || continue
    grep -qxF "RAY_AUTH_TOKEN_PATH=$STATE/auth_token" <<< "$environ" || continue
    [ -z "$marker" ] || grep -qxF "$marker" <<< "$environ" && own+="$pid "
  done
  while [ "$found" = 1 ]; do  # add children of own processes until none is new
    found=0
    for pid in "${!parent[@]}"; do
      case "$own" in *" $pid "*) continue ;; esac
      case "$self" in *" $pid "*) continue ;; esac
      case "$own" in *" ${parent[$pid]} "*) own+="$pid "; found=1 ;; esac
    done
  done
  echo $own
  return 0
}
# Those of the given pids still running (a zombie has ended: only its parent's wait is left).
running() {
  local pid
  for pid in "$@"; do
    [ "$(awk '{print $3}' "/proc/$pid/stat" 2> /dev/null || echo Z)" != Z ] && echo "$pid"
  done
  return 0
}
# Wait until none of the given pids (one word) runs, polling $2 times every $3 s.
wait_ended() {
  for _ in $(seq "$2"); do
    [ -z "$(running $1)" ] && return 0
    sleep "$3"
  done
  return 0
}
# SIGTERM the given pids (one word), then SIGKILL those still running after 10 s, and wait for them:
# a killed process holds its ports until the kernel has ended it, and the caller may bind them next.
stop_processes() {
  local pids=$1 left
  [ -n "$pids" ] || return 0
  kill -TERM $pids 2> /dev/null
  wait_ended "$pids" 20 0.5
  left=$(running $pids)
  [ -n "$left" ] || return 0
  kill -KILL $left 2> /dev/null
  wait_ended "$left" 20 0.25
}
ancestors() {
  local pid=$PPID
  while [ "$pid" -gt 1 ] 2> /dev/null; do
    echo -n "$pid "
    pid=$(awk '{print $4}' "/proc/$pid/stat" 2> /dev/null || echo 0)
  done
}

case "${1:-}" in
  start)
    # Ray's own error for this comes from deep in `ray start`, after the head half started.
    if [ "$CLIENT_PORT" -ge 10002 ] && [ "$CLIENT_PORT" -le 19999 ]; then
      echo "RAYBATCH_CLIENT_PORT=$CLIENT_PORT is inside Ray's worker port range (10002-19999): pick one outside it (e.g. 23001)" >&2
      exit 2
    fi
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
      --dashboard-agent-listen-port="$AGENT_PORT" --temp-dir="$RAY_TEMP_DIR" \
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
    before=$(alive_nodes)
    # Marked, so that remove-workers finds this node's processes (raylet, log monitor, agents, workers).
    RAYBATCH_WORKER_NODE=1 ray start --address="127.0.0.1:$GCS_PORT" --num-cpus="${RAYBATCH_WORKER_CPUS:-4}" \
      --resources="${RAYBATCH_WORKER_RESOURCES:-{\}}" --dashboard-agent-listen-port=$((AGENT_PORT + 1)) \
      --temp-dir="$RAY_TEMP_DIR" \
      --disable-usage-stats >> "$STATE/ray_worker.log" 2>&1 \
      || { cat "$STATE/ray_worker.log"; exit 1; }
    # `ray start` returns before the head lists the node (~5 s on 2 cores; a job submitted at once saw
    # one node): wait until it does, up to a minute.
    for _ in $(seq 120); do
      [ "$(alive_nodes)" -gt "$before" ] && break
      sleep 0.5
    done
    [ "$(alive_nodes)" -gt "$before" ] || { echo "the new node did not show in the head's node list within 60 s" >&2; exit 1; }
    echo "Ray worker node joined 127.0.0.1:$GCS_PORT ($(alive_nodes) nodes alive)"
    ;;
  remove-workers)
    # The nodes add-worker started, and what runs on them; the head goes on (Ray marks them dead).
    stop_processes "$(own_processes RAYBATCH_WORKER_NODE=1)"
    echo "Ray worker nodes removed"
    ;;
  stop)
    # This cluster's processes only, not `ray stop --force`, which ends every Ray on the machine (a
    # benchmark's, another checkout's tests'): `ray start` above exported RAY_AUTH_TOKEN_PATH, so the
    # GCS, raylets, dashboard, workers and job drivers of this cluster, and no other, carry it.
    # The pids are taken once, before any signal: a raylet's agents become init's children as it
    # exits, and would no longer be found as its descendants.
    stop_processes "$(own_processes)"
    echo "Ray stopped"
    ;;
  *)
    echo "usage: $0 start|add-worker|remove-workers|stop" >&2
    exit 2
    ;;
esac
