"""Pipeline stages on a host: completion markers, detached runs, and waiting with progress.

The playbook runs every job through this module so that a stage is skipped when its outputs are
complete for the same inputs, resumes when it was interrupted, and reports progress while it runs:

* ``status``: ``complete`` (the marker's inputs hash matches and every output file it lists is
  still there with the same size), ``running`` (a supervisor for it is alive) or ``todo``.
* ``start``: prints ``{"started": false}`` when complete or already running (a rerun attaches to
  the run in progress); otherwise removes the old marker and starts a detached supervisor that
  runs the command (stdout and stderr to ``<name>.log``) and, only if it exits 0, records the
  outputs (path, size, and sha256 for files up to 16 MiB) and the job's summary JSON, and writes
  the marker atomically, then the exit code.

  What the job resumes from is keyed on the inputs hash, here and nowhere else: every path the
  stage *owns* (``--owns``, by default its outputs: everything its job writes and resumes from) is
  deleted before the job starts unless the last start of this stage was for the same inputs hash.
  An interrupted stage (same hash) resumes from its partial output; a stage whose inputs changed
  (or whose owned paths were made by nobody knows what) starts from nothing, so a job never
  mixes outputs made under other inputs with new ones. Owned paths must lie inside ``--dir``.
* ``statuses``: ``status`` of several stages at once (``--stage NAME=HASH``, repeated), a JSON
  list in the order asked: the plan asks every stage of a host in one command.
* ``pids``: the PIDs of the run's own processes (every running stage's process tree and the
  cgroup of each ``--unit``), which the pre-flight gate exempts from "GPU busy".
* ``wait``: blocks up to ``--timeout`` seconds; prints ``{"done", "rc", "progress", ...}`` (the
  last line of the job's log as progress). Exits 1 with the log tail when the job failed.

Files live in ``<dir>/.stages/``: ``<name>.json`` (marker), ``.pid``, ``.log``, ``.rc``. A job
killed with its host leaves no marker and no rc: ``start`` runs it again and the job resumes from
its own partial outputs (every job here is resumable).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHECKSUM_MAX_BYTES = 16 << 20


@dataclass(frozen=True)
class Stage:
    dir: Path
    name: str

    @property
    def state_dir(self) -> Path:
        return self.dir / ".stages"

    def file(self, suffix: str) -> Path:
        return self.state_dir / f"{self.name}.{suffix}"

    @property
    def marker(self) -> Path:
        return self.file("json")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def record_outputs(outputs: list[Path]) -> list[dict[str, Any]]:
    """Every file under the outputs (files or directories), sorted, with size and small files' sha256."""
    files: list[Path] = []
    for out in outputs:
        if out.is_dir():
            files += [p for p in out.rglob("*") if p.is_file() and ".stages" not in p.parts]
        elif out.is_file():
            files.append(out)
        else:
            raise FileNotFoundError(f"stage output {out} does not exist")
    records = []
    for path in sorted(set(files)):
        size = path.stat().st_size
        record: dict[str, Any] = {"path": str(path), "size": size}
        if size <= CHECKSUM_MAX_BYTES:
            record["sha256"] = sha256(path)
        records.append(record)
    return records


