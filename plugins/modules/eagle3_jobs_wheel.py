#!/usr/bin/python
"""Documentation of the eagle3_jobs_wheel action (plugins/action/eagle3_jobs_wheel.py): it runs on the controller."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: eagle3_jobs_wheel
short_description: Build the jobs wheel on the controller, reproducibly
description:
  - Builds the wheel of the collection's C(jobs/) package (distribution C(eagle3-pipeline), from its
    C(pyproject.toml)) with C(pip wheel) in the controller's Python, without dependencies and offline.
  - Every build of the same source has the same bytes (file dates fixed by C(SOURCE_DATE_EPOCH)), so
    copying it to the hosts changes nothing on a rerun. The build runs on a copy of the sources, since
    setuptools writes into the tree it builds.
  - Runs on the controller (an action plugin); a check run builds too, so that it can compare.
options:
  source:
    description: The collection's root (it holds C(jobs/) and C(pyproject.toml)).
    type: path
    required: true
  dest:
    description: Controller directory the wheel is put in.
    type: path
    required: true
author: eagle3-pipeline
"""

EXAMPLES = r"""
- name: Build the jobs wheel
  eagle3.pipeline.eagle3_jobs_wheel:
    source: "{{ role_path }}/../.."
    dest: "{{ playbook_dir }}/runs/latest/jobs-wheel"
  run_once: true
  register: jobs_wheel
"""

RETURN = r"""
path:
  description: The wheel on the controller.
  type: str
  returned: success
  sample: /home/me/runs/latest/jobs-wheel/eagle3_pipeline-0.1.0-py3-none-any.whl
name:
  description: The wheel's file name.
  type: str
  returned: success
  sample: eagle3_pipeline-0.1.0-py3-none-any.whl
sha256:
  description: The wheel's sha256 (pip verifies it on the hosts and records it with the install).
  type: str
  returned: success
  sample: 4e165f3afa7ff79a4e7157df3879c1a0388c69d94b5d907fab29864d468a8e8d
"""
