"""Disk, model-file and port checks of the pre-flight gate, on this machine's real file systems and sockets."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from tests.conftest import ROOT, load_module

host_module = load_module(ROOT / "plugins/modules/gpu_preflight_host.py")


def check(**params: object) -> dict:
    return host_module.read_host({"paths": [], "model_path": "", "ports": [], **params})


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
