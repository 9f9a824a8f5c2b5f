#!/usr/bin/env python3
"""Real Debian test hosts: systemd-nspawn containers with systemd as PID 1, sshd, and their own network.

Each host boots from a debootstrap'ed Debian rootfs (built once, cached) with
``systemd-nspawn --boot --register=no --keep-unit``, inside its own network
namespace (``ip netns add`` + a veth pair), and is reached over SSH with a
generated key, like a real machine. Molecule's create/destroy playbooks and the
demo both use this one tool.

    python tests/hosts/testhost.py base            # build (or reuse) the cached rootfs
    python tests/hosts/testhost.py up NAME [NAME]  # boot hosts; prints their connection JSON
    python tests/hosts/testhost.py down NAME|--all # stop, and check nothing is left behind
    python tests/hosts/testhost.py list
    python tests/hosts/testhost.py wheelhouse REQ...  # offline wheels for the hosts (cached)
    python tests/hosts/testhost.py wheelhouse --inventory inventory/tiny  # ... for that inventory's pins
    python tests/hosts/testhost.py prefetch molecule/*/molecule.yml  # the rootfs and every wheelhouse

Needs root, debootstrap, systemd-container and iproute2 (scripts/bootstrap.sh installs them).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

LOG = logging.getLogger("testhost")
SUITE = "bookworm"
MIRROR = os.environ.get("TESTHOST_MIRROR", "http://deb.debian.org/debian")
PACKAGES = "systemd,systemd-sysv,dbus,openssh-server,python3,python3-venv,iproute2,sudo,ca-certificates,procps,libnuma1,curl,python3-packaging,python3-apt,g++,python3-dev"
CACHE = Path(os.environ.get("TESTHOST_CACHE", "/var/cache/eagle3-testhosts"))
STATE = Path(os.environ.get("TESTHOST_STATE", "/var/lib/eagle3-testhosts"))
SUBNET = "10.213"  # host N: controller side 10.213.N.1, host side 10.213.N.2 (/30)
BOOT_TIMEOUT_S = 120


def run(*cmd: str, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    LOG.debug("run %s", " ".join(cmd))
    return subprocess.run(cmd, check=check, text=True, capture_output=True, **kw)


@contextmanager
def locked() -> Iterator[None]:
    STATE.mkdir(parents=True, exist_ok=True)
    with open(STATE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def cached(path: Path, recipe: str, build: Callable[[Path], None]) -> Path:
    """``path``, built once by ``build(tmp)`` into a temporary directory and renamed into place,
    so an interrupted build is never taken for a finished one. A second process asking for the
    same path meanwhile (a prefetch beside molecule) waits for the first build."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (path / ".complete").exists():
            return path
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        LOG.info("building %s (cached for later runs)", path)
        build(tmp)
        (tmp / ".complete").write_text(recipe + "\n")
        shutil.rmtree(path, ignore_errors=True)
        tmp.rename(path)
        return path


def base_rootfs() -> Path:
    """The cached Debian rootfs, built with debootstrap on first use (about a minute)."""
    recipe = f"{SUITE}|{PACKAGES}|minbase|v1"

    def build(tmp: Path) -> None:
        for tool in ("debootstrap", "systemd-nspawn", "ip", "ssh-keygen"):
            if not shutil.which(tool):
                sys.exit(f"testhost: {tool} not found; run scripts/bootstrap.sh (installs Debian's packages)")
        run("debootstrap", "--variant=minbase", f"--include={PACKAGES}", SUITE, str(tmp), MIRROR)
        for key in (tmp / "etc/ssh").glob("ssh_host_*"):
            key.unlink()  # each host gets its own keys

    return cached(CACHE / f"{SUITE}-{hashlib.sha256(recipe.encode()).hexdigest()[:10]}", recipe, build)


def wheelhouse(requirements: list[str]) -> Path:
    """A directory of wheels for ``requirements`` and everything they need (cached), for hosts
    that install offline, as air-gapped clusters do."""
    recipe = "\n".join(sorted(requirements))

    def build(tmp: Path) -> None:
        run(sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "-d", str(tmp), *requirements)

    return cached(CACHE / f"wheelhouse-{hashlib.sha256(recipe.encode()).hexdigest()[:10]}", recipe, build)


