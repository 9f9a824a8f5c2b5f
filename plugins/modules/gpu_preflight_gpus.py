#!/usr/bin/python
"""Read every GPU on a host through nvidia-smi and judge whether it is free and healthy."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_preflight_gpus
short_description: Read all GPUs with nvidia-smi and list what makes them unfit for a run
description:
  - Runs C(nvidia-smi --query-gpu) and C(nvidia-smi --query-compute-apps) with a timeout,
    parses every GPU (not just GPU 0) and returns the readings plus a list of problems.
  - Never changes the host; supports check mode. The module does not fail on problems;
    the role gates on the returned C(problems) so readings are recorded either way.
options:
  expected_gpus:
    description:
      - How many GPUs must be visible. V(-1) means whatever the host reports, at least one.
      - V(0) is CPU-only mode; nvidia-smi is not run.
    type: int
    default: -1
  max_memory_used_mib:
    description: Memory in use on any GPU above this is a problem.
    type: int
    default: 1024
  allow_compute_processes:
    description: Whether a compute process on a GPU is acceptable.
    type: bool
    default: false
  allowed_pids:
    description:
      - Compute processes that belong to the run itself (its own vLLM server, a stage still running). They are not
        problems, and the memory they use does not count against O(max_memory_used_mib); every other process and
        the rest of each GPU's memory is still checked.
    type: list
    elements: int
    default: []
  max_uncorrected_ecc:
    description: Uncorrected volatile ECC errors above this are a problem.
    type: int
    default: 0
  forbidden_compute_modes:
    description: Compute modes that make a GPU unusable.
    type: list
    elements: str
    default: [Prohibited]
  expected_mig_mode:
    description: Required MIG mode (V(Disabled) or V(Enabled)); empty to skip the check.
    type: str
    default: Disabled
  nvidia_smi_path:
    description: The nvidia-smi binary to run.
    type: str
    default: nvidia-smi
  timeout:
    description: Seconds each nvidia-smi call may take before the driver counts as not answering.
    type: int
    default: 30
author: eagle3-pipeline
"""

EXAMPLES = r"""
- name: Read GPUs
  gpu_preflight_gpus:
    expected_gpus: 8
    max_memory_used_mib: 1024
  register: gpus
"""

RETURN = r"""
gpus:
  description: One reading per GPU, in nvidia-smi's index order (parsed fields, and C(raw) as nvidia-smi printed them).
  type: list
  elements: dict
  returned: always
  sample:
    - {index: 0, uuid: GPU-ac7866cb-8b62-b3da-c4c3-a0c33289e300, name: NVIDIA H200, driver_version: 580.159.04,
       memory_used: 0, memory_total: 143771, compute_mode: Default, mig_mode_current: Disabled, remapped_rows_pending: "No"}
compute_processes:
  description: Compute processes on any GPU, with the GPU index they run on.
  type: list
  elements: dict
  returned: always
  sample:
    - {pid: 4242, process_name: /usr/bin/python3, gpu_uuid: GPU-ac7866cb-8b62-b3da-c4c3-a0c33289e303, used_memory: 81220, gpu_index: 3}
driver_version:
  description: Driver version nvidia-smi reports (null if it did not answer).
  type: str
  returned: always
  sample: 580.159.04
problems:
  description: Each problem found, with gpu (index or null), field, value, limit, message and the line the gate prints.
  type: list
  elements: dict
  returned: always
  sample:
    - {gpu: 3, field: memory.used, value: 81234 MiB, limit: "<= 1024 MiB", message: GPU memory is in use by something else,
       line: "GPU 3 memory.used = 81234 MiB (limit: <= 1024 MiB): GPU memory is in use by something else"}
"""

import contextlib
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.eagle3.pipeline.plugins.module_utils.preflight import Problem

GPU_FIELDS = (
    "index",
    "uuid",
    "name",
    "driver_version",
    "memory.used",
    "memory.total",
    "utilization.gpu",
    "ecc.errors.uncorrected.volatile.total",
    "retired_pages.pending",
    "remapped_rows.pending",
    "remapped_rows.failure",
    "persistence_mode",
    "compute_mode",
    "pstate",
    "temperature.gpu",
    "clocks_throttle_reasons.active",
    "mig.mode.current",
)
APP_FIELDS = ("pid", "process_name", "gpu_uuid", "used_memory")
INT_FIELDS = {
    "index",
    "memory.used",
    "memory.total",
    "utilization.gpu",
    "ecc.errors.uncorrected.volatile.total",
    "temperature.gpu",
    "pid",
    "used_memory",
}
# What nvidia-smi prints where it has no value for a field.
MISSING = {"[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", "[Insufficient Permissions]", ""}


@dataclass
class Answer:
    rc: int | None
    stdout: str
    timed_out: bool


