#!/usr/bin/env bash
# The whole test suite: lint, unit tests, then molecule scenarios on real systemd test hosts.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"

echo "== lint" >&2
ruff check .
ruff format --check .
yamllint --strict .
ansible-lint --offline --strict

echo "== unit tests" >&2
pytest

echo "== molecule" >&2
for scenario in ${MOLECULE_SCENARIOS:-preflight vllm_server pipeline pipeline_multinode}; do
  molecule test -s "$scenario"
done
echo "== all tests passed" >&2
