"""Every role entry point has an argument spec, and the settings users start from pass it.

Each tasks file that playbooks/train.yml enters (``tasks_from``) is an entry point of
meta/argument_specs.yml; every option it documents has its default in defaults/main.yml (the
values users tune live there, the spec says what they are) unless it is required; and the role defaults, with
inventory/tiny's and the Kimi-K2.5 example's settings over them, validate as Ansible validates a
role's arguments when it enters one (templated values are checked at run time, not here).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from tests.conftest import ROOT

ROLES = ["eagle3", "gpu_preflight", "vllm_server"]
PLAYBOOK = (ROOT / "playbooks/train.yml").read_text()
ENTERED = set(re.findall(r"name: eagle3\.pipeline\.(\w+)\n\s+tasks_from: (\w+)", PLAYBOOK))
# Each as users run it: inventory/tiny-kimi goes over inventory/tiny.
INVENTORIES = {"tiny": ["tiny"], "tiny-kimi": ["tiny", "tiny-kimi"], "kimi-k25-example": ["kimi-k25-example"]}


def specs(role: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / "roles" / role / "meta/argument_specs.yml").read_text())["argument_specs"]


def defaults(role: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / "roles" / role / "defaults/main.yml").read_text()) or {}


def test_every_entry_point_the_playbook_enters_has_a_spec() -> None:
    assert ENTERED, "no tasks_from found in playbooks/train.yml"
    missing = sorted(f"{role}:{entry}" for role, entry in ENTERED if entry not in specs(role))
    assert missing == []


@pytest.mark.parametrize("role", ROLES)
def test_documented_options_have_their_default_in_defaults(role: str) -> None:
    known = set(defaults(role))
    for entry, spec in specs(role).items():
        optional = {k for k, v in spec.get("options", {}).items() if not v.get("required")}
        undocumented = sorted(optional - known)
        assert undocumented == [], f"{role}:{entry} documents options without a default: {undocumented}"


@pytest.mark.parametrize("inventory", INVENTORIES)
@pytest.mark.parametrize("role", ROLES)
def test_the_shipped_settings_pass_every_entry_point(role: str, inventory: str) -> None:
    settings = {**defaults(role)}
    for layer in INVENTORIES[inventory]:
        settings |= yaml.safe_load((ROOT / "inventory" / layer / "group_vars/all.yml").read_text())
    literal = {k: v for k, v in settings.items() if not (isinstance(v, str) and "{{" in v)}
    for entry, spec in specs(role).items():
        options = spec.get("options", {})
        given = {k: v for k, v in literal.items() if k in options}
        result = ArgumentSpecValidator(options).validate(given)
        assert result.error_messages == [], f"{role}:{entry} with inventory/{inventory}"