def inventory_pins(inventory: Path) -> list[str]:
    """What an inventory's hosts install into vLLM's venv (``vllm_server_package``,
    ``vllm_server_extra_packages`` and, with the uv installer, ``vllm_server_uv_package``: its
    group_vars/all.yml over roles/vllm_server's defaults),
    rendered as Ansible renders them: the values read the collection's pins (the lookup
    eagle3.pipeline.pins, pyproject.toml's extras)."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import init_plugin_loader
    from ansible.template import Templar

    root = Path(__file__).resolve().parents[2]
    if not any(type(f).__name__ == "_AnsibleCollectionFinder" for f in sys.meta_path):
        init_plugin_loader([str(root / "collections")])  # the checkout as the collection eagle3.pipeline
    loader = DataLoader()
    settings = {
        **loader.load_from_file(str(root / "roles/vllm_server/defaults/main.yml"), trusted_as_template=True),
        **(loader.load_from_file(str(inventory / "group_vars" / "all.yml"), trusted_as_template=True) or {}),
    }
    templar = Templar(loader=loader, variables=settings)
    installer = templar.template(settings["vllm_server_installer"])
    return [
        templar.template(settings["vllm_server_package"]),
        *templar.template(settings["vllm_server_extra_packages"]),
        *([templar.template(settings["vllm_server_uv_package"])] if installer == "uv" else []),
    ]


def platform_wheelhouse(spec: str | list[str], root: Path) -> Path:
    """A platform's ``wheelhouse``: requirements, or an inventory directory (relative to ``root``)
    whose pins it installs."""
    return wheelhouse(inventory_pins(root / spec) if isinstance(spec, str) else spec)


def prefetch(scenarios: list[Path]) -> list[Path]:
    """Build the rootfs and every wheelhouse the molecule scenarios' platforms ask for, so that
    the downloads overlap other work instead of the scenarios' create steps."""
    import yaml

    built = [base_rootfs()]
    for scenario in scenarios:
        root = scenario.resolve().parents[2]  # molecule/<scenario>/molecule.yml of the project
        for platform in yaml.safe_load(scenario.read_text()).get("platforms", []):
            if platform.get("wheelhouse"):
                built.append(platform_wheelhouse(platform["wheelhouse"], root))
    return sorted(set(built))


def ssh_key() -> Path:
    key = STATE / "id_ed25519"
    if not key.exists():
        run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "eagle3-testhost", "-f", str(key))
    return key


