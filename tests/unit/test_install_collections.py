"""scripts/install_collections.py: requirements.yml's collections from the community package's wheel."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, load_module

install_collections = load_module(ROOT / "scripts" / "install_collections.py")


def wheel(path: Path, version: str) -> Path:
    """A stand-in for the community package's wheel: one bundled collection and one other."""
    with zipfile.ZipFile(path, "w") as z:
        manifest = {"collection_info": {"namespace": "community", "name": "general", "version": version}}
        z.writestr("ansible_collections/community/general/MANIFEST.json", json.dumps(manifest))
        z.writestr("ansible_collections/community/general/plugins/modules/archive.py", "# module\n")
        z.writestr("ansible_collections/community/docker/MANIFEST.json", "{}")
    return path


def test_requirements_and_galaxy_dependencies_ask_for_the_same_range() -> None:
    galaxy = yaml.safe_load((ROOT / "galaxy.yml").read_text())
    assert install_collections.required() == galaxy["dependencies"]


def test_extracts_only_the_collections_asked_for(tmp_path: Path) -> None:
    target = tmp_path / "collections"
    stale = target / "ansible_collections" / "community" / "general" / "stale.py"
    stale.parent.mkdir(parents=True)
    stale.write_text("")
    versions = install_collections.install(
        wheel(tmp_path / "a.whl", "11.4.2"), {"community.general": ">=11.4.0,<12.0.0"}, target
    )
    assert versions == {"community.general": "11.4.2"}
    general = target / "ansible_collections" / "community" / "general"
    assert (general / "plugins" / "modules" / "archive.py").exists() and not stale.exists()
    assert install_collections.installed_version(general) == "11.4.2"
    assert not (target / "ansible_collections" / "community" / "docker").exists()


def test_refuses_a_bundled_version_out_of_range(tmp_path: Path) -> None:
    with pytest.raises(
        SystemExit, match=r"bundles community.general 12.0.0, requirements.yml asks for >=11.4.0,<12.0.0"
    ):
        install_collections.install(
            wheel(tmp_path / "a.whl", "12.0.0"), {"community.general": ">=11.4.0,<12.0.0"}, tmp_path / "c"
        )


def test_the_project_has_what_requirements_yml_asks_for() -> None:
    # scripts/bootstrap.sh ran it: the lint and the molecule scenarios need the collection there.
    for name, wanted in install_collections.required().items():
        version = install_collections.installed_version(
            ROOT / "collections" / "ansible_collections" / Path(*name.split("."))
        )
        assert version and install_collections.in_range(version, wanted), (name, version, wanted)
