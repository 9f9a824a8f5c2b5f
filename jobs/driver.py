"""Run ``playbooks/train.yml`` through ansible-runner, stream per-stage progress, write the run manifest.

    python -m jobs.driver -i inventory/<site> [-i more-hosts.yml] [-e key=value | -e @vars.yml]
                       [--tags generate] [--run-dir runs/<name>]

Progress goes to stderr, one line per event that matters: a play (pipeline step) starting, a
stage started or found complete on a host, a stage's progress while it runs (its job's own last
log line: rows/tokens done, tokens/s, and an ETA from the row rate), a stage finishing (its time and summary), and the failing
host, task and message when something fails. The exit code is ansible-playbook's.

``<run-dir>/manifest-<start time>.json`` records what one invocation ran (``manifest.json`` links
to the latest; a rerun into the same run directory keeps the earlier ones): command, inventory, extra vars, per-play and
per-stage timings, pre-flight readings, each host's stage inputs and versions (vLLM, speculators,
torch, driver), each stage's marker (inputs hash, outputs with sizes and checksums, the job's
summary) and the validation report. ansible-runner's artifacts (full event log, stdout) stay in
``<run-dir>/ansible`` for debugging.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shlex
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PLAYBOOK = ROOT / "playbooks" / "train.yml"


def parse_extra_vars(items: list[str]) -> dict[str, Any]:
    """``-e`` values as ansible-playbook reads them (its own parser): ``key=value`` gives strings,
    ``{...}``/``[...]`` is YAML/JSON, ``@file`` a YAML file; later ones win. For the manifest;
    the strings themselves are passed to ansible-playbook unchanged."""
    from ansible import context
    from ansible.errors import AnsibleError
    from ansible.module_utils.common.collections import ImmutableDict
    from ansible.parsing.dataloader import DataLoader
    from ansible.utils import vars as ansible_vars

    context.CLIARGS = ImmutableDict(extra_vars=tuple(items))
    ansible_vars.load_extra_vars.extra_vars = None  # it caches the first answer
    try:
        loaded = ansible_vars.load_extra_vars(DataLoader())
    except AnsibleError as err:
        raise SystemExit(f"-e: {err.message}") from err
    finally:
        ansible_vars.load_extra_vars.extra_vars = None
    return json.loads(json.dumps(loaded, default=str))


def extra_vars_args(items: list[str]) -> list[str]:
    """``-e`` arguments for ansible-playbook; ``@file`` made absolute (ansible-runner runs elsewhere)."""
    out = []
    for item in items:
        out += ["-e", f"@{Path(item[1:]).resolve()}" if item.startswith("@") else item]
    return out


def stage_of(res: dict[str, Any]) -> tuple[str, str] | None:
    """A ``jobs.stage start`` or ``wait`` answer (what roles/eagle3/tasks/stage.yml runs), known by
    its JSON, not by a task name: ('generate-0', 'start') or ('generate-0', 'wait')."""
    answer = stdout_json(res)
    if "stage" not in answer:
        return None
    if "started" in answer:
        return answer["stage"], "start"
    if "done" in answer:
        return answer["stage"], "wait"
    return None


def stdout_json(res: dict[str, Any]) -> dict[str, Any]:
    try:
        value = json.loads(res.get("stdout") or "")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


LOG_PREFIX = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ \S+ (?P<level>[A-Z]+) ")


def brief_progress(line: str) -> str:
    """A job's last log line, short: without the jobs' log prefix (time and logger; the level
    unless INFO), and speculators' metrics dict as epoch/step/loss/tokens per s."""
    prefix = LOG_PREFIX.match(line)
    if prefix and "speculators.metrics" not in line:
        level = prefix.group("level")
        line = ("" if level == "INFO" else f"{level}: ") + line[prefix.end() :]
    if "speculators.metrics" in line and "{" in line:
        try:
            metrics = ast.literal_eval(line[line.index("{") :])
            train, profile = metrics.get("train", {}), metrics.get("profile", {})
            return (
                f"epoch {metrics.get('epoch')} step {metrics.get('global_step')} loss {train.get('loss', float('nan')):.3f}"
                f" {profile.get('tokens_per_s', 0):.0f} tok/s"
            )
        except (ValueError, SyntaxError, AttributeError, TypeError):
            pass
    return line if len(line) <= 200 else line[:197] + "..."


QUIET_S = 60.0
COUNT = re.compile(r"(\d+)/(\d+) (rows|steps|prompts)\b")
ETA_WINDOW_S = 300.0


