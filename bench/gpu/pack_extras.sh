#!/bin/bash
# The wheels the shared recipe (pack.sh) does not carry but the Ray Jobs API needs on the device:
# Ray's dashboard starts only when ray/dashboard/optional_deps.py imports (aiohttp_cors, opencensus,
# opentelemetry.exporter.prometheus, ...; the image has aiohttp, grpcio, prometheus_client). ~4 MiB,
# carried with p6 as DEST/x.   usage: bash bench/gpu/pack_extras.sh [DEST]   (default .gpu)
set -euo pipefail
DEST=${1:-.gpu}
mkdir -p "$DEST/x"
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any"
python3 -m pip download -q --no-deps $PLAT -d "$DEST/x" aiohttp_cors==0.8.1 colorful==0.5.8 py-spy==0.4.3 \
  opencensus==0.11.4 opencensus-context==0.1.3 google-api-core==2.44.0 google-auth==2.62.2 proto-plus==1.29.0 \
  pyasn1==0.6.5 pyasn1-modules==0.4.2 rsa==4.9.1 opentelemetry-exporter-prometheus==0.66b2 smart_open==9.0.2
du -sh "$DEST/x"
