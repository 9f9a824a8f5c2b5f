#!/usr/bin/env python3
"""A fake ``nvidia-smi`` for test hosts, which have no GPU.

It replays a recorded scenario (``tests/fixtures/nvidia-smi/<scenario>/``):
``--query-gpu`` and ``--query-compute-apps`` answer with the recorded rows,
picking the columns the caller asks for by name, exactly as the real tool
does with ``--format=csv,noheader,nounits``. A scenario can also make the
tool fail (``exit-code`` + ``stdout.txt``) or never answer (``hang``).

Which scenario: ``$FAKE_NVIDIA_SMI_SCENARIO``, else the first line of
``/etc/fake-nvidia-smi/scenario``. Where the scenarios live:
``$FAKE_NVIDIA_SMI_DATA``, else ``/usr/local/share/fake-nvidia-smi``.

Standard library only: it runs on the bare test hosts' python3.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

SCENARIO_FILE = Path("/etc/fake-nvidia-smi/scenario")
DEFAULT_DATA = Path("/usr/local/share/fake-nvidia-smi")
SUPPORTED_FORMAT = {"csv", "noheader", "nounits"}


def scenario_dir() -> Path:
    data = Path(os.environ.get("FAKE_NVIDIA_SMI_DATA", DEFAULT_DATA))
    name = os.environ.get("FAKE_NVIDIA_SMI_SCENARIO")
    if not name:
        name = SCENARIO_FILE.read_text().splitlines()[0].strip()
    path = data / name
    if not path.is_dir():
        sys.exit(f"fake nvidia-smi: no scenario {name!r} under {data}")
    return path


def query(path: Path, kind: str, wanted: list[str]) -> int:
    recorded = (path / f"{kind}.fields").read_text().strip().split(",")
    for field in wanted:
        if field not in recorded:
            print(f'Field "{field}" is not a valid field to query.\n')
            return 2
    for line in (path / f"{kind}.csv").read_text().splitlines():
        if not line.strip():
            continue
        row = dict(zip(recorded, line.split(", "), strict=True))
        print(", ".join(row[field] for field in wanted))
    return 0


def main(argv: list[str]) -> int:
    path = scenario_dir()
    if (path / "hang").exists():
        time.sleep(3600)
    if (path / "exit-code").exists():
        stdout = path / "stdout.txt"
        if stdout.exists():
            sys.stdout.write(stdout.read_text())
        return int((path / "exit-code").read_text().strip())

    options = dict(arg.split("=", 1) for arg in argv if arg.startswith("--") and "=" in arg)
    fmt = set(options.get("--format", "").split(","))
    for kind, option in (("query-gpu", "--query-gpu"), ("query-compute-apps", "--query-compute-apps")):
        if option in options:
            if fmt != SUPPORTED_FORMAT:
                print("fake nvidia-smi only replays --format=csv,noheader,nounits", file=sys.stderr)
                return 2
            return query(path, kind, options[option].split(","))
    summary = path / "nvidia-smi.txt"
    if not argv and summary.exists():
        sys.stdout.write(summary.read_text())
        return 0
    print(f"fake nvidia-smi: arguments not recorded in this scenario: {argv}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
