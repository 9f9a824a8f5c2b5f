"""Every plugin the collection ships is documented for ansible-doc: each filter (plugins/filter/<name>.yml)
with its own arguments as options, each module with a sample for every value it returns."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import COLLECTIONS, ROOT, load_module

FILTER_FILES = sorted((ROOT / "plugins/filter").glob("*.py"))
FILTERS = [
    (path, name, func) for path in FILTER_FILES for name, func in load_module(path).FilterModule().filters().items()
]


@pytest.mark.parametrize(("path", "name", "func"), FILTERS, ids=[name for _, name, _ in FILTERS])
def test_the_filter_has_docs_naming_its_arguments(path: Path, name: str, func: object) -> None:
    docs_file = path.parent / f"{name}.yml"
    assert docs_file.exists(), f"{name} (in {path.name}) has no {docs_file.name}"
    docs = yaml.safe_load(docs_file.read_text())
    doc = docs["DOCUMENTATION"]
    assert doc["name"] == name
    assert doc["short_description"] and docs["EXAMPLES"] and f"eagle3.pipeline.{name}" in docs["EXAMPLES"]
    assert docs["RETURN"]["_value"]["sample"] is not None
    params = list(inspect.signature(func).parameters)  # type: ignore[arg-type]
    assert ["_input", *params[1:]] == list(doc["options"]), f"{name}: documented {list(doc['options'])}, takes {params}"


def ansible_doc(*args: str) -> dict[str, object]:
    out = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-doc")), *args, "--json"],
        capture_output=True, text=True, check=True, cwd=ROOT,
        env={**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS)},
    )  # fmt: skip
    return json.loads(out.stdout)


def test_ansible_doc_lists_every_filter() -> None:
    listed = ansible_doc("-t", "filter", "-l", "eagle3.pipeline")
    assert sorted(listed) == sorted(f"eagle3.pipeline.{name}" for _, name, _ in FILTERS)
    assert all(listed.values()), listed  # each with its short description


MODULES = sorted(p.stem for p in (ROOT / "plugins/modules").glob("*.py"))


def test_every_module_returns_values_with_samples() -> None:
    docs = ansible_doc("-t", "module", *(f"eagle3.pipeline.{m}" for m in MODULES))
    assert sorted(docs) == [f"eagle3.pipeline.{m}" for m in MODULES]
    for name, doc in docs.items():
        returns = doc["return"]  # type: ignore[index]
        assert returns, f"{name} documents no return values"
        assert [k for k, v in returns.items() if "sample" not in v] == [], name
