"""Disk, model-file and port checks of the pre-flight gate, on this machine's real file systems and sockets."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from tests.conftest import ROOT, load_module

host_module = load_module(ROOT / "plugins/modules/gpu_preflight_host.py")


def check(**params: object) -> dict:
    return host_module.read_host({"paths": [], "model_path": "", "ports": [], "platform": False, **params})


def test_output_path_not_yet_made_is_measured_at_its_parent(tmp_path: Path) -> None:
    result = check(paths=[{"path": str(tmp_path / "runs/a/b"), "min_free_gib": 0, "label": "output"}])
    (disk,) = result["paths"]
    assert disk["measured_at"] == str(tmp_path)
    assert disk["free_gib"] > 0
    assert result["problems"] == []


def test_too_little_disk_is_a_problem(tmp_path: Path) -> None:
    result = check(paths=[{"path": str(tmp_path), "min_free_gib": 10**9, "label": "output"}])
    (problem,) = result["problems"]
    assert problem["field"] == "disk_free[output]"
    assert problem["limit"] == ">= 1e+09 GiB"


def make_model(path: Path, shards: list[str], present: list[str]) -> None:
    path.mkdir()
    (path / "config.json").write_text("{}")
    index = {"weight_map": {f"w{i}": shard for i, shard in enumerate(shards)}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    for shard in present:
        (path / shard).write_bytes(b"x")


def test_complete_model_passes(tmp_path: Path) -> None:
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    make_model(tmp_path / "m", shards, shards)
    result = check(model_path=str(tmp_path / "m"))
    assert result["problems"] == []
    assert result["model"]["weight_files"] == 2


def test_missing_shard_is_named(tmp_path: Path) -> None:
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    make_model(tmp_path / "m", shards, shards[:1])
    (problem,) = check(model_path=str(tmp_path / "m"))["problems"]
    assert problem["value"] == "1 shards missing (model-00002-of-00002.safetensors)"


def test_absent_model_path(tmp_path: Path) -> None:
    (problem,) = check(model_path=str(tmp_path / "nope"))["problems"]
    assert (problem["field"], problem["message"]) == ("model_path", "model directory not found")


def test_taken_port_names_the_listening_process() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = check(ports=[port])
    (problem,) = result["problems"]
    assert problem["field"] == f"port[{port}]"
    assert f"pid {os.getpid()}" in problem["value"]
    assert result["ports"][0]["in_use"] is True


def test_free_port_passes() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening, then closed
    result = check(ports=[port])
    assert result["problems"] == []
    assert result["ports"] == [{"port": port, "in_use": False, "owners": []}]


def release_and_init(tmp_path: Path, release: str, init: str) -> tuple[Path, Path]:
    (tmp_path / "os-release").write_text(release)
    (tmp_path / "comm").write_text(init + "\n")
    return tmp_path / "os-release", tmp_path / "comm"


def test_debian_bookworm_with_systemd_is_the_tested_platform(tmp_path: Path) -> None:
    release = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\nVERSION_CODENAME=bookworm\n'
    reading, problems = host_module.read_platform(*release_and_init(tmp_path, release, "systemd"))
    assert problems == []
    assert reading["tested"] and reading["codename"] == "bookworm" and reading["init"] == "systemd"


def test_ubuntu_passes_untested(tmp_path: Path) -> None:
    release = (
        'PRETTY_NAME="Ubuntu 24.04.1 LTS"\nID=ubuntu\nID_LIKE=debian\nVERSION_ID="24.04"\nVERSION_CODENAME=noble\n'
    )
    reading, problems = host_module.read_platform(*release_and_init(tmp_path, release, "systemd"))
    assert problems == [] and not reading["tested"]


def test_a_host_without_systemd_or_apt_is_a_problem(tmp_path: Path) -> None:
    release = 'PRETTY_NAME="Rocky Linux 9.4"\nID="rocky"\nID_LIKE="rhel centos fedora"\nVERSION_ID="9.4"\n'
    _, problems = host_module.read_platform(*release_and_init(tmp_path, release, "tini"))
    lines = [p.record()["line"] for p in problems]
    assert lines == [
        "init = tini (limit: systemd): the vLLM server runs as a systemd unit: the host must boot systemd",
        "os = Rocky Linux 9.4 (limit: Debian family): the roles install packages with apt",
    ]


def test_this_machine_reads_as_a_platform() -> None:
    """The real /etc/os-release and /proc/1/comm of the machine the tests run on are readable."""
    reading, _ = host_module.read_platform()
    assert reading["id"] != "unknown" and reading["init"] != "unknown"
