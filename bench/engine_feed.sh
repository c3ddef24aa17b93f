#!/usr/bin/env bash
# The engine-stage replica's own CPU per row (issue 19): the one process that feeds the engine.
# Runs our job on the CPU engine (bench/compare.py, ours only: 30,000 rows of 16 prompt tokens, 16 out,
# a 2-layer model), samples the replica's CPU time over 30 s of generating, and records a py-spy profile.
#   bash bench/engine_feed.sh TAG        -> bench/results/engine_feed-TAG.{json,raw}, a line on stdout
# On the CPU engine the engine is the bottleneck, so the replica is part idle: CPU ms per row is
# what carries over to a GPU, where that process is the bottleneck (bench/RESULTS.md section 7).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TAG=${1:?usage: engine_feed.sh TAG}
OUT=$ROOT/bench/results
mkdir -p "$OUT"
PYSPY=$ROOT/.venvs/ray/bin/py-spy
export AIRFLOW__RAYBATCH__JOB_IDENTITY_SECRET=${AIRFLOW__RAYBATCH__JOB_IDENTITY_SECRET:-bench-engine-feed-0123456789abcdef}
bash "$ROOT/bench/run_cpu.sh" compare --skip-raw --n 30000 --prompt-tokens 16 --max-tokens 16 \
  --batch-size 256 --hidden 128 --layers 2 --out "$OUT/engine_feed-$TAG-compare.json" > "$OUT/engine_feed-$TAG.log" 2>&1 &
job=$!
pid=
for _ in $(seq 900); do  # the replica, once its constructor has returned
  pid=$(ps -eo pid,args | grep "MapBatches(RaybatchvLLMEngineStageUDF)" | grep -v -e grep -e __init__ | awk '{print $1}' | head -1 || true)
  [ -n "$pid" ] && break
  sleep 1
done
[ -n "$pid" ] || { echo "no engine replica appeared" >&2; wait "$job"; exit 1; }
sleep 15  # into generating
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
t0=$(date +%s.%N); c0=$(ticks "$pid")
"$PYSPY" record -p "$pid" -d 30 -r 40 --nonblocking -f raw -o "$OUT/engine_feed-$TAG.raw" > /dev/null 2>&1
t1=$(date +%s.%N); c1=$(ticks "$pid")
wait "$job"
python3 - "$OUT" "$TAG" "$t0" "$t1" "$c0" "$c1" "$(getconf CLK_TCK)" <<'PY'
import json, sys
out, tag, t0, t1, c0, c1, hz = sys.argv[1:]
run = json.load(open(f"{out}/engine_feed-{tag}-compare.json"))["b_ours_ray_job"]
rows_per_s = run["rows"] / run["generating_s"]
cpu_share = (float(c1) - float(c0)) / float(hz) / (float(t1) - float(t0))
result = {"tag": tag, "rows": run["rows"], "generating_s": round(run["generating_s"], 1),
          "rows_per_s": round(rows_per_s, 1), "replica_cpu_share": round(cpu_share, 3),
          "replica_cpu_ms_per_row": round(1000 * cpu_share / rows_per_s, 3),
          "rows_per_s_if_replica_bound": round(rows_per_s / cpu_share, 0)}
json.dump(result, open(f"{out}/engine_feed-{tag}.json", "w"), indent=1)
print("| tag | rows/s (CPU engine) | replica CPU share | replica CPU ms/row | rows/s one replica could feed |")
print(f"| {tag} | {result['rows_per_s']} | {result['replica_cpu_share']} | {result['replica_cpu_ms_per_row']} | {result['rows_per_s_if_replica_bound']:.0f} |")
PY
