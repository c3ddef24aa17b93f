#!/bin/bash
# The Airflow side for the device (issue 20's backfill through Airflow, bench/gpu/airflow_backfill.py):
# Airflow 3.3.2 and every package it needs, for the device's Python 3.12, plus this checkout's wheel (for
# its entry points: the `ray` connection type; the code itself runs from the tree). ~60 MiB, in DEST/af.
# They install on the device into /tmp/afsite, apart from the cluster side's /tmp/site (run_gpu.sh's
# "install"): two environments, as on a user's deployment. pack_scale.sh puts DEST/af in its tar.
#   usage: bash bench/gpu/pack_airflow.sh [DEST]   (default .gpu), then bash bench/gpu/pack_scale.sh DEST
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEST=$(mkdir -p "${1:-.gpu}" && cd "${1:-.gpu}" && pwd)
rm -rf "$DEST/af"; mkdir -p "$DEST/af"
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any"
# The provider's own requirements (pyproject.toml) at Airflow 3.3.2, the release CI tests.
python3 -m pip download -q $PLAT -d "$DEST/af" "apache-airflow==3.3.2" "aiohttp>=3.10" "httpx>=0.27" "pydantic>=2.6" "yarl>=1.9" 2>&1 | grep -v "is ignored" || true
"$ROOT/.venvs/bootstrap/bin/uv" build -q --wheel --out-dir "$DEST/af" "$ROOT"
echo "$DEST/af: $(ls "$DEST/af" | wc -l) wheels, $(du -sm "$DEST/af" | cut -f1) MiB"
