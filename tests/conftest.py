"""Shared test helpers: where things are, and loading the role's modules as plain Python."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
NVIDIA_SMI_FIXTURES = FIXTURES / "nvidia-smi"
FAKE_NVIDIA_SMI = ROOT / "tests" / "fake_nvidia_smi.py"
# The checkout as the collection eagle3.pipeline (ansible.cfg's collections_path, a link to ROOT).
COLLECTIONS = ROOT / "collections"


def install_collection_loader() -> None:
    """Let this process import ``ansible_collections.eagle3.pipeline`` (what the modules import their
    shared code from) and resolve its plugins by FQCN, as ansible-playbook does from the checkout."""
    from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder

    if not any(type(f).__name__ == "_AnsibleCollectionFinder" for f in sys.meta_path):
        _AnsibleCollectionFinder(paths=[str(COLLECTIONS)], scan_sys_paths=False)._install()


def load_module(path: Path) -> ModuleType:
    """Import a plugin file (plugins/modules/*.py, plugins/filter/*.py) so its functions can be tested."""
    install_collection_loader()
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under tests/jobs/ is slow (real vLLM servers, CPU training): `pytest -m 'not slow'`
    runs the fast tier alone."""
    jobs = ROOT / "tests" / "jobs"
    for item in items:
        if jobs in item.path.parents:
            item.add_marker(pytest.mark.slow)
