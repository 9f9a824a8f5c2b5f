"""jobs.hidden_state_files on files laid out as vLLM's hidden-states connector writes them
(tests/jobs/test_generate.py kills a real generation against a real server)."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from jobs import hidden_state_files as hsf


def write(path: Path, size: int) -> Path:
    path.write_bytes(b"x" * size)
    Path(f"{path}.lock").touch()
    return path


def test_orphans_of_this_generator_are_removed_and_nothing_else(tmp_path: Path) -> None:
    states, out = tmp_path / "states", tmp_path / "gen"
    states.mkdir()
    out.mkdir()
    mine, other = hsf.request_prefix(out, 0), hsf.request_prefix(out, 1)
    assert mine != other and mine == hsf.request_prefix(out, 0)
    recorded = write(states / f"chatcmpl-{mine}aaaa.safetensors", 10)
    orphan = write(states / f"chatcmpl-{mine}bbbb.safetensors", 300)
    writing = write(states / f"chatcmpl-{mine}cccc.safetensors", 7)
    another_rank = write(states / f"chatcmpl-{other}dddd.safetensors", 5)
    foreign = write(states / "chatcmpl-someone-else.safetensors", 5)
    stray_lock = states / f"chatcmpl-{mine}eeee.safetensors.lock"
    stray_lock.touch()
    (out / "rows-0.jsonl").write_text(json.dumps({"id": "q", "hidden_states_path": str(recorded)}) + "\n{partial")
    held = os.open(f"{writing}.lock", os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)  # the server is still writing this one
    try:
        found = hsf.remove_orphans(states, [out], mine)
    finally:
        os.close(held)
    # The orphan; locks: its own, the stray one, and the recorded row's (its writer is done).
    assert (found.files, found.bytes, found.locks) == (1, 300, 3)
    assert not orphan.exists() and not Path(f"{orphan}.lock").exists() and not stray_lock.exists()
    assert recorded.exists() and not Path(f"{recorded}.lock").exists()
    assert writing.exists() and Path(f"{writing}.lock").exists()
    assert all(p.exists() and Path(f"{p}.lock").exists() for p in (another_rank, foreign))


def test_a_lock_is_released_once_its_writer_lets_go(tmp_path: Path) -> None:
    path = write(tmp_path / "r.safetensors", 1)
    held = os.open(f"{path}.lock", os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)
    assert hsf.release_lock(path, wait=0.2) is False and Path(f"{path}.lock").exists()
    os.close(held)
    assert hsf.release_lock(path, wait=0.2) is True and not Path(f"{path}.lock").exists()
    assert hsf.release_lock(path) is True  # already gone


def test_a_file_is_written_only_once_it_exists_and_its_lock_is_free(tmp_path: Path) -> None:
    # vLLM answers before it writes: neither the file nor its lock may exist yet.
    path = tmp_path / "r.safetensors"
    assert hsf.wait_written(path, wait=0.1) is False
    assert hsf.release_lock(path, wait=0.1) is False
    path.write_bytes(b"x")
    held = os.open(Path(f"{path}.lock"), os.O_CREAT | os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)  # being written
    assert hsf.wait_written(path, wait=0.1) is False
    os.close(held)
    assert hsf.wait_written(path, wait=0.1) is True and Path(f"{path}.lock").exists()