def write_atomic(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all. Each writer has its own temporary file: ``start`` and
    the supervisor it spawns both write the pid file, and a shared temporary name let one rename
    the other's away."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def stat_fields(stat: Path) -> list[str]:
    """The fields of a ``/proc/<pid>/stat`` after the command name (state first, then the parent
    pid...). The name is in parentheses and may itself hold ``)``, hence the last one."""
    return stat.read_text().rsplit(")", 1)[1].split()


def pid_alive(pid_file: Path, proc: Path = Path("/proc"), settle_s: float = 2.0) -> bool:
    """The pid in ``pid_file`` is a live ``jobs.stage`` process (not a zombie, not another program
    that took the pid after a reboot).

    A process that is still inside exec shows an empty cmdline for a moment: Popen returns as soon
    as exec has closed the inherited pipe, before the kernel has put the new arguments in place, so
    ``wait`` called right after ``start`` could read its supervisor as gone (CI saw rc -1 for a stage
    that went on to finish). An empty cmdline of a process that is not a zombie is asked again until
    ``settle_s``; only a kernel thread stays empty that long."""
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        return False
    deadline = time.monotonic() + settle_s
    while True:
        try:
            state = stat_fields(proc / str(pid) / "stat")[0]
            cmdline = (proc / str(pid) / "cmdline").read_bytes()
        except (OSError, IndexError):
            return False
        if state in ("Z", "X"):
            return False
        if cmdline or time.monotonic() >= deadline:
            return b"jobs.stage" in cmdline
        time.sleep(0.01)


def marker_problem(stage: Stage, inputs_hash: str) -> str | None:
    """Why the stage is not complete for these inputs, or None when it is."""
    try:
        marker = json.loads(stage.marker.read_text())
    except FileNotFoundError:
        return "no completion marker"
    except (OSError, ValueError) as err:
        return f"unreadable marker ({err})"
    if marker.get("inputs_hash") != inputs_hash:
        return "inputs changed"
    for record in marker.get("outputs", []):
        path = Path(record["path"])
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return f"output {path} is gone"
        if size != record["size"]:
            return f"output {path} changed size ({record['size']} -> {size})"
    return None


def running(stage: Stage) -> bool:
    """A supervisor for the stage is alive and has not recorded an exit code."""
    return pid_alive(stage.file("pid")) and not stage.file("rc").exists()


def status(stage: Stage, inputs_hash: str) -> dict[str, Any]:
    if running(stage):
        return {"stage": stage.name, "state": "running"}
    problem = marker_problem(stage, inputs_hash)
    if problem is None:
        return {"stage": stage.name, "state": "complete"}
    return {"stage": stage.name, "state": "todo", "reason": problem}


def last_request(stage: Stage) -> dict[str, Any] | None:
    try:
        request = json.loads(stage.file("request.json").read_text())
    except (OSError, ValueError):
        return None
    return request if isinstance(request, dict) else None


def inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def discard(stage: Stage, paths: list[Path]) -> list[str]:
    """Delete ``paths`` (files or directories), each first renamed into ``.stages`` so that a
    kill half-way never leaves a partly deleted output where a job would resume from it."""
    removed = []
    for path in sorted(set(paths)):
        if not inside(path, stage.dir) or path == stage.dir or inside(path, stage.state_dir):
            raise ValueError(
                f"stage {stage.name} owns {path}, which is not inside its run directory {stage.dir}: "
                "refusing to delete it (give owned paths under --dir)"
            )
        if not path.exists() and not path.is_symlink():
            continue
        trash = Path(tempfile.mkdtemp(dir=stage.state_dir, prefix=f".discard-{stage.name}-"))
        try:
            path.rename(trash / path.name)
        except OSError:  # another filesystem under the run directory: delete in place
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        shutil.rmtree(trash)
        removed.append(str(path))
    return removed


class UpstreamIncomplete(RuntimeError):
    """A stage was asked to start before a stage it reads from was complete for its inputs."""


def check_after(stage: Stage, after: dict[str, str]) -> None:
    """Raise unless every stage in ``after`` (name -> inputs hash, in the same run directory) is
    complete for that hash: a stage must never build on outputs made under other inputs, as it
    would when one stage is run alone (``--tags prepare``) after an earlier one's inputs changed."""
    pending = {}
    for name, inputs_hash in after.items():
        answer = status(Stage(stage.dir, name), inputs_hash)
        if answer["state"] != "complete":
            pending[name] = answer.get("reason", answer["state"])
    if pending:
        raise UpstreamIncomplete(
            f"stage {stage.name} reads the outputs of {', '.join(pending)}, which "
            f"{'is' if len(pending) == 1 else 'are'} not complete for this run's inputs "
            f"({'; '.join(f'{k}: {v}' for k, v in pending.items())}). Run those stages first: "
            f"run the playbook without --tags, or add them to --tags ({','.join([*pending, stage.name])})."
        )


def start(
    stage: Stage,
    inputs_hash: str,
    command: list[str],
    outputs: list[Path],
    summary: Path | None,
    owns: list[Path] | None = None,
    after: dict[str, str] | None = None,
) -> dict:
    current = status(stage, inputs_hash)
    if current["state"] != "todo":
        return {**current, "started": False}
    check_after(stage, after or {})
    stage.state_dir.mkdir(parents=True, exist_ok=True)
    owned = [p.resolve() for p in (owns if owns else outputs)]
    previous = last_request(stage)
    discarded: list[str] = []
    changed = previous is None or previous.get("inputs_hash") != inputs_hash
    if changed:
        # Outputs made under other inputs (or by an unknown run): nothing of them may be reused.
        # The previous start's owned paths go too, in case the paths themselves changed.
        # (Those outside this run directory belong to wherever the directory was copied from.)
        before = [Path(p) for p in (previous or {}).get("owns", []) if inside(Path(p), stage.dir)]
        discarded = discard(stage, owned + before)
    for suffix in ("json", "rc", "pid"):
        stage.file(suffix).unlink(missing_ok=True)
    request = {
        "inputs_hash": inputs_hash,
        "command": command,
        "outputs": [str(p.resolve()) for p in outputs],
        "owns": [str(p) for p in owned],
        "summary": str(summary.resolve()) if summary else None,
    }
    write_atomic(stage.file("request.json"), json.dumps(request, indent=2) + "\n")
    if discarded or previous is not None:
        how = (
            f"inputs changed ({(previous or {}).get('inputs_hash', 'none')[:12]} -> {inputs_hash[:12]}): "
            f"removed {', '.join(discarded) or 'nothing (no earlier output)'}"
            if changed
            else f"resuming {inputs_hash[:12]} from its partial output ({current.get('reason')})"
        )
        with stage.file("log").open("a") as log:
            log.write(f"== {time.strftime('%Y-%m-%dT%H:%M:%S')} stage {stage.name}: {how}\n")
    with stage.file("log").open("ab") as supervisor_log:
        supervisor = subprocess.Popen(
            [sys.executable, "-m", "jobs.stage", "_supervise", "--dir", str(stage.dir), "--name", stage.name],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=supervisor_log,  # a supervisor that crashes says why in the stage's log
            cwd=Path(__file__).resolve().parents[1],
        )
    write_atomic(stage.file("pid"), f"{supervisor.pid}\n")
    return {**current, "state": "running", "started": True, "pid": supervisor.pid, "resumed": not changed,
            "discarded": discarded}  # fmt: skip


def supervise(stage: Stage) -> int:
    request = json.loads(stage.file("request.json").read_text())
    write_atomic(stage.file("pid"), f"{os.getpid()}\n")
    began = time.time()
    with stage.file("log").open("ab") as log:
        log.write(f"== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(request['command'])}\n".encode())
        log.flush()
        try:
            rc = subprocess.run(request["command"], stdin=subprocess.DEVNULL, stdout=log, stderr=log).returncode
        except OSError as err:  # not there, not executable: the stage failed, and says why
            log.write(f"stage {stage.name}: cannot run {request['command'][0]}: {err}\n".encode())
            rc = 127
    if rc == 0:
        try:
            marker = {
                "stage": stage.name,
                "inputs_hash": request["inputs_hash"],
                "command": request["command"],
                "started": began,
                "finished": time.time(),
                "duration_s": round(time.time() - began, 3),
                "outputs": record_outputs([Path(p) for p in request["outputs"]]),
                "summary": json.loads(Path(request["summary"]).read_text()) if request["summary"] else None,
            }
            write_atomic(stage.marker, json.dumps(marker, indent=2) + "\n")
        except (OSError, ValueError) as err:
            with stage.file("log").open("a") as log_text:
                log_text.write(f"stage {stage.name}: the job exited 0 but its outputs are not complete: {err}\n")
            rc = 70
    write_atomic(stage.file("rc"), f"{rc}\n")
    return rc


def last_line(path: Path, tail: int = 4096) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - tail))
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    lines = [seg.strip() for line in text.splitlines() for seg in line.split("\r") if seg.strip()]
    return lines[-1] if lines else ""


