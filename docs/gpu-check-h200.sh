#!/usr/bin/env bash
# The pre-flight role on a real H200 (run through the device tool; see docs/gpu-check-h200.md).
# ansible-playbook with a local connection, against the real nvidia-smi:
#   1. idle GPU: the gate must pass;
#   2. a process holding GPU memory: the gate must fail, naming its PID.
# Expects ansible-core on PYTHONPATH and its scripts on PATH; writes records under $OUT.
set -uo pipefail
export LC_ALL=C.UTF-8 ANSIBLE_CONFIG=$PWD/ansible.cfg ANSIBLE_FORCE_COLOR=0
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
py=$(command -v python3)
inv=$out/inventory.ini
printf 'h200 ansible_connection=local ansible_python_interpreter=%s\n' "$py" >"$inv"
gate() {
  ansible-playbook playbooks/train.yml -i "$inv" --tags preflight \
    -e gpu_preflight_expected_gpus=-1 -e gpu_preflight_output_path=/tmp/eagle3-runs \
    -e '{"gpu_preflight_ports": [8000]}' -e "gpu_preflight_record_dir=$out/$1"
}

echo "### nvidia-smi as found"
nvidia-smi
echo "### run 1: idle GPU (expect: passes)"
gate idle
echo "exit code: $?"

echo "### run 2: a process holds 20 GiB of GPU memory (expect: fails naming it)"
python3 -c "
import time, torch
x = torch.empty(20 * 2**30, dtype=torch.uint8, device='cuda')
x.fill_(1)
torch.cuda.synchronize()
print('holder ready', flush=True)
time.sleep(600)
" &
holder=$!
for _ in $(seq 1 120); do
  nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -q "^$holder\$" && break
  sleep 1
done
echo "holder pid: $holder"
nvidia-smi --query-compute-apps=pid,process_name,gpu_uuid,used_memory --format=csv,noheader,nounits
gate busy
echo "exit code: $?"
kill "$holder"
wait "$holder" 2>/dev/null
echo "### records"
for f in "$out"/*/*.json; do echo "== $f"; cat "$f"; done
