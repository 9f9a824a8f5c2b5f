"""Install the collections requirements.yml names without a Galaxy server.

The Ansible community package (``ansible`` on PyPI) bundles community.general and the other
community collections. This takes each collection that ``requirements.yml`` names out of that
package's wheel, the version ``pyproject.toml``'s ``collections`` extra pins, into the project's
``collections/`` (``ansible.cfg``'s ``collections_path``), and checks that the bundled version is
in the range ``requirements.yml`` asks for. Where galaxy.ansible.com answers,
``ansible-galaxy collection install -r requirements.yml`` does the same job.

    python scripts/install_collections.py              # what scripts/bootstrap.sh runs
    python scripts/install_collections.py --wheel ansible-12.3.0-py3-none-any.whl
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOG = logging.getLogger("install_collections")


def community_pin(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """``ansible==X``: the community package pyproject's ``collections`` extra pins."""
    extra = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]["collections"]
    return next(r for r in extra if r.startswith("ansible=="))


def required(requirements: Path = ROOT / "requirements.yml") -> dict[str, str]:
    """Each collection requirements.yml names, with its version range (``*`` when none)."""
    return {c["name"]: str(c.get("version", "*")) for c in yaml.safe_load(requirements.read_text())["collections"]}


def in_range(version: str, wanted: str) -> bool:
    return wanted == "*" or Version(version) in SpecifierSet(wanted.replace(" ", ""))


def manifest_version(manifest: bytes | str) -> str:
    """The version a collection's ``MANIFEST.json`` names."""
    return json.loads(manifest)["collection_info"]["version"]


def installed_version(path: Path) -> str | None:
    manifest = path / "MANIFEST.json"
    return manifest_version(manifest.read_text()) if manifest.exists() else None


def download(pin: str, into: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", pin, "-d", str(into)],
        check=True,
    )
    return next(into.glob("ansible-*.whl"))


def install(wheel: Path, wanted: dict[str, str], collections: Path) -> dict[str, str]:
    """Extract each wanted collection from the community wheel into ``collections``."""
    versions = {}
    with zipfile.ZipFile(wheel) as z:
        for name, version_range in wanted.items():
            namespace, collection = name.split(".")
            prefix = f"ansible_collections/{namespace}/{collection}/"
            members = [m for m in z.namelist() if m.startswith(prefix)]
            if not members:
                raise SystemExit(f"{wheel.name} does not bundle {name}: install it with ansible-galaxy instead")
            version = manifest_version(z.read(prefix + "MANIFEST.json"))
            if not in_range(version, version_range):
                raise SystemExit(
                    f"{wheel.name} bundles {name} {version}, requirements.yml asks for {version_range}: "
                    "change pyproject.toml's collections pin"
                )
            target = collections / "ansible_collections" / namespace / collection
            shutil.rmtree(target, ignore_errors=True)
            for member in members:
                z.extract(member, collections)
            versions[name] = version
            LOG.info("%s %s from %s into %s", name, version, wheel.name, target)
    return versions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--collections", type=Path, default=ROOT / "collections", help="default: the project's")
    parser.add_argument("--wheel", type=Path, help="the community package's wheel (default: downloaded from the index)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    wanted, pin = required(), community_pin()
    stamp = args.collections / "ansible_collections" / f".{pin}"
    have = {n: installed_version(args.collections / "ansible_collections" / Path(*n.split("."))) for n in wanted}
    if stamp.exists() and all(v and in_range(v, wanted[n]) for n, v in have.items()):
        LOG.info("already installed from %s: %s", pin, have)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        versions = install(args.wheel or download(pin, Path(tmp)), wanted, args.collections)
    for old in stamp.parent.glob(".ansible==*"):
        old.unlink()
    stamp.write_text(json.dumps(versions) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