def wait(stage: Stage, timeout: float, poll: float = 1.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        if stage.file("rc").exists():
            rc = int(stage.file("rc").read_text())
            result: dict[str, Any] = {"stage": stage.name, "done": True, "rc": rc}
            if rc == 0 and stage.marker.exists():
                marker = json.loads(stage.marker.read_text())
                result |= {"duration_s": marker["duration_s"], "summary": marker["summary"]}
            else:
                result["log_tail"] = tail_text(stage.file("log"))
            return result
        if not pid_alive(stage.file("pid")):
            if stage.file("rc").exists():  # it wrote its rc and exited between the two checks
                continue
            return {"stage": stage.name, "done": True, "rc": -1, "log_tail": tail_text(stage.file("log"))}
        if time.monotonic() >= deadline:
            return {"stage": stage.name, "done": False, "progress": last_line(stage.file("log"))}
        time.sleep(poll)


def tail_text(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def descendants(roots: set[int]) -> set[int]:
    """``roots`` and every process below them (from /proc's parent pids)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat_fields(stat)[1])
        except OSError:
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    return found


def unit_pids(unit: str) -> set[int]:
    """Every process of a systemd unit: its cgroup's (v2), else its main PID's tree."""
    try:
        shown = subprocess.run(
            ["systemctl", "show", "--property", "ControlGroup,MainPID", unit],
            capture_output=True, text=True, timeout=30, check=False,
        ).stdout  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return set()
    props = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    pids: set[int] = set()
    group = props.get("ControlGroup", "")
    if group:
        for procs in Path("/sys/fs/cgroup", group.lstrip("/")).glob("**/cgroup.procs"):
            try:
                pids |= {int(x) for x in procs.read_text().split()}
            except OSError:
                continue
    main_pid = int(props.get("MainPID") or 0)
    return pids or (descendants({main_pid}) if main_pid else set())


def own_pids(run_dir: Path, units: list[str]) -> list[int]:
    """The processes that belong to this run: its servers' units and every running stage's tree
    (the pre-flight gate does not count their GPUs as busy)."""
    roots = set()
    for pid_file in (run_dir / ".stages").glob("*.pid"):
        if running(Stage(run_dir, pid_file.name.removesuffix(".pid"))):
            roots.add(int(pid_file.read_text()))
    pids = descendants(roots) if roots else set()
    for unit in units:
        pids |= unit_pids(unit)
    return sorted(pids)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.stage", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    pids = sub.add_parser("pids", help="PIDs of this run's own processes (running stages, its server units)")
    pids.add_argument("--dir", type=Path, required=True, help="the run directory")
    pids.add_argument("--unit", action="append", default=[], help="a systemd unit of the run (repeat)")
    many = sub.add_parser("statuses", help="the state of several stages of one run directory, as a JSON list")
    many.add_argument("--dir", type=Path, required=True, help="the run directory")
    many.add_argument(
        "--stage", action="append", default=[], metavar="NAME=HASH", help="a stage and its inputs hash (repeat)"
    )
    for name in ("status", "start", "wait", "_supervise"):
        p = sub.add_parser(name)
        p.add_argument("--dir", type=Path, required=True, help="the stage's run directory")
        p.add_argument("--name", required=True, help="stage name")
        if name in ("status", "start"):
            p.add_argument("--inputs-hash", required=True, help="hash of everything the outputs depend on")
        if name == "start":
            p.add_argument("--output", type=Path, action="append", default=[], help="output file or dir (repeat)")
            p.add_argument("--summary", type=Path, help="the job's summary JSON, kept in the marker")
            p.add_argument(
                "--owns", type=Path, action="append", default=[],
                help="a path the job writes and resumes from, deleted when the inputs hash changed (repeat; "
                "default: the outputs)",
            )  # fmt: skip
            p.add_argument(
                "--after", action="append", default=[], metavar="STAGE=HASH",
                help="a stage of the same run directory whose outputs this one reads: refuse to start unless "
                "it is complete for HASH (repeat)",
            )  # fmt: skip
            p.add_argument("command", nargs=argparse.REMAINDER, help="-- the job's command")
        if name == "wait":
            p.add_argument("--timeout", type=float, default=30.0, help="seconds to block before reporting")
    args = parser.parse_args(argv)
    if args.action == "pids":
        print(json.dumps(own_pids(args.dir.resolve(), args.unit)))
        return 0
    if args.action == "statuses":
        asked = [spec.split("=", 1) for spec in args.stage]
        if any(len(pair) != 2 for pair in asked):
            parser.error("give each --stage as NAME=HASH")
        print(json.dumps([status(Stage(args.dir.resolve(), name), digest) for name, digest in asked]))
        return 0
    stage = Stage(args.dir.resolve(), args.name)
    if args.action == "_supervise":
        return supervise(stage)
    if args.action == "status":
        print(json.dumps(status(stage, args.inputs_hash)))
        return 0
    if args.action == "start":
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            parser.error("give the job's command after --")
        if not args.output:
            parser.error("give at least one --output")
        after = dict(spec.split("=", 1) for spec in args.after)
        try:
            print(json.dumps(start(stage, args.inputs_hash, command, args.output, args.summary, args.owns, after)))
        except UpstreamIncomplete as err:
            print(f"jobs.stage: {err}", file=sys.stderr)
            return 2
        return 0
    result = wait(stage, args.timeout)
    print(json.dumps(result))
    if result["done"] and result["rc"] != 0:
        print(f"stage {stage.name} failed (exit {result['rc']}); log {stage.file('log')}:", file=sys.stderr)
        print(result.get("log_tail", ""), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