def parse_value(field: str, raw: str) -> Any:
    """One CSV cell as Python: int for counters, None where nvidia-smi has no value."""
    raw = raw.strip()
    if raw in MISSING:
        return None
    if field in INT_FIELDS:
        try:
            return int(raw)
        except ValueError:
            return None
    return raw


def parse_rows(text: str, fields: tuple[str, ...]) -> tuple[list[dict[str, Any]], list[str]]:
    """Parse ``--format=csv,noheader,nounits`` output; return (rows, lines that did not parse)."""
    rows: list[dict[str, Any]] = []
    bad: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = line.split(", ")
        if len(cells) != len(fields):
            bad.append(line)
            continue
        raw = dict(zip(fields, (c.strip() for c in cells), strict=False))
        row = {field: parse_value(field, value) for field, value in raw.items()}
        row["raw"] = raw
        rows.append(row)
    return rows, bad


def run_nvidia_smi(path: str, args: list[str], timeout: int) -> Answer:
    """Run nvidia-smi in its own process group; kill the group if it does not answer in time."""
    proc = subprocess.Popen(
        [path, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        # A process stuck in the driver may not die; do not hang the play on it.
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=5)
        return Answer(None, "", True)
    return Answer(proc.returncode, stdout, False)


def shown(value: Any, raw: str, unit: str = "") -> str:
    return raw if value is None else f"{value}{unit}"


def check_gpu(gpu: dict[str, Any], limits: dict[str, Any]) -> list[Problem]:
    """Every problem with one GPU's readings."""
    idx = gpu["index"]
    raw = gpu["raw"]
    found: list[Problem] = []

    used = gpu["memory.used"]
    own = gpu.get("allowed_memory_mib", 0)
    if used is not None and own:
        used = max(0, used - own)
    limit = f"<= {limits['max_memory_used_mib']} MiB" + (
        f" besides {own} MiB of the run's own processes" if own else ""
    )
    if used is None:
        found.append(
            Problem(
                idx, "memory.used", raw["memory.used"], limit, "memory use unreadable; cannot confirm the GPU is free"
            )
        )
    elif used > limits["max_memory_used_mib"]:
        found.append(Problem(idx, "memory.used", f"{used} MiB", limit, "GPU memory is in use by something else"))

    ecc = gpu["ecc.errors.uncorrected.volatile.total"]
    if ecc is not None and ecc > limits["max_uncorrected_ecc"]:
        found.append(
            Problem(
                idx,
                "ecc.errors.uncorrected.volatile.total",
                str(ecc),
                f"<= {limits['max_uncorrected_ecc']}",
                "uncorrected ECC errors since the last driver load; drain the GPU and reset it",
            )
        )
    for field, why in (
        ("retired_pages.pending", "retired pages pending; the GPU needs a reset"),
        ("remapped_rows.pending", "remapped rows pending; the GPU needs a reset"),
        ("remapped_rows.failure", "row remapping failed; the GPU needs service"),
    ):
        if gpu[field] == "Yes":
            found.append(Problem(idx, field, "Yes", "No", why))

    mode = gpu["compute_mode"]
    if mode is None:
        found.append(Problem(idx, "compute_mode", raw["compute_mode"], "readable", "compute mode unreadable"))
    elif mode in limits["forbidden_compute_modes"]:
        found.append(
            Problem(
                idx,
                "compute_mode",
                mode,
                f"not in {limits['forbidden_compute_modes']}",
                "no process may create a CUDA context on this GPU",
            )
        )

    want_mig = limits["expected_mig_mode"]
    mig = gpu["mig.mode.current"] or "Disabled"  # [N/A]: the GPU has no MIG support
    if want_mig and mig != want_mig:
        found.append(Problem(idx, "mig.mode.current", mig, want_mig, "MIG mode differs from what the run expects"))
    return found


def check(
    gpus: list[dict[str, Any]],
    apps: list[dict[str, Any]],
    limits: dict[str, Any],
) -> list[Problem]:
    """Every problem across all GPUs of one host: count, per-GPU health, compute processes."""
    found: list[Problem] = []
    expected = limits["expected_gpus"]
    if expected < 0 and not gpus:
        found.append(Problem(None, "gpu_count", "0", ">= 1", "nvidia-smi lists no GPU"))
    elif expected >= 0 and len(gpus) != expected:
        indices = ",".join(str(g["index"]) for g in gpus) or "none"
        found.append(Problem(None, "gpu_count", str(len(gpus)), f"== {expected}", f"visible GPU indices: {indices}"))
    allowed = set(limits.get("allowed_pids") or [])
    own_memory: dict[Any, int] = {}
    for app in apps:
        if app["pid"] in allowed:
            own_memory[app["gpu_index"]] = own_memory.get(app["gpu_index"], 0) + (app["used_memory"] or 0)
    for gpu in gpus:
        found.extend(check_gpu({**gpu, "allowed_memory_mib": own_memory.get(gpu["index"], 0)}, limits))
    if not limits["allow_compute_processes"]:
        for app in (a for a in apps if a["pid"] not in allowed):
            found.append(
                Problem(
                    app["gpu_index"],
                    "compute_process",
                    f"pid {app['pid']} ({app['process_name']}, {shown(app['used_memory'], app['raw']['used_memory'], ' MiB')})",
                    "none",
                    "a compute process holds this GPU; stop it first",
                )
            )
    return found


def public(row: dict[str, Any]) -> dict[str, Any]:
    """A reading with Ansible-friendly keys (dots become underscores)."""
    return {key.replace(".", "_"): value for key, value in row.items()}


def read_host(params: dict[str, Any]) -> dict[str, Any]:
    """All readings and problems for this host (the module's result, minus ``changed``)."""
    result: dict[str, Any] = {"gpus": [], "compute_processes": [], "driver_version": None, "nvidia_smi": None}
    if params["expected_gpus"] == 0:
        result["problems"] = []
        result["skipped_reason"] = "CPU-only mode (expected_gpus: 0): nvidia-smi not run"
        return result

    path = shutil.which(params["nvidia_smi_path"])
    if path is None:
        problem = Problem(
            None,
            "nvidia-smi",
            params["nvidia_smi_path"],
            "installed",
            "nvidia-smi not found; is the NVIDIA driver installed?",
        )
        result["problems"] = [problem.record()]
        return result

    timeout = params["timeout"]
    fmt = "--format=csv,noheader,nounits"
    answer = run_nvidia_smi(path, [f"--query-gpu={','.join(GPU_FIELDS)}", fmt], timeout)
    result["nvidia_smi"] = {"path": path, "rc": answer.rc}
    problems: list[Problem] = []
    if answer.timed_out:
        problems.append(
            Problem(None, "driver", "no answer", f"{timeout} s", "nvidia-smi did not answer; the driver may be hung")
        )
    elif answer.rc != 0:
        first = next((ln.strip() for ln in answer.stdout.splitlines() if ln.strip()), "no output")
        problems.append(Problem(None, "driver", f"exit {answer.rc}", "exit 0", f"nvidia-smi failed: {first}"))
    if problems:
        result["problems"] = [p.record() for p in problems]
        return result

    gpus, bad = parse_rows(answer.stdout, GPU_FIELDS)
    problems += [Problem(None, "nvidia-smi", line, f"{len(GPU_FIELDS)} fields", "unparseable line") for line in bad]

    apps_answer = run_nvidia_smi(path, [f"--query-compute-apps={','.join(APP_FIELDS)}", fmt], timeout)
    apps, bad_apps = parse_rows(apps_answer.stdout, APP_FIELDS) if apps_answer.rc == 0 else ([], [])
    if apps_answer.timed_out or apps_answer.rc != 0:
        problems.append(
            Problem(
                None,
                "compute_apps",
                "no answer" if apps_answer.timed_out else f"exit {apps_answer.rc}",
                "exit 0",
                "cannot list compute processes",
            )
        )
    problems += [
        Problem(None, "compute_apps", line, f"{len(APP_FIELDS)} fields", "unparseable line") for line in bad_apps
    ]
    by_uuid = {gpu["uuid"]: gpu["index"] for gpu in gpus}
    for app in apps:
        app["gpu_index"] = by_uuid.get(app["gpu_uuid"])

    problems += check(gpus, apps, params)
    drivers = sorted({g["driver_version"] for g in gpus if g["driver_version"]})
    result.update(
        gpus=[public(g) for g in gpus],
        compute_processes=[public(a) for a in apps],
        driver_version=drivers[0] if len(drivers) == 1 else (drivers or None),
        problems=[p.record() for p in problems],
    )
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "expected_gpus": {"type": "int", "default": -1},
            "max_memory_used_mib": {"type": "int", "default": 1024},
            "allow_compute_processes": {"type": "bool", "default": False},
            "allowed_pids": {"type": "list", "elements": "int", "default": []},
            "max_uncorrected_ecc": {"type": "int", "default": 0},
            "forbidden_compute_modes": {"type": "list", "elements": "str", "default": ["Prohibited"]},
            "expected_mig_mode": {"type": "str", "default": "Disabled"},
            "nvidia_smi_path": {"type": "str", "default": "nvidia-smi"},
            "timeout": {"type": "int", "default": 30},
        },
        supports_check_mode=True,
    )
    module.exit_json(changed=False, **read_host(module.params))


if __name__ == "__main__":
    main()
