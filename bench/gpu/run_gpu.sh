#!/bin/bash
# Runs on the device machine (bench/RESULTS.md, "GPU"). The shared recipe's run_all.sh, with our stages:
#   bash bench/gpu/run_gpu.sh "install cold a:2000 cold b:ours-2000"; then "cold a:20000 b:ours-2000-warm";
#   then "cold b:ours-20000 stop"   (calls in a row, each within the 30 s the machine stays warm)
#   install     reassemble + check + install the carried wheels (/tmp/wh, incl. the Jobs API extras), smoke
#               test, write the Llama-3.1-8B-shaped dummy model and the prompt files
#   a:N         (a) raw vLLM LLM.generate on the spec of bench/gpu/jobs/ours-N.json (bench/raw_vllm.py)
#   b:NAME      (b) our pipeline: the job bench/gpu/jobs/NAME.json through the Ray Jobs API (ours_job.py);
#               starts the Ray head first if it is not up (it stays up between calls while the machine is warm)
#   cold        delete the compile caches (vLLM's torch.compile cache, inductor, Triton): the next run starts cold
#   stop        ray stop
#   diag        list the Triton / compile cache folders and their sizes
#   spy         the next b: stage samples the EngineCore processes with py-spy dump every ~1 s
#               (spy-NAME.txt): where the engine's start-up time goes
# Results: /tmp/keep/*.json (kept between calls); everything of the call in $OUT/results.tgz (the device
# tool returns at most 8 files).
set -u
T0=$(date +%s); LIMIT=${LIMIT:-585}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
       RAY_USAGE_STATS_ENABLED=0 TOKENIZERS_PARALLELISM=false PYTHONPATH=/tmp/site \
       VLLM_USE_FLASHINFER_SAMPLER=0 RAY_AUTH_MODE=disabled
