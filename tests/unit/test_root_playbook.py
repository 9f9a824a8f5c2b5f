"""``ansible-playbook train.yml -i inventory/<site>`` from the repository root, as users type it, and
records that default to the directory it was started from (not to a path beside the playbook)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))


def test_train_yml_at_the_root_lists_the_pipeline() -> None:
    run = subprocess.run(
        [ANSIBLE_PLAYBOOK, "train.yml", "-i", "inventory/tiny", "--list-tasks"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    for play in ("Check the inventory", "Plan the run"):
        assert play in run.stdout, run.stdout


def test_record_dirs_default_to_the_current_directory(tmp_path: Path) -> None:
    playbook = tmp_path / "show.yml"
    defaults = {name: ROOT / "roles" / name / "defaults" / "main.yml" for name in ("eagle3", "gpu_preflight")}
    playbook.write_text(
        json.dumps(
            [
                {
                    "hosts": "localhost", "gather_facts": False,
                    "tasks": [
                        {"ansible.builtin.include_vars": {"file": str(path), "name": f"d_{name}"}}
                        for name, path in defaults.items()
                    ] + [
                        {"ansible.builtin.debug": {
                            "msg": "DIRS {{ [d_eagle3.eagle3_record_dir, d_gpu_preflight.gpu_preflight_record_dir] }}"
                        }}
                    ],
                }
            ]
        )
    )  # fmt: skip
    cwd = tmp_path / "site"
    cwd.mkdir()
    # A wrapper that changes directory without updating PWD: the records still follow the real one.
    env = os.environ | {"PWD": str(tmp_path / "stale"), "ANSIBLE_NOCOLOR": "1"}
    env["ANSIBLE_COLLECTIONS_PATH"] = str(ROOT / "collections")  # eagle3.pipeline.cwd, from the checkout
    run = subprocess.run(
        [ANSIBLE_PLAYBOOK, str(playbook), "-i", "localhost,", "-c", "local"],
        cwd=cwd, capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"DIRS ['{cwd}/runs/latest', '{cwd}/runs/latest/preflight']" in run.stdout, run.stdout
