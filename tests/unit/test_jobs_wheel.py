"""The jobs wheel the eagle3 role installs on the hosts (plugins/action/eagle3_jobs_wheel.py): built
from the collection's jobs/ alone, byte for byte the same for the same source (a rerun copies and
reinstalls nothing), and a new wheel when a job changes."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT, load_module

action = load_module(ROOT / "plugins/action/eagle3_jobs_wheel.py")


def test_the_same_source_builds_the_same_bytes_and_a_changed_job_a_new_wheel(tmp_path: Path) -> None:
    first = action.build(ROOT, tmp_path / "a")
    again = action.build(ROOT, tmp_path / "a")
    elsewhere = action.build(ROOT, tmp_path / "b")
    assert first["changed"] and not again["changed"]
    assert first["sha256"] == again["sha256"] == elsewhere["sha256"]
    with zipfile.ZipFile(first["path"]) as wheel:
        names = wheel.namelist()
    assert "jobs/stage.py" in names and "jobs/versions.py" in names
    assert not [n for n in names if n.endswith(".pyc") or n.startswith(("tests/", "roles/", "plugins/"))], names

    source = tmp_path / "source"
    shutil.copytree(ROOT / "jobs", source / "jobs", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "pyproject.toml", source / "pyproject.toml")
    (source / "jobs" / "stage.py").write_text((source / "jobs" / "stage.py").read_text() + "\n# changed\n")
    changed = action.build(source, tmp_path / "a")
    assert changed["changed"] and changed["sha256"] != first["sha256"]


def test_a_directory_without_the_jobs_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"has no pyproject\.toml, jobs"):
        action.build(tmp_path, tmp_path / "out")
