"""Build the jobs wheel on the controller (action plugin of eagle3.pipeline.eagle3_jobs_wheel)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

# 1980-01-01, the earliest date a zip file holds: every build of the same source has the same bytes.
SOURCE_DATE_EPOCH = "315532800"
SOURCES = ("pyproject.toml", "jobs")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(source: Path, dest: Path) -> dict[str, Any]:
    """Build the wheel of ``source``'s jobs/ and pyproject.toml into ``dest``; ``changed`` is false
    when ``dest`` already held a wheel of the same name and bytes. setuptools writes into the tree it
    builds, so it builds a copy (without bytecode caches)."""
    missing = [name for name in SOURCES if not (source / name).exists()]
    if missing:
        raise FileNotFoundError(f"{source} has no {', '.join(missing)}: it is not the eagle3.pipeline collection")
    with tempfile.TemporaryDirectory(prefix="eagle3-jobs-wheel-") as tmp:
        src, dist = Path(tmp) / "src", Path(tmp) / "dist"
        shutil.copytree(source / "jobs", src / "jobs", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        shutil.copy2(source / "pyproject.toml", src / "pyproject.toml")
        answer = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-index", "--no-build-isolation",
             "--wheel-dir", str(dist), str(src)],
            capture_output=True, text=True, check=False,
            env={**os.environ, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH},
        )  # fmt: skip
        wheels = sorted(dist.glob("*.whl"))
        if answer.returncode != 0 or len(wheels) != 1:
            raise RuntimeError(
                f"pip wheel {src} failed (exit {answer.returncode}): {(answer.stderr or answer.stdout).strip()[-2000:]}"
                " (the controller's Python needs pip and setuptools)"
            )
        built = wheels[0]
        target = dest / built.name
        digest = sha256(built)
        changed = not target.exists() or sha256(target) != digest
        if changed:
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(built, target)
    return {"changed": changed, "path": str(target), "name": target.name, "sha256": digest}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        args = self._task.args
        for key in ("source", "dest"):
            if not args.get(key):
                raise AnsibleActionFail(f"eagle3_jobs_wheel needs {key}")
        if self._task.check_mode:
            result["check_mode_note"] = "built anyway: a check run compares the hosts' jobs with this build"
        try:
            result.update(build(Path(args["source"]).expanduser(), Path(args["dest"]).expanduser()))
        except (OSError, RuntimeError) as err:
            raise AnsibleActionFail(str(err)) from err
        return result
