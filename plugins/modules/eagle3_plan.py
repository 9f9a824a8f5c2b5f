#!/usr/bin/python
"""Documentation of the eagle3_plan action (plugins/action/eagle3_plan.py; logic in plugins/plugin_utils/plan.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: eagle3_plan
short_description: Plan an EAGLE-3 pipeline run, stage by stage and host by host
description:
  - Computes, in one place, every stage of the run (C(generate-<rank>), C(gather), C(prepare),
    C(extract), C(train), C(train-node-<r>), C(validate)), each stage's inputs and the hash chain
    that makes a changed input rerun its stage and every stage after it, and nothing before.
  - Runs in four steps, each on every host of the play after every host has finished the one before.
  - C(inputs) reads the host's C(eagle3_*) settings as the host sees them (inventory, extra vars,
    the role's defaults) and the sha256 of the files its stages read (the target's C(config.json);
    the questions on a generator; the held-out prompts on the first trainer). A missing file stops
    the run with a line naming the host, the path and the setting.
  - C(check) plans the whole run from every host's inputs and stops it, with every problem named,
    when the settings cannot make one (a setting of the wrong type or missing, aux layers out of
    range, an inventory without C(generators) or C(trainers)), before anything is built or installed.
  - C(stages) plans the whole run again (the same result) and asks
    the host, with one C(jobs.stage statuses) in C(eagle3_python), which of its stages are complete
    for their inputs hash, whether its server unit is active, and whether a pipeline run started
    it. Where that Python or the jobs are not installed yet, every stage is to do.
  - C(settle) adds what depends on other hosts' answers. The other trainers train when the first
    one does (torchrun needs every node). A generator needs its server when it generates, or, with
    separate extraction, when it is the first generator and the trainer extracts.
  - Reads only; a check run plans too (run C(stages) with C(check_mode) false to ask the hosts).
options:
  step:
    description: Which step to run.
    type: str
    required: true
    choices: [inputs, check, stages, settle]
  inputs_var:
    description: The variable every host registered its C(inputs) step in (read by C(check) and C(stages)).
    type: str
    default: eagle3__inputs
  plan_var:
    description: The variable every host keeps its C(stages) plan in (read by C(settle)).
    type: str
    default: eagle3_plan
  jobs_wheel:
    description: The jobs wheel the run installs (C(path), C(name), C(sha256)), kept in the plan.
    type: dict
    default: {}
author: eagle3-pipeline
"""

EXAMPLES = r"""
- name: Read this host's settings and input files
  eagle3.pipeline.eagle3_plan:
    step: inputs
  register: eagle3__inputs

- name: Plan every stage and ask this host which are complete
  eagle3.pipeline.eagle3_plan:
    step: stages
    jobs_wheel: "{{ eagle3__jobs_wheel }}"
  register: eagle3__stages
  check_mode: false

- name: Keep this host's plan
  ansible.builtin.set_fact:
    eagle3_plan: "{{ eagle3__stages.plan }}"

- name: Settle the plan across hosts
  eagle3.pipeline.eagle3_plan:
    step: settle
  register: eagle3__settled
"""

RETURN = r"""
host:
  description: C(inputs) step. The host's settings and the checksums of the files it reads.
  type: dict
  returned: step is inputs
  sample:
    settings: {eagle3_run_dir: /var/lib/eagle3/runs/tiny, eagle3_generate_max_tokens: 256}
    files: {model_config_sha256: 9f2c41d0e8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1}
plan:
  description:
    - C(stages) and C(settle) steps. This host's plan, C(eagle3_plan). The keys include C(rank) and
      C(node_rank) (-1 where it has none), C(generate_stage), C(train_stage), C(stages) (name to
      C(kind), C(inputs), C(hash), C(after)), C(todo), C(status), C(trainer), C(generators),
      C(trainers), C(rows_files), C(captured_layers), C(run_dir), C(python), C(record_dir),
      C(hidden_states_dir), C(jobs_installed), C(jobs_wheel) and C(server).
    - C(server) holds C(name), C(unit), C(marker) (the file a pipeline run that started it writes), C(port), C(model), C(served_model_name),
      C(speculative_config), C(kv_transfer_config) and C(needed).
  type: dict
  returned: step is stages or settle
  sample:
    rank: 0
    node_rank: 0
    generate_stage: generate-0
    train_stage: train
    todo: [train, validate]
    trainer: e3-pipe-1
    captured_layers: [1, 2, 3, 4]
    run_dir: /var/lib/eagle3/runs/tiny
    server: {name: gen, unit: vllm-gen.service, port: 8000, needed: false}
msg:
  description: C(settle) step. What the host will run, in one line.
  type: str
  returned: step is settle
  sample: "e3-pipe-1: to run: train, validate"
"""