def estimate_eta(record: dict[str, Any], line: str, now: float) -> str:
    """', ETA 4m10s' from a job's 'N/T rows' (or steps, or prompts) progress, at the rate of the
    last ``ETA_WINDOW_S`` seconds: recent work, so a stall shows as no ETA rather than a slowly
    growing one. A new total (the next drafter's prompts) starts the count again."""
    match = COUNT.search(line)
    if not match:
        return ""
    done, total, unit = int(match.group(1)), int(match.group(2)), match.group(3)
    seen = record.setdefault("eta_points", {}).setdefault(f"{unit}/{total}", [])
    seen.append((now, done))
    while len(seen) > 2 and now - seen[1][0] >= ETA_WINDOW_S:
        seen.pop(0)
    (then, done_then) = seen[0]
    rate = (done - done_then) / (now - then) if now > then else 0.0
    if rate <= 0 or done >= total:
        return ""
    left = (total - done) / rate
    return f", ETA {int(left // 60)}m{int(left % 60):02d}s"


def failure_message(res: dict[str, Any]) -> str:
    """A failed task's cause as lines: its message (a list, such as the pre-flight's problems, one
    per line), the error lines and journal tail vllm_server_wait returns, and the end of stderr,
    where a failed stage's log tail puts its cause."""
    msg = res.get("msg")
    parts = ["\n".join(map(str, msg)) if isinstance(msg, list) else str(msg or "").strip()]
    if res.get("errors"):
        parts.append("error lines:\n" + "\n".join(f"  {line}" for line in res["errors"]))
    if res.get("journal"):
        parts.append("journal tail:\n" + "\n".join(f"  {line}" for line in res["journal"][-15:]))
    parts.append(str(res.get("stderr") or "").strip()[-2000:])
    return "\n".join(p for p in parts if p) or json.dumps(res)[:2000]


def failure_summary(message: str, head: int = 4, tail: int = 12) -> str:
    """The lines of a failure message worth repeating at the end of a run: its first lines (what
    failed) and its last (a log tail ends with the cause)."""
    lines = message.splitlines()
    if len(lines) <= head + tail + 1:
        return message
    return "\n".join([*lines[:head], f"  ... ({len(lines) - head - tail} lines, in the log above)", *lines[-tail:]])


