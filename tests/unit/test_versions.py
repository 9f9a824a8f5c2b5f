"""jobs.versions reports which jobs wheel its Python has: roles/eagle3/tasks/jobs.yml reinstalls
the jobs when that checksum is not the one of the wheel the run built."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def versions_in(path: Path) -> dict:
    """``python -m jobs.versions`` with ``path`` first on sys.path (where a venv's site-packages is)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(path), str(ROOT)])}
    out = subprocess.run(
        [sys.executable, "-m", "jobs.versions"], env=env, cwd=path, capture_output=True, text=True, check=False
    )
    assert out.returncode in (0, 3), out.stderr
    return json.loads(out.stdout)


def dist_info(site: Path, direct_url: dict | None) -> None:
    info = site / "eagle3_pipeline-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: eagle3-pipeline\nVersion: 0.1.0\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))


def test_a_wheel_installed_by_pip_with_its_checksum_reports_it(tmp_path: Path) -> None:
    sha = "ab" * 32
    url = "file:///opt/eagle3/eagle3_pipeline-0.1.0-py3-none-any.whl"
    dist_info(tmp_path, {"url": url, "archive_info": {"hash": f"sha256={sha}", "hashes": {"sha256": sha}}})
    assert versions_in(tmp_path)["jobs"] == {"version": "0.1.0", "sha256": sha, "url": url}


def test_jobs_installed_without_a_checksum_report_none(tmp_path: Path) -> None:
    """An editable install (a checkout) or a wheel installed without a checksum: jobs.yml reinstalls."""
    dist_info(tmp_path, None)
    assert versions_in(tmp_path)["jobs"] == {"version": "0.1.0", "sha256": None, "url": None}
