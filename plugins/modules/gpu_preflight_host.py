#!/usr/bin/python
"""Check a host's platform, disk space, model files and serving ports before a run."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_preflight_host
short_description: Read the platform, free disk, model files and listening ports; list what would break a run
description:
  - Checks the platform the roles need, systemd as the init process (the server is a systemd unit)
    and a Debian-family system (packages come from apt), read from C(/proc/1/comm) and
    C(/etc/os-release). A platform the collection is not tested on (anything but Debian 12
    bookworm) is a warning, not a problem.
  - For each path, reads free space on the file system that holds it (the nearest existing
    parent when the path does not exist yet, as for an output directory a run will create).
  - Checks the model directory has C(config.json) and its weights, including every shard a
    C(*.safetensors.index.json) names (a half-finished download fails here, not 20 minutes into a load).
  - Reads listening TCP sockets from C(/proc/net/tcp{,6}) and names the process holding a port.
  - Never changes the host; supports check mode. Problems are returned, not raised.
options:
  paths:
    description: Paths that need free space, each C({path, min_free_gib, label}).
    type: list
    elements: dict
    default: []
  model_path:
    description: Model directory that must be present and complete; empty to skip.
    type: str
    default: ""
  ports:
    description: TCP ports that must be free.
    type: list
    elements: int
    default: []
  platform:
    description: Check the platform (init system and OS family).
    type: bool
    default: true
author: eagle3-pipeline
"""

EXAMPLES = r"""
- name: Check disk, model and ports
  gpu_preflight_host:
    paths:
      - {path: /data/runs, min_free_gib: 500, label: output}
    model_path: /models/Kimi-K2.5
    ports: [8000]
"""

RETURN = r"""
paths:
  description: Free space reading per path.
  type: list
  elements: dict
  returned: always
  sample: [{label: outputs, path: /var/lib/eagle3/runs, measured_at: /var/lib/eagle3, free_gib: 64, total_gib: 251, min_free_gib: 2.0}]
model:
  description: What was found at the model path.
  type: dict
  returned: always
  sample: {path: /srv/models/tiny, exists: true, config: true, weight_files: 1, missing_shards: []}
ports:
  description: Per port, whether something listens and which PIDs.
  type: list
  elements: dict
  returned: always
  sample: [{port: 8000, in_use: false, owners: []}]
platform:
  description: The host's OS (from /etc/os-release), its init process, and whether the collection is tested on that OS.
  type: dict
  returned: always
  sample: {id: debian, id_like: [], version_id: "12", codename: bookworm, pretty_name: Debian GNU/Linux 12 (bookworm), init: systemd, tested: true}
problems:
  description: Each problem found, with gpu (always null here), field, value, limit, message and the line the gate prints.
  type: list
  elements: dict
  returned: always
  sample: []
"""

import json
import os
from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.eagle3.pipeline.plugins.module_utils.preflight import Problem

GIB = 1024**3
LISTEN = "0A"
# What the test hosts run (tests/hosts/testhost.py) and roles' meta claim: (os-release ID, VERSION_CODENAME).
TESTED_PLATFORMS = {("debian", "bookworm")}


def os_release(path: Path) -> dict[str, str]:
    """/etc/os-release as a dict (KEY=value, values optionally quoted)."""
    fields = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.startswith("#"):
            fields[key.strip()] = value.strip().strip('"').strip("'")
    return fields


def read_platform(
    release_path: Path = Path("/etc/os-release"), init_path: Path = Path("/proc/1/comm")
) -> tuple[dict[str, Any], list[Problem]]:
    problems = []
    try:
        release = os_release(release_path)
    except OSError:
        release = {}
    try:
        init = init_path.read_text().strip()
    except OSError:
        init = "unknown"
    os_id, like = release.get("ID", "unknown"), release.get("ID_LIKE", "").split()
    reading = {
        "id": os_id,
        "id_like": like,
        "version_id": release.get("VERSION_ID", ""),
        "codename": release.get("VERSION_CODENAME", ""),
        "pretty_name": release.get("PRETTY_NAME", os_id),
        "init": init,
        "tested": (os_id, release.get("VERSION_CODENAME", "")) in TESTED_PLATFORMS,
    }
    if init != "systemd":
        problems.append(
            Problem(None, "init", init, "systemd", "the vLLM server runs as a systemd unit: the host must boot systemd")
        )
    if os_id != "debian" and "debian" not in like:
        problems.append(
            Problem(None, "os", reading["pretty_name"], "Debian family", "the roles install packages with apt")
        )
    return reading, problems


def existing_parent(path: Path) -> Path:
    """The path itself, or its nearest ancestor that exists."""
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


