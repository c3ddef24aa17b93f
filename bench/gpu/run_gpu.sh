#!/bin/bash
# Runs on the device machine (bench/RESULTS.md, "GPU"). The shared recipe's run_all.sh, with our stages:
#   bash bench/gpu/run_gpu.sh "install cold a:2000 cold b:ours-2000"; then "cold a:20000 b:ours-2000-warm";
#   then "cold b:ours-20000 stop"   (calls in a row, each within the 30 s the machine stays warm)
#   install     reassemble + check + install the carried wheels (/tmp/wh: the recipe's parts, or the one
#               tar of bench/gpu/pack_scale.sh in pieces wheels.tar.*; incl. the Jobs API extras), smoke
#               test, write the models (the Llama-3.1-8B shape with the word tokenizer, and for the scale
#               jobs the small and the 8B shape with the BPE tokenizer: bench/gpu/make_model.py) and the
#               random-words prompt files
#   data        the scale jobs' input: the seeds' customers CSV shape, 2,000,000 and 200,000 rows, each in
#               ONE file (scripts/make_sample_customers.write_customer_files: 1% repeated ids, 0.5% none)
#   data:N      only the N-row customers CSV (one file), e.g. data:100000 for the rpg-100k-* jobs
#   rpg         issue 48's replicas-per-GPU table (bench/gpu/rpg_summary.py): a:rpg-*-x1 vs b:rpg-*-x1..x4
#               (and a:rt-2000-x1 vs b:rt-2000-x1, x2), with vLLM's stats lines and the GPU's use beside
#               each (every a: and b: stage samples the GPU with bench/gpu/gpumon.py into gpu-a/b-NAME.json;
#               a b: stage keeps the replicas' stats lines from the worker logs: logs/vllmstats-b-NAME.txt)
#   data20m     the dry-20m job's input: 20,000,000 rows in 20 files of 1,000,000 (issue 19 item 2)
#   images      the images-100k job's input (bench/gpu/make_images.py) and the tiny VLM (issue 19 item 6)
#   vlmsmoke    scripts/try_tiny_vlm.py on the GPU, eager and compiled (the tiny VLM without Ray)
#   vlmsmoke1   the same, compiled, on vLLM's previous GPU model runner (VLLM_USE_V2_MODEL_RUNNER=0)
#   vlmsmoke2   the same, eager, without the start-up's dummy-image profiling (skip_mm_profiling)
#   enginetb    the first EngineCore traceback in the Ray session's worker logs, whole, into logs/
#   a:NAME      (a) raw vLLM (bench/raw_vllm.py) on the spec of bench/gpu/jobs/NAME.json (a:N: ours-N.json)
#   b:NAME      (b) our pipeline: the job bench/gpu/jobs/NAME.json through the Ray Jobs API (ours_job.py);
#               starts the Ray head first if it is not up
#   resume:NAME issue 19 item 5: NAME's job stopped half way, rerun as try 2 (bench/gpu/scale_resume.py)
#   a:NAME@TAG  the same, its results as a-NAME@TAG.json (e.g. a:2000@d1 ... a:2000@d7: 7 cold raw scripts)
#   backfill    the 7-date backfill's table (bench/gpu/backfill_summary.py): a:2000@d1..d7 vs b:backfill-d1..d7
#   raylogs:TAG the Ray session's worker and actor start times since the last raylogs stage, into
#               logs/raylogs-TAG/ (where a warm job's seconds before its first row go)
#   af:N        issue 20's 7-date backfill through Airflow (airflow standalone, `airflow backfill create
#               --max-active-runs N`; bench/gpu/airflow_backfill.py; needs pack_airflow.sh's Airflow side)
#   pool2x      issue 23's table (bench/gpu/pool_scale_summary.py): b:pool1-cold, pool1-warm vs pool2-*
#   floor:NAME  what a Ray job per task pays before its driver works: probe jobs with NAME's runtime env
#               (bench/gpu/job_floor.py; issue 48's warm start)
#   check:NAME  every input row exactly once in NAME's committed outputs + errors (bench/gpu/scale_check.py)
#   bg          the stages after it run in a detached runner (setsid; it outlives this call while the
#               machine stays warm), and this call waits for it like "wait"
#   wait        wait for the detached runner until it ends or this call's time is nearly up (LIMIT);
#               make the next call "wait" again at once (the machine goes back 30 s after a call)
#   sleep:N     sleep N s (to try "bg" and "wait" without a GPU: KEEP=/tmp/k OUT=/tmp/o LIMIT=40 ...)
#   cold        delete the compile caches (vLLM's torch.compile cache, inductor, Triton): the next run starts cold
#   stop        ray stop
#   diag        list the Triton / compile cache folders and their sizes
#   spy         the next b: stage samples the EngineCore processes with py-spy dump every ~1 s
#               (spy-NAME.txt): where the engine's start-up time goes
#   vlogms      vLLM's log lines with milliseconds, and the model registry's debug lines (how long
#               it inspected the model's class), in every process started after it (before "ray
#               start": the replicas inherit it); raw vLLM too
#   mon         the next a: or b: stage samples every process's CPU time every 0.25 s and py-spy dumps
#               the replica, its forkserver, the EngineCore and vLLM's registry subprocess every ~1 s
#               (bench/gpu/startmon.py: mon-a/b-NAME-procs.json, -spy.txt); a b: stage also keeps the
#               engine actor's whole worker log (logs/wlog-b-NAME.txt): where a cold start waits
#   tree:DIR    the b: stages after it run DIR's ours_job.py and jobs (DIR relative to this tree, e.g.
#               ../wtfix: a copy with a fix), so one runner measures two versions of the code
#   purge       ray stop, and every cache a node's first engine fills deleted (vLLM's whole cache root:
#               compiled graphs and the model-class answers in modelinfos/; Triton's; Inductor's): the
#               next job starts as on a fresh machine, but for the OS's file cache
# Results: /tmp/keep/*.json and /tmp/keep/logs/ (kept between calls); at the end of every call all of it
# in $OUT/results.tgz (the device tool returns at most 8 files).
set -u
T0=$(date +%s); LIMIT=${LIMIT:-585}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
       RAY_USAGE_STATS_ENABLED=0 TOKENIZERS_PARALLELISM=false PYTHONPATH=/tmp/site \
       VLLM_USE_FLASHINFER_SAMPLER=0 RAY_AUTH_MODE=disabled