export PATH=/tmp/site/bin:$PATH  # ray; the job entrypoint `python` is the image venv's
FINAL=${OUT:-/tmp/out}; OUT=$FINAL/r; K=/tmp/keep; mkdir -p "$OUT" $K /tmp/bin; SPY=0
rm -f /tmp/bin/python  # the image has python in its venv; a symlink elsewhere would lose the venv
HERE=$(cd "$(dirname "$0")" && pwd); REPO=$(cd "$HERE/../.." && pwd)
MODEL=/tmp/llama8b_dummy
echo "start $(date +%T) stages='${1:-}' LIMIT=$LIMIT"
waitgpu() { local u; for i in $(seq 60); do u=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1); [ "${u:-0}" -lt 3000 ] && return 0; sleep 1; done; echo "GPU still has ${u} MiB used"; }
rayup() { python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8265/api/version', timeout=3)" 2>/dev/null; }
for s in ${1:-install}; do
  case $s in
  install)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $K/gpu.txt
    cd /tmp/wh || exit 1
    for f in *.part-aa; do [ -e "$f" ] || continue; b=${f%.part-aa}; cat "$b".part-* > "$b" && rm "$b".part-*; done
    sha256sum -c "$HERE/vllm.sha256" || exit 1
    echo "wheels: $(ls *.whl | wc -l), $(du -sm . | cut -f1) MiB"; cd "$REPO"
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/wh/*.whl > $K/install.log 2>&1 || { tail -20 $K/install.log; exit 1; }
    python3 "$HERE/smoke.py" > $K/smoke.log 2>&1 || { tail -30 $K/smoke.log; exit 1; }
    grep -E "torch|vllm|SMOKE" $K/smoke.log | cut -c1-300
    python3 -c "import ray.dashboard.optional_deps; print('ray dashboard deps OK')" 2>&1 | tail -1
    python3 "$HERE/make_model.py" $MODEL 2>&1 | tail -1
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
  a:*)
    n=${s#a:}; waitgpu; echo "=== a:$n start $(date +%T) ($(left)s left)"
    python3 -c "import json; print(json.dumps(json.load(open('bench/gpu/jobs/ours-$n.json'))['spec']))" > /tmp/spec-$n.json
    rm -rf /tmp/gpu_out/raw-$n; t=$(date +%s.%N)
    timeout $(( $(left) - 5 )) python3 "$REPO/bench/raw_vllm.py" /tmp/spec-$n.json /tmp/gpu_out/raw-$n > "$OUT/a-$n.log" 2>&1; rc=$?
    python3 - "$t" "$(date +%s.%N)" "/tmp/gpu_out/raw-$n/raw_result.json" "$K/a-$n.json" <<'PY'
import json, sys
sys.path.insert(0, "bench")
import phases
t_launch, t_exit, src, dst = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
result = phases.raw_result(json.load(open(src)), t_launch, t_exit)
json.dump(result, open(dst, "w"), indent=1)
print("RESULT", json.dumps(result))
PY
    echo "--- a:$n rc=$rc ($(( $(date +%s) - T0 ))s elapsed)"; grep -E "ENGINE|took|compile|Error|Traceback|KV cache" "$OUT/a-$n.log" | cut -c1-250 | tail -8;;
  b:*)
    name=${s#b:}; waitgpu
    if ! rayup; then
      # From /: should the job's `python -m` driver inherit the head's cwd (via the job supervisor), it
      # would put it first on sys.path, and a checkout there would shadow the package the job uploaded.
      (cd / && ray start --head --dashboard-host=127.0.0.1 --dashboard-port=8265 --disable-usage-stats) > $K/ray_start.log 2>&1 || tail -20 $K/ray_start.log
      for i in $(seq 60); do rayup && break; sleep 1; done
      rayup && echo "Ray head up ($(( $(date +%s) - T0 ))s elapsed)" || { echo "Ray dashboard not up: falling back to a direct driver"; tail -15 /tmp/ray/session_latest/logs/dashboard.log; }
    fi
    mode=; rayup || mode=--direct
    echo "=== b:$name start $(date +%T) ($(left)s left) $mode"
    rm -rf /tmp/gpu_out/$name
    if [ $SPY = 1 ]; then
      ( while :; do for p in $(pgrep -f "EngineCore|forkserver import main"); do echo "=== $(date +%T.%N) pid $p $(tr '\0' ' ' < /proc/$p/cmdline | cut -c1-80)"
          timeout 5 /tmp/site/bin/py-spy dump --pid $p 2>&1 | head -45; done; sleep 1; done ) > "$OUT/spy-$name.txt" 2>&1 &
      spy=$!
    fi
    timeout $(( $(left) - 5 )) python3 "$HERE/ours_job.py" "$HERE/jobs/$name.json" "$K/b-$name.json" $mode > "$OUT/b-$name.out" 2>&1; rc=$?
    [ $SPY = 1 ] && { kill $spy 2>/dev/null; SPY=0; }
    cp $K/b-$name.log "$OUT/" 2>/dev/null
    echo "--- b:$name rc=$rc ($(( $(date +%s) - T0 ))s elapsed)"; grep -E "RESULT|submitted|Error|Traceback|job " "$OUT/b-$name.out" | cut -c1-1500 | tail -6
    [ $rc = 0 ] || tail -40 "$OUT/b-$name.out";;
  cold) rm -rf ~/.cache/vllm/torch_compile_cache /tmp/torchinductor_$(whoami) ~/.triton/cache; echo "compile caches cleared";;
  stop) ray stop --force > /dev/null 2>&1; echo "ray stopped";;
  spy) SPY=1;;
  diag)  # where the Triton kernels went: vLLM points TRITON_CACHE_DIR into its compile-cache folder
    for d in ~/.triton/cache ~/.cache/vllm/torch_compile_cache/*/rank_0_0/triton_cache /tmp/torchinductor_$(whoami)/triton; do
      [ -d "$d" ] && echo "diag $d: $(find "$d" -type f | wc -l) files, $(du -sm "$d" | cut -f1) MiB"; done
    ls -d ~/.cache/vllm/torch_compile_cache/* 2>/dev/null | sed 's/^/diag compile cache /';;
  esac
done
cp $K/*.json "$OUT"/ 2>/dev/null
python3 - <<'PY'
import glob, json, os, sys
sys.path.insert(0, "bench")
import phases
keep = "/tmp/keep"
def load(name):
    p = os.path.join(keep, name)
    return json.load(open(p)) if os.path.exists(p) else None
for n, names in (("2000", ("ours-2000", "ours-2000-warm")), ("20000", ("ours-20000", "scale-2"))):
    for name in names:
        a, b = load(f"a-{n}.json"), load(f"b-{name}.json")
        if a or b:
            print(f"\n{n} requests, (b) = {name}\n" + phases.table(a, b))
PY
tar czf "$FINAL/results.tgz" -C "$OUT" . -C $K . 2>/dev/null && rm -rf "$OUT"; ls -la "$FINAL"
