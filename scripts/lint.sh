#!/usr/bin/env bash
# The code checks, run first by scripts/test.sh (so by CI) and, per commit, by the pre-commit hooks
# (.pre-commit-config.yaml):
#   ruff check            the lint rules of pyproject.toml's [tool.ruff.lint], over the whole repository
#   ruff format --check   what `ruff format` would change (Markdown excluded: [tool.ruff.format])
#   mypy                  airflow_provider_raybatch/, as [tool.mypy] says (and why it runs where it does)
#   lint-imports          the layers' import contracts of pyproject.toml's [tool.importlinter]
#   pre-commit            validate-config of .pre-commit-config.yaml
# The tools are .venvs/airflow's, pinned in pyproject.toml's "lint" extra (scripts/setup_envs.sh).
# Every check runs, so one run shows all findings; prints a count for each and exits non-zero if any
# check found anything. `scripts/lint.sh --fix` first lets ruff fix what it can and reformat.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venvs/airflow/bin
for tool in ruff mypy lint-imports pre-commit; do
  if [ ! -x "$BIN/$tool" ]; then
    echo "lint: $BIN/$tool is missing: run scripts/setup_envs.sh first" >&2
    exit 2
  fi
done
if [ "${1:-}" = "--fix" ]; then
  "$BIN/ruff" check --fix --quiet . || true  # what it cannot fix is reported below
  "$BIN/ruff" format --quiet .
fi

failed=()
summary=()
# check NAME PATTERN CMD...: run CMD, show its output, and take the count from the first number of the
# text matching PATTERN (none: 0); a check that fails without such a line counts as 1 finding.
check() {
  local name=$1 pattern=$2 output count status=0
  shift 2
  output=$("$@" 2>&1) || status=$?
  [ -n "$output" ] && printf '%s\n' "$output"
  count=$(printf '%s\n' "$output" | grep -oE "$pattern" | grep -oE '[0-9]+' | head -n1 || true)
  count=${count:-0}
  if [ "$status" -ne 0 ]; then
    [ "$count" -eq 0 ] && count=1
    failed+=("$name")
  fi
  summary+=("$name: $count")
}

check "ruff check (errors)" '^Found [0-9]+ error' "$BIN/ruff" check --output-format concise .
check "ruff format (files to reformat)" '[0-9]+ files? would be reformatted' \
  "$BIN/ruff" format --check --output-format concise .
check "mypy (errors)" '^Found [0-9]+ error' "$BIN/mypy"
check "import contracts (broken)" '[0-9]+ broken' "$BIN/lint-imports" --no-cache
check "pre-commit config (errors)" 'error' "$BIN/pre-commit" validate-config .pre-commit-config.yaml

counts=$(printf '%s; ' "${summary[@]}")
echo "lint: ${counts%; }"
if [ ${#failed[@]} -gt 0 ]; then
  names=$(printf '%s, ' "${failed[@]}")
  echo "lint: ${#failed[@]} check(s) failed: ${names%, }" >&2
  exit 1
fi
echo "lint: all checks passed"