# vLLM's stats lines (only where a job turns them on: disable_log_stats=False) every 5 s, not 10: the
# rpg jobs generate for 30-130 s. Exported before "ray start", so the replicas inherit it too.
export VLLM_LOG_STATS_INTERVAL=${VLLM_LOG_STATS_INTERVAL:-5}
export PATH=/tmp/site/bin:$PATH  # ray; the job entrypoint `python` is the image venv's
K=${KEEP:-/tmp/keep}; L=$K/logs; mkdir -p $K $L /tmp/bin; SPY=0; MON=0
# What "mon" dumps with py-spy: the replica actor, its forkserver, the EngineCore, vLLM's registry
# subprocess, raw vLLM's process.
MONSPY=${MONSPY:-"vLLMEngineStage|EngineCore|models\\.registry|vllm\\.v1\\.engine\\.core|raw_vllm"}
RUNNER=${RUNNER:-0}  # 1: the detached runner of "bg" (never packs results: the calls do)
FINAL=${OUT:-/tmp/out}; [ "$RUNNER" = 1 ] && FINAL=/tmp/bgout; mkdir -p "$FINAL"
rm -f /tmp/bin/python  # the image has python in its venv; a symlink elsewhere would lose the venv
# The runner runs a private copy of this script (bash reads a script as it goes: a copy of the tree
# written over it by a later call must not move it). Functions keep their loop variables local: the
# stage loop's index is i, and a global i set by waitgpu sent the runner back to stage 1 (2026-11-26).
HERE=${RUNNER_HERE:-$(cd "$(dirname "$0")" && pwd)}; REPO=$(cd "$HERE/../.." && pwd); cd "$REPO"
MODEL=/tmp/llama8b_dummy
echo "start $(date +%T) stages='${1:-}' LIMIT=$LIMIT runner=$RUNNER"
waitgpu() { local u i; for i in $(seq 90); do u=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1); [ "${u:-0}" -lt 3000 ] && return 0; sleep 1; done; echo "GPU still has ${u} MiB used"; }
rayup() { python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8265/api/version', timeout=3)" 2>/dev/null; }
startray() {
  local i  # the stage loop's index is i: a global i here sent the runner back to its first stage
  rayup && return 0
  # From /: should the job's `python -m` driver inherit the head's cwd (via the job supervisor), it
  # would put it first on sys.path, and a checkout there would shadow the package the job uploaded.
  # TOKENIZERS_PARALLELISM: unset for the head (HEAD_TOKENIZERS_PARALLELISM=false keeps this script's
  # "false"), as on a production cluster: Ray Data LLM's one tokenize actor then encodes a batch on
  # all cores (raw vLLM's prepare workers are processes, each single-threaded).
  local tp=(-u TOKENIZERS_PARALLELISM); [ -n "${HEAD_TOKENIZERS_PARALLELISM:-}" ] && tp=(TOKENIZERS_PARALLELISM=$HEAD_TOKENIZERS_PARALLELISM)
  (cd / && env "${tp[@]}" ray start --head --dashboard-host=127.0.0.1 --dashboard-port=8265 --disable-usage-stats) > $K/ray_start.log 2>&1 || tail -20 $K/ray_start.log
  for i in $(seq 60); do rayup && break; sleep 1; done
  rayup && echo "Ray head up ($(( $(date +%s) - T0 ))s elapsed)" || { echo "Ray dashboard not up: falling back to a direct driver"; tail -15 /tmp/ray/session_latest/logs/dashboard.log; }
}
stagelimit() { local l=$(( $(left) - 5 )); [ $l -gt ${STAGE_LIMIT:-3600} ] && l=${STAGE_LIMIT:-3600}; echo $l; }
waitbg() {  # until the runner wrote bg.rc, or this call is nearly out of time
  local last=0 pid
  while [ ! -e $K/bg.rc ]; do
    # No bg.pid: a fresh machine (the one that ran "bg" went back), not a runner ("kill -0 0" would pass).
    pid=$(cat $K/bg.pid 2>/dev/null || echo none)
    [ "$pid" != none ] && kill -0 "$pid" 2>/dev/null || { sleep 2; [ -e $K/bg.rc ] && break; echo "RUNNER GONE without a result (pid $pid)"; tail -30 $L/bg.log; return 1; }
    if [ "$(left)" -lt 25 ]; then
      echo "RUNNER STILL RUNNING at $(date +%T): make the next call 'bash bench/gpu/run_gpu.sh wait' now"
      tail -4 $L/bg.log | cut -c1-300; return 0
    fi
    if [ $(( $(date +%s) - last )) -ge 60 ]; then
      last=$(date +%s); newest=$(ls -t $L/*.out $L/*.log 2>/dev/null | grep -v bg.log | head -1)
      echo "... $(date +%T) $(tail -1 $L/bg.log | cut -c1-160) | $(basename "${newest:-none}"): $(tail -1 "${newest:-/dev/null}" 2>/dev/null | cut -c1-200)"
    fi
    sleep 5
  done
  echo "RUNNER DONE rc=$(cat $K/bg.rc) at $(date +%T)"; tail -110 $L/bg.log | cut -c1-600
}
write_customers() {  # ROWS ROWS_PER_FILE: /tmp/gpu_data/customers-ROWS (make_submissions.customers_csv), once
  python3 - "$1" "$2" <<'PY'
import json, sys, time
from pathlib import Path
sys.path.insert(0, "scripts")
from make_sample_customers import write_customer_files
rows, per_file = int(sys.argv[1]), int(sys.argv[2])
folder = Path(f"/tmp/gpu_data/customers-{rows}")
marker = folder / "params.json"
if not marker.exists():
    t = time.time()
    duplicates, no_id = write_customer_files(folder, rows, per_file)
    marker.write_text(json.dumps({"rows": rows, "duplicates": duplicates, "no_id": no_id}))
    size = sum(path.stat().st_size for path in folder.glob("*.csv"))
    print(f"{folder}: {rows} rows ({duplicates} repeated ids, {no_id} without one), {size / 2**20:.0f} MiB, {time.time() - t:.1f} s")
PY
}
[ "$RUNNER" = 1 ] && trap 'echo $? > $K/bg.rc' EXIT  # "wait" stops when this exists
read -ra ST <<< "${1:-install}"
i=0
while [ $i -lt ${#ST[@]} ]; do
  s=${ST[$i]}; i=$(( i + 1 ))
  # By name each time: a later call's copy of the tree replaces this folder under a runner, whose
  # working directory would still be the old, deleted one (relative paths then fail: 2026-11-26).
  cd "$REPO" || exit 1
  case $s in
  install)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $K/gpu.txt
    cd /tmp/wh || exit 1
    if ls wheels.tar.* > /dev/null 2>&1; then cat $(ls wheels.tar.* | sort) | tar x && rm -f wheels.tar.* || exit 1; fi
    for f in *.part-aa; do [ -e "$f" ] || continue; b=${f%.part-aa}; cat "$b".part-* > "$b" && rm "$b".part-*; done
    sha256sum -c "$HERE/vllm.sha256" || exit 1
    echo "wheels: $(ls *.whl | wc -l), $(du -sm . | cut -f1) MiB"; cd "$REPO"
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/wh/*.whl > $K/install.log 2>&1 || { tail -20 $K/install.log; exit 1; }
    python3 "$HERE/smoke.py" > $K/smoke.log 2>&1 || { tail -30 $K/smoke.log; exit 1; }
    if [ -d /tmp/wh/af ]; then  # the Airflow side (pack_airflow.sh), apart from the cluster side's /tmp/site
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/afsite /tmp/wh/af/*.whl > $K/install-af.log 2>&1 || { tail -20 $K/install-af.log; exit 1; }
      PYTHONPATH=$REPO:/tmp/afsite python3 -c "import airflow, airflow_provider_raybatch.operators.llm_batch as m; print('airflow', airflow.__version__, 'provider OK')" 2>&1 | tail -1
    fi
    grep -E "torch|vllm|SMOKE" $K/smoke.log | cut -c1-300
    python3 -c "import ray.dashboard.optional_deps; print('ray dashboard deps OK')" 2>&1 | tail -1
    python3 "$HERE/make_model.py" $MODEL 2>&1 | tail -1
    python3 "$HERE/make_model.py" /tmp/llama_small_bpe --shape small --tokenizer bpe 2>&1 | tail -1
    python3 "$HERE/make_model.py" /tmp/llama8b_bpe --shape 8b --tokenizer bpe 2>&1 | tail -1
    python3 - <<'PY'
import json, sys
from pathlib import Path
sys.path.insert(0, "bench")
import workload
for name in ("ours-2000", "ours-20000"):
    job = json.load(open(f"bench/gpu/jobs/{name}.json"))
    workload.write_prompts(Path(job["spec"]["input_uri"]), job["requests"], job["prompt_tokens"], job["vocab_words"])
print("prompts written")
PY
    echo "install done at $(( $(date +%s) - T0 ))s";;
  data)     write_customers 2000000 2000000; write_customers 200000 200000;;  # ONE file each, as the seeds have
  data:*)   write_customers "${s#data:}" "${s#data:}";;
  rpg)      python3 "$HERE/rpg_summary.py" $K 2>&1 | tail -60;;
  vlmsmoke) # the tiny VLM straight through LLM.generate (no Ray): eager, then with vLLM's graphs
    for eager in 1 0; do RAYBATCH_TRY_EAGER=$eager timeout 300 python3 scripts/try_tiny_vlm.py /tmp/tiny_vlm > "$L/vlmsmoke-eager$eager.log" 2>&1
      echo "vlmsmoke eager=$eager rc=$?"; grep -E "Error|error:|tokens|caption|same" "$L/vlmsmoke-eager$eager.log" | cut -c1-300 | tail -6; done;;
  vlmsmoke1) # vLLM 0.25.1's new runner crashed in the tiny VLM's vision tower (RESULTS 7f): the old one
    VLLM_USE_V2_MODEL_RUNNER=0 RAYBATCH_TRY_EAGER=0 timeout 300 python3 scripts/try_tiny_vlm.py /tmp/tiny_vlm > "$L/vlmsmoke1.log" 2>&1
    echo "vlmsmoke1 rc=$?"; grep -E "Error|error:|tokens|caption|same|runner|Runner" "$L/vlmsmoke1.log" | cut -c1-300 | tail -8;;
  vlmsmoke2) # both runners crashed in the vision tower while profiling with dummy images: skip that
    RAYBATCH_TRY_SKIP_MM_PROFILING=1 RAYBATCH_TRY_EAGER=1 timeout 300 python3 scripts/try_tiny_vlm.py /tmp/tiny_vlm > "$L/vlmsmoke2.log" 2>&1
    echo "vlmsmoke2 rc=$?"; grep -E "Error|error:|tokens|caption|same" "$L/vlmsmoke2.log" | cut -c1-300 | tail -8;;
  enginetb) # the first EngineCore traceback of the Ray session, whole (the job log shows its tail)
    f=$(grep -l "Process EngineCore" /tmp/ray/session_latest/logs/worker-*.err 2>/dev/null | head -1)
    [ -n "$f" ] && grep -m1 -A80 "Process EngineCore" "$f" > "$L/engine-traceback.txt"; tail -30 "$L/engine-traceback.txt" 2>/dev/null | cut -c1-250;;
  data20m)  write_customers 20000000 1000000;;  # the dry-20m job's input: 20 files of 1,000,000 rows
  images)   # the images-100k job's input and model: 100,000 images in Parquet files, the tiny VLM
    python3 "$HERE/make_images.py" /tmp/gpu_data/images-100000 --rows 100000 --rows-per-file 5000 2>&1 | tail -2
    # --split-tiles: vLLM 0.25.1 gives an image that fits one tile no pixels (make_tiny_vlm.py)
    [ -e /tmp/tiny_vlm/config.json ] || python3 scripts/make_tiny_vlm.py /tmp/tiny_vlm --split-tiles 2>&1 | tail -2;;
  a:*)
    # a:NAME@TAG: the same run again, its results under NAME@TAG (a backfill's 7 raw scripts)
    n=${s#a:}; tag=${n#*@}; [ "$tag" = "$n" ] && tag=; n=${n%@*}
    job=bench/gpu/jobs/$n.json; [ -e "$job" ] || job=bench/gpu/jobs/ours-$n.json
    [ -n "$tag" ] && n=$n@$tag
    waitgpu; echo "=== a:$n start $(date +%T) ($(left)s left)"
    python3 -c "import json, sys; print(json.dumps(json.load(open(sys.argv[1]))['spec']))" "$job" > /tmp/spec-$n.json
    rm -rf /tmp/gpu_out/raw-$n; t=$(date +%s.%N)
    python3 "$HERE/procmon.py" $K/a-$n-rss.json & pm=$!
    python3 "$HERE/gpumon.py" $K/gpu-a-$n.json & gm=$!
    sm=; [ $MON = 1 ] && { python3 "$HERE/startmon.py" "$L/mon-a-$n" --spy "$MONSPY" & sm=$!; }
    timeout $(stagelimit) python3 "$REPO/bench/raw_vllm.py" /tmp/spec-$n.json /tmp/gpu_out/raw-$n > "$L/a-$n.log" 2>&1; rc=$?
    kill -TERM $pm $gm $sm; wait $pm $gm $sm; MON=0
    cp "/tmp/gpu_out/raw-$n/raw_result.json" "$K/a-$n-raw.json" 2>/dev/null
    python3 - "$t" "$(date +%s.%N)" "/tmp/gpu_out/raw-$n/raw_result.json" "$K/a-$n.json" "$K/a-$n-rss.json" <<'PY'
import json, sys
sys.path.insert(0, "bench")
import phases
t_launch, t_exit, src, dst, rss = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
result = phases.raw_result(json.load(open(src)), t_launch, t_exit)
result["rss"] = json.load(open(rss))
json.dump(result, open(dst, "w"), indent=1)
print("RESULT", json.dumps({k: v for k, v in result.items() if k != "rss"}))
print("RSS", json.dumps({g: (v["peak_rss_mib"], v["peak_sum_rss_mib"]) for g, v in result["rss"]["groups"].items()}))
PY
    echo "--- a:$n rc=$rc ($(( $(date +%s) - T0 ))s elapsed)"; grep -E "ENGINE|took|compile|Error|Traceback|KV cache" "$L/a-$n.log" | cut -c1-250 | tail -8;;
  b:*)
    name=${s#b:}
    # A backfill's later dates run while the pool's engine holds the GPU (keep_warm_seconds): no wait.
    case $name in backfill-d[2-9]*|pool*-warm*) ;; *) waitgpu;; esac
    startray
    mode=; rayup || mode=--direct
    echo "=== b:$name start $(date +%T) ($(left)s left) $mode"
    rm -rf /tmp/gpu_out/$name
    if [ $SPY = 1 ]; then
      ( while :; do for p in $(pgrep -f "EngineCore|forkserver import main"); do echo "=== $(date +%T.%N) pid $p $(tr '\0' ' ' < /proc/$p/cmdline | cut -c1-80)"
          timeout 5 /tmp/site/bin/py-spy dump --pid $p 2>&1 | head -45; done; sleep 1; done ) > "$L/spy-$name.txt" 2>&1 &
      spy=$!
    fi
    python3 "$HERE/gpumon.py" $K/gpu-b-$name.json & gm=$!
    sm=; [ $MON = 1 ] && { python3 "$HERE/startmon.py" "$L/mon-b-$name" --spy "$MONSPY" & sm=$!; }
    timeout $(stagelimit) python3 "$HERE/ours_job.py" "$HERE/jobs/$name.json" "$K/b-$name.json" $mode > "$L/b-$name.out" 2>&1; rc=$?
    kill -TERM $gm $sm; wait $gm $sm
    if [ $MON = 1 ]; then  # the engine actor's worker log, whole (the job log dedupes and prefixes lines)
      for f in $(grep -l "RaybatchvLLMEngineStage\|EngineCore" /tmp/ray/session_latest/logs/worker-*.out /tmp/ray/session_latest/logs/worker-*.err 2>/dev/null); do
        echo "==== $f"; head -c 3000000 "$f"; done > "$L/wlog-b-$name.txt"; MON=0
    fi
    [ $SPY = 1 ] && { kill $spy 2>/dev/null; SPY=0; }
    # vLLM's stats lines of the replicas (jobs with disable_log_stats=False), whole: the job log may dedupe them
    grep -H "Avg prompt throughput" /tmp/ray/session_latest/logs/worker-*.out /tmp/ray/session_latest/logs/worker-*.err \
      > "$L/vllmstats-b-$name.txt" 2>/dev/null
    echo "--- b:$name rc=$rc ($(( $(date +%s) - T0 ))s elapsed)"; grep -E "RESULT|PHASES|RSS|SPILLED|submitted|Error|Traceback|job " "$L/b-$name.out" | cut -c1-1500 | tail -8
    [ $rc = 0 ] || tail -40 "$L/b-$name.out"
    # The committed manifest, whole (the job log's copy may be cut): the pool's and the timings' blocks.
    cp "/tmp/gpu_out/$name/manifest.json" "$K/manifest-$name.json" 2>/dev/null;;
  af:*)  # issue 20's 7-date backfill through Airflow (bench/gpu/airflow_backfill.py): af:MAX_ACTIVE_RUNS
    waitgpu; startray
    echo "=== af:${s#af:} start $(date +%T) ($(left)s left)"
    rm -rf /tmp/gpu_out/af-backfill /tmp/afhome
    BACKFILL_LIMIT=$(stagelimit) timeout $(stagelimit) python3 "$HERE/airflow_backfill.py" $K "$K/af-backfill.json" "${s#af:}" > "$L/af-backfill.out" 2>&1; rc=$?
    echo "--- af rc=$rc ($(( $(date +%s) - T0 ))s elapsed)"; grep -vE "dates done" "$L/af-backfill.out" | tail -16 | cut -c1-400;;
  resume:*)
    name=${s#resume:}; waitgpu; startray
    echo "=== resume:$name start $(date +%T) ($(left)s left)"
    rm -rf /tmp/gpu_out/$name
    timeout $(stagelimit) python3 "$HERE/scale_resume.py" "$HERE/jobs/$name.json" "$K/resume-$name.json" > "$L/resume-$name.out" 2>&1; rc=$?
    echo "--- resume:$name rc=$rc ($(( $(date +%s) - T0 ))s elapsed)"; grep -E "FIRST|RERUN|IDCHECK|submitted|resubmitted|stop|Error|Traceback" "$L/resume-$name.out" | cut -c1-1500 | tail -10
    [ $rc = 0 ] || tail -40 "$L/resume-$name.out";;
  backfill)  # issue 20's backfill table from the a:ours-2000@dK and b:backfill-dK results
    python3 "$HERE/backfill_summary.py" "$K" "$K/backfill.json";;
  raylogs:*)  # the Ray session's process timelines since the last raylogs (workers started, actors made)
    name=${s#raylogs:}; d=/tmp/ray/session_latest/logs; o=$L/raylogs-$name; mkdir -p $o
    since=$K/raylogs.stamp; [ -e $since ] || touch -d @0 $since
    for f in $(find $d -maxdepth 1 -name 'python-core-worker-*.log' -newer $since); do
      echo "== $(basename $f)"; grep -hE "Constructing CoreWorkerProcess|Creating actor|creation task finished|max pending calls" $f | cut -c1-220
    done > $o/core-workers.txt
    for f in $(find $d -maxdepth 1 -name 'worker-*.err' -newer $since); do echo "== $(basename $f)"; head -c 3000 $f; done > $o/worker-err.txt
    touch $since; ls -la $o;;
  pool2x)  # issue 23's table from the b:pool1-* and b:pool2-* results
    python3 "$HERE/pool_scale_summary.py" "$K" "$K/pool2x.json";;
  floor:*)
    name=${s#floor:}; startray
    timeout $(stagelimit) python3 "$HERE/job_floor.py" "$HERE/jobs/$name.json" "$K/floor-$name.json" 2>&1 | tail -8;;
  check:*)
    name=${s#check:}
    timeout $(stagelimit) python3 "$HERE/scale_check.py" "$HERE/jobs/$name.json" "$K/check-$name.json" 2>&1 | tail -3;;
  bg)
    rest="${ST[*]:$i}"; i=${#ST[@]}
    if [ -e $K/bg.pid ] && [ ! -e $K/bg.rc ] && kill -0 "$(cat $K/bg.pid)" 2>/dev/null; then
      echo "a runner is still running (pid $(cat $K/bg.pid)): not starting '$rest'; waiting for it"
    else
      rm -f $K/bg.rc $K/bg.pid
      runner=/tmp/run_gpu_runner.$$.sh; cp "$HERE/run_gpu.sh" "$runner"
      # A daemon (fork, then a session of its own): the device ends what a call leaves running, but not that.
      python3 -c 'import os, sys
if os.fork(): os._exit(0)
os.setsid(); os.execvp(sys.argv[1], sys.argv[1:])' env RUNNER=1 LIMIT=100000 RUNNER_HERE="$HERE" bash "$runner" "__runner $rest" > $L/bg.log 2>&1 < /dev/null
      for _ in $(seq 20); do [ -e $K/bg.pid ] && break; sleep 0.5; done
      echo "runner started (pid $(cat $K/bg.pid 2>/dev/null)): '$rest'"
    fi
    waitbg;;
  wait) waitbg;;
  cold) rm -rf ~/.cache/vllm/torch_compile_cache /tmp/torchinductor_$(whoami) ~/.triton/cache; echo "compile caches cleared";;
  stop) ray stop --force > /dev/null 2>&1; echo "ray stopped";;
  spy) SPY=1;;
  mon) MON=1;;
  vlogms)  # vLLM's own format with milliseconds; the registry's debug lines through the same handler
    cat > /tmp/vllm_logging.json <<'JSON'
{"version": 1, "disable_existing_loggers": false,
 "formatters": {"vllm": {"class": "vllm.logging_utils.NewLineFormatter", "datefmt": "%m-%d %H:%M:%S",
                         "format": "%(levelname)s %(asctime)s.%(msecs)03d [%(fileinfo)s:%(lineno)d] %(message)s"}},
 "handlers": {"vllm": {"class": "logging.StreamHandler", "formatter": "vllm", "level": "DEBUG", "stream": "ext://sys.stdout"}},
 "loggers": {"vllm": {"handlers": ["vllm"], "level": "INFO", "propagate": false},
             "vllm.model_executor.models.registry": {"level": "DEBUG"}}}
JSON
    export VLLM_LOGGING_CONFIG_PATH=/tmp/vllm_logging.json; echo "vLLM logs with ms from here";;
  tree:*) HERE=$(cd "$REPO/${s#tree:}/bench/gpu" && pwd) || exit 1; echo "b: stages from $HERE";;
  purge)
    ray stop --force > /dev/null 2>&1
    rm -rf ~/.cache/vllm ~/.triton/cache /tmp/torchinductor_$(whoami) ~/.cache/torch/kernels
    echo "ray stopped, vLLM / Triton / Inductor caches deleted";;
  diag)  # where the Triton kernels went: vLLM points TRITON_CACHE_DIR into its compile-cache folder
    for d in ~/.triton/cache ~/.cache/vllm/torch_compile_cache/*/rank_0_0/triton_cache /tmp/torchinductor_$(whoami)/triton; do
      [ -d "$d" ] && echo "diag $d: $(find "$d" -type f | wc -l) files, $(du -sm "$d" | cut -f1) MiB"; done
    ls -d ~/.cache/vllm/torch_compile_cache/* 2>/dev/null | sed 's/^/diag compile cache /';;
  __runner) echo $$ > $K/bg.pid;;  # the runner's first stage (run_gpu.sh adds it): where it is
  sleep:*) sleep "${s#sleep:}"; echo "slept ${s#sleep:} s";;  # (a dry run of "bg" / "wait")
  *) echo "unknown stage '$s'";;
  esac
done
if [ "$RUNNER" = 1 ]; then
  python3 "$HERE/scale_summary.py" $K 2>&1 | tail -60
  echo "runner finished at $(date +%T)"; exit 0
fi
python3 - <<'PY'
import glob, json, os, sys
sys.path.insert(0, "bench")
import phases
keep = os.environ.get("KEEP", "/tmp/keep")
def load(name):
    p = os.path.join(keep, name)
    return json.load(open(p)) if os.path.exists(p) else None
for n, names in (("2000", ("ours-2000", "ours-2000-warm")), ("20000", ("ours-20000", "scale-2"))):
    for name in names:
        a, b = load(f"a-{n}.json"), load(f"b-{name}.json")
        if a or b:
            print(f"\n{n} requests, (b) = {name}\n" + phases.table(a, b))
PY
tar czf "$FINAL/results.tgz" --warning=no-file-changed -C $K . 2>/dev/null; ls -la "$FINAL"