def read_disk(entry: dict[str, Any]) -> tuple[dict[str, Any], list[Problem]]:
    path = Path(entry["path"])
    where = existing_parent(path)
    stat = os.statvfs(where)
    free_gib = stat.f_bavail * stat.f_frsize / GIB
    reading = {
        "label": entry.get("label") or str(path),
        "path": str(path),
        "measured_at": str(where),
        # Whole GiB: enough for the gate, and a re-run with nothing changed records the same.
        "free_gib": int(free_gib),
        "total_gib": int(stat.f_blocks * stat.f_frsize / GIB),
        "min_free_gib": float(entry["min_free_gib"]),
    }
    problems = []
    if free_gib < float(entry["min_free_gib"]):
        problems.append(
            Problem(
                None,
                f"disk_free[{reading['label']}]",
                f"{free_gib:.1f} GiB free at {where}",
                f">= {float(entry['min_free_gib']):g} GiB",
                "not enough disk for this run's outputs; free space or point the path elsewhere",
            )
        )
    return reading, problems


def read_model(model_path: str) -> tuple[dict[str, Any], list[Problem]]:
    path = Path(model_path)
    reading: dict[str, Any] = {"path": model_path, "exists": path.is_dir()}
    if not path.is_dir():
        return reading, [Problem(None, "model_path", model_path, "a directory", "model directory not found")]
    problems = []
    weights = sorted(p.name for p in path.glob("*.safetensors"))
    missing: list[str] = []
    for index in path.glob("*.safetensors.index.json"):
        shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
        missing += sorted(shard for shard in shards if not (path / shard).is_file())
    reading.update(
        config=(path / "config.json").is_file(),
        weight_files=len(weights),
        missing_shards=missing,
    )
    if not reading["config"]:
        problems.append(
            Problem(None, "model_files", f"{model_path}/config.json absent", "present", "not a model directory")
        )
    if not weights:
        problems.append(Problem(None, "model_files", "0 *.safetensors", ">= 1", "model weights missing"))
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        problems.append(
            Problem(None, "model_files", f"{len(missing)} shards missing ({shown})", "0 missing", "incomplete download")
        )
    return reading, problems


def listening_inodes(port: int) -> set[str]:
    """Inodes of sockets listening on TCP ``port`` (any address, IPv4 or IPv6)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            local, state, inode = cols[1], cols[3], cols[9]
            if state == LISTEN and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(inode)
    return inodes


def socket_owners(inodes: set[str]) -> list[dict[str, Any]]:
    """Processes holding any of these socket inodes."""
    wanted = {f"socket:[{inode}]" for inode in inodes}
    owners = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fds = list((proc / "fd").iterdir())
            if any(os.readlink(fd) in wanted for fd in fds):
                owners.append({"pid": int(proc.name), "name": (proc / "comm").read_text().strip()})
        except OSError:
            continue  # the process ended, or is not ours to read
    return owners


def read_port(port: int) -> tuple[dict[str, Any], list[Problem]]:
    inodes = listening_inodes(port)
    owners = socket_owners(inodes) if inodes else []
    reading = {"port": port, "in_use": bool(inodes), "owners": owners}
    if not inodes:
        return reading, []
    who = ", ".join(f"pid {o['pid']} ({o['name']})" for o in owners) or "an unknown process"
    return reading, [Problem(None, f"port[{port}]", f"listening: {who}", "free", "the serving port is taken")]


def read_host(params: dict[str, Any]) -> dict[str, Any]:
    problems: list[Problem] = []
    platform: dict[str, Any] = {}
    if params.get("platform", True):
        platform, problems = read_platform()
    disks = []
    for entry in params["paths"]:
        reading, found = read_disk(entry)
        disks.append(reading)
        problems += found
    model: dict[str, Any] = {}
    if params["model_path"]:
        model, found = read_model(params["model_path"])
        problems += found
    ports = []
    for port in params["ports"]:
        reading, found = read_port(port)
        ports.append(reading)
        problems += found
    return {
        "platform": platform,
        "paths": disks,
        "model": model,
        "ports": ports,
        "problems": [p.record() for p in problems],
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "paths": {"type": "list", "elements": "dict", "default": []},
            "model_path": {"type": "str", "default": ""},
            "ports": {"type": "list", "elements": "int", "default": []},
            "platform": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    for entry in module.params["paths"]:
        if "path" not in entry or "min_free_gib" not in entry:
            module.fail_json(msg=f"each entry of paths needs path and min_free_gib, got {entry}")
    result = read_host(module.params)
    if result["platform"] and not result["platform"]["tested"]:
        tested = ", ".join(f"{os_id} {codename}" for os_id, codename in sorted(TESTED_PLATFORMS))
        module.warn(f"{result['platform']['pretty_name']} is untested: the collection is tested on {tested} only.")
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
