"""The controller's working directory: where ansible-playbook was started."""

from __future__ import annotations

DOCUMENTATION = r"""
name: cwd
short_description: The directory ansible-playbook was started in, on the controller
description:
  - Returns the controller process's working directory (C(os.getcwd())), where the user typed
    C(ansible-playbook). Unlike C(lookup('env', 'PWD')), this is right when a wrapper starts
    ansible-playbook from another directory without updating PWD; unlike C(lookup('pipe', 'pwd')),
    it is not the playbook's directory.
  - The pipeline's record directories default to C(runs/latest) under it.
options: {}
"""

EXAMPLES = r"""
- name: Where records go by default
  ansible.builtin.debug:
    msg: "{{ lookup('eagle3.pipeline.cwd') }}/runs/latest"
"""

RETURN = r"""
_raw:
  description: One element, the absolute path of the controller's working directory.
  type: list
  elements: path
  sample: [/home/user/eagle3-pipeline]
"""

import os
from typing import Any

from ansible.plugins.lookup import LookupBase


class LookupModule(LookupBase):
    def run(self, terms: list[Any], variables: dict[str, Any] | None = None, **kwargs: Any) -> list[str]:
        return [os.getcwd()]