@dataclass
class Progress:
    """Turns ansible-runner events into progress lines and the manifest's timings."""

    out: Any = sys.stderr
    started: float = field(default_factory=time.time)
    plays: list[dict[str, Any]] = field(default_factory=list)
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)
    plan: dict[str, Any] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    running: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)

    def say(self, text: str) -> None:
        print(f"[{time.time() - self.started:7.0f}s] {text}", file=self.out, flush=True)

    def tick(self, now: float | None = None) -> None:
        """A line for each task that has run ``QUIET_S`` seconds without any output (a vLLM
        install, a server loading), every ``QUIET_S`` seconds: what it is and for how long."""
        now = time.time() if now is None else now
        with self.lock:
            for (host, task), running in self.running.items():
                if now - running["said"] >= QUIET_S:
                    running["said"] = now
                    self.say(f"{host}: {task} [{now - running['started']:.0f}s, running]")

    def _task_event(self, kind: str, host: str, task: str, res: dict[str, Any]) -> None:
        now, key = time.time(), (host, task)
        if kind == "runner_on_start":
            self.running[key] = {"started": now, "said": now}
            return
        if kind == "runner_retry" and key in self.running:
            self.running[key]["said"] = now  # a stage's own progress speaks for it
            return
        running = self.running.pop(key, None)
        if running is None or kind not in ("runner_on_ok", "runner_on_skipped") or stage_of(res):
            return
        took = now - running["started"]
        if "waited_s" in res and "main_pid" in res:  # vllm_server_wait: the server answered
            self.say(
                f"{host}: {res.get('unit', 'vLLM server')} healthy, serving {res.get('models')} after {res['waited_s']:.0f} s"
            )
        elif took >= QUIET_S / 2:
            self.say(f"{host}: {task} done in {took:.0f} s")

    def __call__(self, event: dict[str, Any]) -> bool:
        with self.lock:
            return self._handle(event)

    def _handle(self, event: dict[str, Any]) -> bool:
        kind, data = event.get("event", ""), event.get("event_data", {})
        host, task, res = data.get("host", ""), data.get("task", ""), data.get("res") or {}
        if kind.startswith("runner_on_") or kind == "runner_retry":
            self._task_event(kind, host, task, res)
        if kind == "playbook_on_play_start":
            now = time.time()
            if self.plays:
                self.plays[-1]["finished"] = now
            self.plays.append({"play": data.get("play", ""), "started": now})
            self.say(f"== {data.get('play', '')}")
        elif kind == "runner_on_ok" and "eagle3_plan" in (res.get("ansible_facts") or {}):
            plan = res["ansible_facts"]["eagle3_plan"]
            if not isinstance(plan, dict) or "todo" not in plan:
                return True
            # plan.yml keeps a host's plan twice (before and after settling across hosts): say it
            # again only when settling changed what the host runs.
            before = self.plan.get(host, {}).get("todo")
            self.plan[host] = plan
            todo = plan.get("todo", [])
            if todo == before:
                return True
            self.say(f"{host}: {'every stage complete' if not todo else 'to run: ' + ', '.join(todo)}")
        elif kind in ("runner_on_ok", "runner_retry") and (stage := stage_of(res)):
            self._stage_event(host, *stage, kind, stdout_json(res))
        elif kind in ("runner_on_failed", "runner_on_unreachable") and not data.get("ignore_errors"):
            failure = {"host": host, "task": task, "play": data.get("play", ""), "message": failure_message(res)}
            self.failures.append(failure)
            self.say(f"FAILED {host} | {task}\n{failure['message']}")
        elif kind == "playbook_on_stats":
            if self.plays:
                self.plays[-1]["finished"] = time.time()
            self.stats = {k: data.get(k, {}) for k in ("ok", "changed", "failures", "dark", "skipped")}
        return True

    def _stage_event(self, host: str, name: str, step: str, kind: str, result: dict[str, Any]) -> None:
        record = self.stages.setdefault(f"{host}/{name}", {"host": host, "stage": name})
        if step == "start":
            record["state"] = result.get("state")
            if result.get("state") == "complete":
                record["skipped"] = True
                self.say(f"{host}: {name} already complete, skipped")
            else:
                record["started"] = time.time()
                how = "started" if result.get("started") else "running, attached"
                if result.get("resumed"):
                    how += " (resuming its partial output: same inputs)"
                if result.get("discarded"):
                    record["discarded"] = result["discarded"]
                    how += f" (inputs changed: removed {', '.join(result['discarded'])})"
                self.say(f"{host}: {name} {how}")
        elif step == "wait" and kind == "runner_retry" and result.get("progress"):
            # A new line from the job, or a heartbeat once a minute while it is quiet.
            now, line = time.time(), brief_progress(result["progress"])
            if line != record.get("last_line") or now - record.get("last_said", 0) >= 60:
                record |= {"last_line": line, "last_said": now}
                eta = estimate_eta(record, line, now)
                self.say(f"{host}: {name} [{now - record.get('started', now):.0f}s] {line}{eta}")
        elif step == "wait" and result.get("done"):
            record |= {"finished": time.time(), "rc": result.get("rc"), "summary": result.get("summary")}
            record["duration_s"] = result.get("duration_s")
            brief = json.dumps(result.get("summary"))[:300] if result.get("summary") else ""
            self.say(f"{host}: {name} done in {result.get('duration_s')} s {brief}")


def read_json_dir(path: Path) -> dict[str, Any]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(path.glob("*.json"))} if path.is_dir() else {}


def manifest(args: argparse.Namespace, extra: dict[str, Any], progress: Progress, rc: int, status: str) -> dict:
    records = args.run_dir / "records"
    from importlib.metadata import version

    preflight = read_json_dir(records / "preflight")
    return {
        "run_dir": str(args.run_dir),
        "command": shlex.join(sys.argv),
        "playbook": str(PLAYBOOK),
        "inventory": [str(p) for p in args.inventory],
        "extra_vars": extra,
        "tags": args.tags,
        "started": progress.started,
        "finished": time.time(),
        "duration_s": round(time.time() - progress.started, 1),
        "status": status,
        "rc": rc,
        "failures": progress.failures,
        "plan": progress.plan,
        "plays": progress.plays,
        "stage_events": [{k: v for k, v in r.items() if k != "eta_points"} for r in progress.stages.values()],
        "preflight": preflight,
        "driver_versions": {h: r.get("driver_version") for h, r in preflight.items()},
        "hosts": read_json_dir(records / "hosts"),
        "stages": {p.name: read_json_dir(p) for p in sorted((records / "stages").glob("*")) if p.is_dir()},
        "validation": (
            json.loads((records / "validation" / "report.json").read_text())
            if (records / "validation" / "report.json").exists()
            else None
        ),
        "validation_plot": (
            str(records / "validation" / "acceptance.svg")
            if (records / "validation" / "acceptance.svg").exists()
            else None
        ),
        "controller": {"ansible-core": version("ansible-core"), "ansible-runner": version("ansible-runner")},
        "recap": progress.stats,
        "artifacts": str(args.run_dir / "ansible"),
    }


