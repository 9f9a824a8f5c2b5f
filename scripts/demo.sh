#!/usr/bin/env bash
# The main job end to end on the built-in tiny target (CPU): boots a local Debian test host
# (systemd-nspawn, own network namespace, SSH), runs playbooks/train.yml against it with
# inventory/tiny, prints the pre-flight record, and stops the host (KEEP_HOST=1 keeps it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"

host=${DEMO_HOST:-e3-demo}
run_dir=${EAGLE3_RUN_DIR:-$PWD/runs/demo}
mkdir -p "$run_dir"
[[ ${KEEP_HOST:-0} == 1 ]] || trap 'python tests/hosts/testhost.py down "$host"' EXIT

python tests/hosts/testhost.py up "$host" >"$run_dir/testhost.json"
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
  -e "gpu_preflight_record_dir=$run_dir/preflight"
echo "pre-flight record: $run_dir/preflight/$host.json"
cat "$run_dir/preflight/$host.json"
