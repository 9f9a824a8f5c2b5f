"""The hidden-state files a vLLM server writes for fused capture, and the disk they must not leak.

vLLM's hidden-states connector writes one ``<request>.safetensors`` per request into its
``shared_storage_path``, beside a ``<request>.safetensors.lock`` that it holds (``flock``) until
the file is written. ``jobs.generate --fused-hidden-states`` records each file's path in the row.
Two things would otherwise pile up there:

* locks: one per request, never removed by the server. ``release_lock`` removes a row's lock once
  the file is there and the writer has let go of it (the file is complete then);
* orphans: files of requests whose rows were never recorded (the job was killed, or the request
  failed after the server had written). ``remove_orphans`` deletes the files no row names, once
  no writer holds them. It only touches files of one job's requests: jobs.generate names its
  requests (``X-Request-Id``, which vLLM puts in the file name) with a prefix of its output
  directory and rank (``request_prefix``), so other runs and other hosts' generators sharing the
  directory are left alone.

    python -m jobs.hidden_state_files --dir /var/lib/eagle3/runs/x/server-hidden-states --rows runs/x/gen --rank 0
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

LOG = logging.getLogger("jobs.hidden_state_files")
SUFFIX = ".safetensors"
LOCK = ".lock"


def writer_done(lock: Path) -> bool | None:
    """Whether no writer holds ``lock`` (None: the lock file is gone)."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def wait_written(path: str | Path, wait: float = 60.0, poll: float = 0.05) -> bool:
    """Whether ``path`` is complete within ``wait`` seconds: it exists and no writer holds its lock.

    vLLM answers a request before its hidden-state file is written, and does not always create the
    lock first (its CPU path takes it only when the write starts): an absent lock alone does not
    mean the file is done. A generator that recorded the row and ended there would let the server
    be stopped with that write still pending, and the row would name a file that never appears.
    """
    path = Path(path)
    lock = Path(f"{path}{LOCK}")
    deadline = time.monotonic() + wait
    while not (path.exists() and writer_done(lock) is not False):
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return True


def release_lock(path: str | Path, wait: float = 60.0, poll: float = 0.05) -> bool:
    """Remove ``<path>.lock`` once ``path`` is written (``wait_written``); False if it was not
    within ``wait`` seconds (the lock is then left for ``remove_orphans``)."""
    if not wait_written(path, wait, poll):
        return False
    Path(f"{path}{LOCK}").unlink(missing_ok=True)
    return True


def referenced(rows_dirs: list[Path]) -> set[str]:
    """File names the recorded rows (``rows-*.jsonl`` of every rank) point at."""
    names: set[str] = set()
    for rows_dir in rows_dirs:
        for rows_file in sorted(rows_dir.glob("rows-*.jsonl")):
            with rows_file.open() as lines:
                for line in lines:
                    try:
                        path = json.loads(line).get("hidden_states_path")
                    except ValueError:
                        continue  # a partial last line: jobs.generate cuts it before reading
                    if path:
                        names.add(Path(path).name)
    return names


@dataclass
class Reclaimed:
    files: int = 0
    bytes: int = 0
    locks: int = 0

    def add(self, other: Reclaimed) -> None:
        self.files, self.bytes, self.locks = (
            self.files + other.files,
            self.bytes + other.bytes,
            self.locks + other.locks,
        )


def request_prefix(rows_dir: Path, rank: int) -> str:
    """The start of every request id jobs.generate sends for ``rows_dir`` and ``rank``: the same
    on a resume, different for another run directory or rank."""
    return f"e3g-{hashlib.sha256(str(rows_dir.resolve()).encode()).hexdigest()[:10]}-r{rank}-"


def remove_orphans(states_dir: Path, rows_dirs: list[Path], prefix: str) -> Reclaimed:
    """Delete the hidden-state files of requests named ``prefix…`` that no recorded row names,
    with their locks, and the locks of recorded rows; whatever a writer still holds is left."""
    found = Reclaimed()
    if not states_dir.is_dir():
        return found
    keep = referenced(rows_dirs)
    for path in states_dir.glob(f"*{prefix}*{SUFFIX}"):
        if path.name in keep or writer_done(Path(f"{path}{LOCK}")) is False:
            continue
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            continue
        found.files, found.bytes = found.files + 1, found.bytes + size
    for lock in states_dir.glob(f"*{prefix}*{SUFFIX}{LOCK}"):
        target = lock.with_name(lock.name.removesuffix(LOCK))
        if (target.exists() and target.name not in keep) or writer_done(lock) is False:
            continue
        lock.unlink(missing_ok=True)
        found.locks += 1
    if found.files or found.locks:
        LOG.info(
            "removed %d orphaned hidden-state files (%.1f MB) and %d locks from %s",
            found.files, found.bytes / 1e6, found.locks, states_dir,
        )  # fmt: skip
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.hidden_state_files", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, required=True, help="the server's hidden-states directory")
    parser.add_argument(
        "--rows", type=Path, action="append", required=True,
        help="jobs.generate's --out (rows-*.jsonl); repeatable, the first names the requests",
    )  # fmt: skip
    parser.add_argument("--rank", type=int, default=0, help="the generator whose requests to tidy up after")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    prefix = request_prefix(args.rows[0], args.rank)
    print(json.dumps(asdict(remove_orphans(args.dir, args.rows, prefix))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