def write_manifest(run_dir: Path, result: dict[str, Any], started: float) -> Path:
    """Writes this invocation's manifest as ``manifest-<start time>.json`` and points
    ``manifest.json`` (a symlink) at it: a rerun with the same run directory adds its own record
    and keeps the one of the run that trained the drafter."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
    path, n = run_dir / f"manifest-{stamp}.json", 1
    while path.exists():
        n += 1
        path = run_dir / f"manifest-{stamp}-{n}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    latest, link = run_dir / "manifest.json", run_dir / "manifest.json.tmp"
    if latest.exists() and not latest.is_symlink():  # written before manifests were kept: keep it too
        old = time.strftime("%Y%m%d-%H%M%S", time.localtime(latest.stat().st_mtime))
        os.replace(latest, run_dir / f"manifest-{old}-earlier.json")
    link.unlink(missing_ok=True)
    link.symlink_to(path.name)
    os.replace(link, latest)
    return path


def validation_lines(report: dict[str, Any] | None, plot: str | None = None) -> list[str]:
    """The run's last lines: each drafter's mean acceptance length and per-position acceptance, on
    how many prompts and tokens, and where the per-position plot is."""
    if not report:
        return []
    lines = [
        f"validation on {report.get('num_prompts')} held-out prompts, {report.get('num_speculative_tokens')} "
        "speculative tokens (mean acceptance length: draft tokens accepted per step + 1):"
    ]
    for name, result in report.get("drafters", {}).items():
        lines.append(
            f"  {name}: {result.get('mean_acceptance_length')}  per position {result.get('per_position')}"
            f"  ({result.get('completion_tokens')} tokens)"
        )
    for key in ("trained_over_untrained", "trained_minus_untrained"):
        if key in report:
            lines.append(f"  {key}: {report[key]}")
    if plot:
        lines.append(f"  plot, per position: {plot}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.driver", description=__doc__.split("\n\n")[0])
    parser.add_argument("-i", "--inventory", type=Path, action="append", required=True, help="repeatable")
    parser.add_argument(
        "-e", "--extra-vars", action="append", default=[],
        help="as ansible-playbook's -e: key=value, YAML/JSON, or @file (repeatable)",
    )  # fmt: skip
    parser.add_argument("--tags", default="", help="run only these stages (comma-separated tags)")
    parser.add_argument("--limit", default="", help="ansible --limit")
    parser.add_argument("--run-dir", type=Path, help="manifest, records and artifacts (default runs/run-<time>)")
    parser.add_argument("--playbook", type=Path, default=PLAYBOOK)
    args = parser.parse_args(argv)
    args.run_dir = (args.run_dir or ROOT / "runs" / time.strftime("run-%Y%m%d-%H%M%S")).resolve()
    args.inventory = [p.resolve() for p in args.inventory]
    for inv in args.inventory:
        if not inv.exists():
            parser.error(f"inventory {inv} does not exist")
    user_extra = parse_extra_vars(args.extra_vars)
    records = args.run_dir / "records"
    defaults = {"eagle3_record_dir": str(records), "gpu_preflight_record_dir": str(records / "preflight")}
    defaults = {k: v for k, v in defaults.items() if k not in user_extra}  # a -e of the user's wins
    extra = {**defaults, **user_extra}
    (args.run_dir / "ansible").mkdir(parents=True, exist_ok=True)

    import ansible_runner

    progress = Progress()
    progress.say(f"run {args.run_dir}: {args.playbook.name} on {', '.join(map(str, args.inventory))}")
    thread, runner = ansible_runner.run_async(
        private_data_dir=str(args.run_dir / "ansible"),
        project_dir=str(ROOT),
        playbook=str(args.playbook.resolve()),
        inventory=[str(p) for p in args.inventory],
        extravars=defaults,
        cmdline=shlex.join(extra_vars_args(args.extra_vars)) or None,
        tags=args.tags or None,
        limit=args.limit or None,
        envvars={
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            # ansible-playbook of this Python's environment, activated or not.
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        },
        event_handler=progress,
        quiet=True,
    )
    while thread.is_alive():  # a line now and then for a task that prints nothing (install, server load)
        thread.join(timeout=QUIET_S / 4)
        progress.tick()
    rc = runner.rc if runner.rc is not None else 1
    path = write_manifest(args.run_dir, manifest(args, extra, progress, rc, runner.status), progress.started)
    result = json.loads(path.read_text())
    for line in validation_lines(result["validation"], result["validation_plot"]):
        print(line)
    print(f"manifest: {path}")
    if rc != 0:
        for failure in progress.failures[:5]:
            print(
                f"failed: {failure['host']} | {failure['task']}:\n{failure_summary(failure['message'])}",
                file=sys.stderr,
            )
        print(f"playbook failed ({runner.status}, exit {rc}); ansible-runner artifacts: {args.run_dir / 'ansible'}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
