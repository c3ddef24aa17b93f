#!/usr/bin/env bash
# Test what users install (scripts/test.sh runs this unless RAYBATCH_TEST_INSTALL=editable):
#   1. build the sdist, then the wheel from the sdist, as pip does with a release from PyPI (dist/);
#   2. check both: `twine check --strict`, and scripts/check_dist.py (every file git tracks under
#      airflow_provider_raybatch/ is in the wheel and the sdist; versions and entry points agree);
#   3. install the wheel, not editable, into a fresh .venvs/airflow-wheel, with the versions
#      .venvs/airflow has (the uv cache serves every file): the two venvs differ only in how the
#      provider is installed;
#   4. check that `airflow providers list` there shows the wheel's version;
#   5. lay out build/test-root/: links to tests/ and pyproject.toml and nothing else. pytest runs
#      from there, so that no folder holding the checkout's airflow_provider_raybatch/ is on sys.path
#      (nor the cwd of the tests' subprocesses): every test imports the installed copy, and
#      tests/conftest.py stops the run at once when it would not.
# Needs scripts/setup_envs.sh first (uv, and .venvs/airflow whose versions it copies).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
UV=$ROOT/.venvs/bootstrap/bin/uv
BASE_PY=$("$ROOT/.venvs/airflow/bin/python" -c 'import sys; print(sys._base_executable)')
VENV=$ROOT/.venvs/airflow-wheel
TWINE_VERSION=7.0.0
export UV_LINK_MODE=copy UV_HTTP_TIMEOUT=300
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT

# 1-2. Build and check. build/test-root goes first: hatchling leaves out of the sdist a folder that
# an ignored symlink (build/test-root/tests) points at.
rm -rf build/test-root
"$UV" build -q --clear --out-dir dist --python "$BASE_PY"
"$UV" tool run -q --python "$BASE_PY" --from "twine==$TWINE_VERSION" \
  twine check --strict dist/*.tar.gz dist/*.whl
"$BASE_PY" scripts/check_dist.py dist
WHEEL=$(ls "$ROOT"/dist/*.whl)

# 3. A fresh venv: the wheel with its [test] and [common-ai] extras, its dependencies resolved from the wheel's own
# metadata at .venvs/airflow's versions; then whatever else .venvs/airflow holds (tools the tests
# may run), so that the two venvs differ only in how the provider is installed.
VIRTUAL_ENV=$ROOT/.venvs/airflow "$UV" pip freeze -q --exclude-editable \
  | grep -v '^airflow-provider-raybatch[ =@]' > "$SCRATCH/airflow-venv.txt"
rm -rf "$VENV"
"$UV" venv -q -p "$BASE_PY" "$VENV"
VIRTUAL_ENV=$VENV "$UV" pip install -q -c "$SCRATCH/airflow-venv.txt" \
  "airflow-provider-raybatch[test,common-ai] @ file://$WHEEL"
VIRTUAL_ENV=$VENV "$UV" pip install -q -r "$SCRATCH/airflow-venv.txt"

# 4. What Airflow sees there: the provider from site-packages, at the wheel's version. From an empty
# folder and AIRFLOW_HOME, so that neither the checkout nor a developer's config is in the way.
VERSION=$("$BASE_PY" -c 'import sys, tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
cd "$SCRATCH"
AIRFLOW_HOME=$SCRATCH/airflow "$VENV/bin/airflow" providers list -o json > providers.json
"$VENV/bin/python" - providers.json "$VERSION" <<'EOF'
import json, sys, sysconfig
from pathlib import Path
import airflow_provider_raybatch
listed = json.loads(Path(sys.argv[1]).read_text())
ours = [p for p in listed if p.get("package_name") == "airflow-provider-raybatch"]
if [p.get("version") for p in ours] != [sys.argv[2]]:
    raise SystemExit(f"test_wheel: `airflow providers list` shows {ours or 'no airflow-provider-raybatch'}, not version {sys.argv[2]}")
where = Path(airflow_provider_raybatch.__file__).resolve()
if not where.is_relative_to(Path(sysconfig.get_paths()["purelib"]).resolve()):
    raise SystemExit(f"test_wheel: airflow_provider_raybatch is imported from {where}, not site-packages")
print(f"test_wheel: airflow providers list: {ours[0]['package_name']} {ours[0]['version']}; imported from {where.parent}")
EOF

# 5. The folder pytest runs from.
cd "$ROOT"
mkdir -p build/test-root
ln -sfn "$ROOT/tests" build/test-root/tests
ln -sfn "$ROOT/pyproject.toml" build/test-root/pyproject.toml