def ssh(address: str, command: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return run(
        "ssh", "-i", str(ssh_key()), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
        "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=3", "-o", "BatchMode=yes", f"root@{address}", command,
        check=False, timeout=timeout,
    )  # fmt: skip


def hosts() -> dict[str, dict[str, Any]]:
    return {p.parent.name: json.loads(p.read_text()) for p in STATE.glob("*/host.json")}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def connection(info: dict[str, Any], created: bool) -> dict[str, Any]:
    return {
        "instance": info["name"],
        "address": info["address"],
        "user": "root",
        "port": 22,
        "identity_file": str(ssh_key()),
        "created": created,
    }


def up(name: str, bind_ro: list[str] = (), bind: list[str] = ()) -> dict[str, Any]:
    """Boot host NAME (or return the running one) and wait until systemd and sshd are up.

    ``bind_ro`` entries are ``SRC[:DST]`` directories of this machine shown read-only inside
    the host (a wheelhouse, a model); ``bind`` ones writable (created if missing): hosts given
    the same SRC share it, as they would an NFS run directory on a cluster.
    """
    with locked():
        known = hosts()
        if name in known and alive(known[name]["pid"]):
            return connection(known[name], created=False)
        if name in known:
            _down(name, known[name])
        used = {h["index"] for h in hosts().values()}
        index = next(i for i in range(1, 250) if i not in used)
        home = STATE / name
        rootfs = home / "rootfs"
        netns = f"e3h-{name}"[:32]
        veth = f"e3v{index}"
        address = f"{SUBNET}.{index}.2"
        info = {"name": name, "index": index, "address": address, "netns": netns, "veth": veth, "home": str(home)}

        if home.exists():  # left by a stop that could not remove everything at the time
            left = leftovers({"home": str(home), "netns": netns, "veth": veth})
            if left:
                sys.exit(f"testhost: {home} is still in use ({'; '.join(left)}); run `testhost.py down --all`")
            shutil.rmtree(home)
        home.mkdir(parents=True)
        for spec in bind:
            Path(spec.split(":")[0]).mkdir(parents=True, exist_ok=True)
        run("cp", "-a", "--reflink=auto", str(base_rootfs()), str(rootfs))
        run("ssh-keygen", "-A", "-f", str(rootfs))
        (rootfs / "etc/hostname").write_text(name + "\n")
        (rootfs / "etc/hosts").write_text(f"127.0.0.1 localhost\n{address} {name}\n")
        dot_ssh = rootfs / "root/.ssh"
        dot_ssh.mkdir(mode=0o700, exist_ok=True)
        shutil.copy(ssh_key().with_suffix(".pub"), dot_ssh / "authorized_keys")

        run("ip", "netns", "add", netns)
        run("ip", "link", "add", veth, "type", "veth", "peer", "name", "host0", "netns", netns)
        run("ip", "addr", "add", f"{SUBNET}.{index}.1/30", "dev", veth)
        run("ip", "link", "set", veth, "up")
        # Route between test hosts (multi-node training), through this veth only: the machine's
        # global forwarding setting is left alone and nothing is NATed to the outside.
        run("sysctl", "-q", "-w", f"net.ipv4.conf.{veth}.forwarding=1")
        run("ip", "-n", netns, "addr", "add", f"{address}/30", "dev", "host0")
        run("ip", "-n", netns, "link", "set", "host0", "up")
        run("ip", "-n", netns, "link", "set", "lo", "up")
        run("ip", "-n", netns, "route", "add", "default", "via", f"{SUBNET}.{index}.1")

        log = open(home / "console.log", "w")  # noqa: SIM115 - the container keeps writing to it
        proc = subprocess.Popen(
            [
                "systemd-nspawn", "--boot", "--register=no", "--keep-unit", f"--directory={rootfs}",
                f"--machine={name}", f"--network-namespace-path=/run/netns/{netns}", "--console=passive",
                *(f"--bind-ro={spec}" for spec in bind_ro), *(f"--bind={spec}" for spec in bind),
            ],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        info["pid"] = proc.pid
        (home / "host.json").write_text(json.dumps(info, indent=2) + "\n")

    deadline = time.monotonic() + BOOT_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"testhost: {name} exited during boot; see {home / 'console.log'}")
        try:
            state = ssh(address, "systemctl is-system-running --wait", timeout=60)
        except subprocess.TimeoutExpired:
            continue
        if state.stdout.strip() in ("running", "degraded"):
            LOG.info("%s up at %s (systemd %s)", name, address, state.stdout.strip())
            return connection(info, created=True)
        time.sleep(1)
    sys.exit(f"testhost: {name} did not answer SSH within {BOOT_TIMEOUT_S} s; see {home / 'console.log'}")


def _power_off(info: dict[str, Any]) -> None:
    """Ask one host's systemd to power off (nspawn passes SIGTERM on)."""
    if alive(info["pid"]):
        os.kill(info["pid"], signal.SIGTERM)


def _down(name: str, info: dict[str, Any]) -> list[str]:
    """Wait for one host to stop (``_power_off`` asked it) and remove everything it made; return
    what could not be removed."""
    pid = info["pid"]
    for _ in range(60):
        if not alive(pid):
            break
        time.sleep(0.5)
    else:
        os.killpg(pid, signal.SIGKILL)
        time.sleep(1)
    with suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    run("ip", "netns", "del", info["netns"], check=False)
    run("ip", "link", "del", info["veth"], check=False)
    home = Path(info["home"])
    left = leftovers(info)
    if not left:
        shutil.rmtree(home, ignore_errors=True)
    return left


def leftovers(info: dict[str, Any]) -> list[str]:
    """Processes, network namespaces, links and mounts a host left behind."""
    found = []
    home = info["home"]
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if os.readlink(proc / "root").startswith(home):
                    found.append(f"process {proc.name} rooted in {home}")
            except OSError:
                continue
    if (Path("/run/netns") / info["netns"]).exists():
        found.append(f"network namespace {info['netns']}")
    if run("ip", "link", "show", info["veth"], check=False).returncode == 0:
        found.append(f"link {info['veth']}")
    for line in Path("/proc/mounts").read_text().splitlines():
        if home in line.split()[1]:
            found.append(f"mount {line.split()[1]}")
    return found


def down(names: list[str]) -> int:
    with locked():
        known = hosts()
        failed = False
        for name in names:
            if name not in known:
                LOG.info("%s: not running", name)
        stopping = [name for name in names if name in known]
        for name in stopping:
            _power_off(known[name])
        # All at once: the hosts power off together, and their rootfs (8 GB with vLLM's venv)
        # are removed side by side (two 3.8 GB venvs: 9 s against 14.5 s one after the other here).
        with ThreadPoolExecutor(max_workers=max(1, len(stopping))) as pool:
            results = dict(zip(stopping, pool.map(lambda n: _down(n, known[n]), stopping), strict=True))
        for name, left in results.items():
            if left:
                failed = True
                LOG.error("%s: left behind: %s", name, "; ".join(left))
            else:
                LOG.info("%s: stopped, nothing left behind", name)
    return 1 if failed else 0


def inventory(up_json: Path, groups: list[str]) -> dict:
    """An Ansible inventory (YAML-compatible JSON) putting the hosts ``up`` printed into ``groups``."""
    hosts = {
        h["instance"]: {
            "ansible_host": h["address"],
            "ansible_user": h["user"],
            "ansible_ssh_private_key_file": h["identity_file"],
            "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
        }
        for h in json.loads(up_json.read_text())
    }
    return {"all": {"children": {group: {"hosts": hosts} for group in groups}}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("base", help="build or reuse the cached Debian rootfs")
    p_up = sub.add_parser("up", help="boot hosts and print their connection details as JSON")
    p_up.add_argument("names", nargs="+")
    p_up.add_argument("--bind-ro", action="append", default=[], metavar="SRC[:DST]", help="read-only bind mount")
    p_up.add_argument("--bind", action="append", default=[], metavar="SRC[:DST]", help="writable bind mount (shared)")
    p_down = sub.add_parser("down", help="stop hosts and check nothing is left behind")
    p_down.add_argument("names", nargs="*")
    p_down.add_argument("--all", action="store_true")
    sub.add_parser("list", help="print known hosts as JSON")
    p_inv = sub.add_parser("inventory", help="an Ansible inventory for hosts from `up`'s JSON")
    p_inv.add_argument("up_json", type=Path)
    p_inv.add_argument("--groups", default="all", help="comma-separated groups to put every host in")
    p_wh = sub.add_parser("wheelhouse", help="download wheels for requirements (cached); print the directory")
    p_wh.add_argument("requirements", nargs="*")
    p_wh.add_argument("--inventory", type=Path, help="the pins of this inventory directory's group_vars/all.yml")
    p_pre = sub.add_parser("prefetch", help="build the rootfs and the wheelhouses of molecule scenarios (cached)")
    p_pre.add_argument("scenarios", nargs="+", type=Path, metavar="MOLECULE_YML")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s testhost %(levelname)s %(message)s", stream=sys.stderr)

    if args.command == "inventory":
        print(json.dumps(inventory(args.up_json, args.groups.split(",")), indent=2))
        return 0
    if os.geteuid() != 0:
        sys.exit("testhost: needs root (network namespaces and systemd-nspawn)")
    if args.command == "base":
        print(base_rootfs())
    elif args.command == "up":
        print(json.dumps([up(name, args.bind_ro, args.bind) for name in args.names], indent=2))
    elif args.command == "down":
        return down(sorted(hosts()) if args.all else args.names)
    elif args.command == "wheelhouse":
        if bool(args.requirements) == bool(args.inventory):
            sys.exit("testhost wheelhouse: give requirements or --inventory DIR, not both")
        print(wheelhouse(inventory_pins(args.inventory) if args.inventory else args.requirements))
    elif args.command == "prefetch":
        print(*prefetch(args.scenarios), sep="\n")
    elif args.command == "list":
        print(json.dumps(hosts(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
