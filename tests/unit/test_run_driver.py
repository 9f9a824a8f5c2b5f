"""jobs.driver: extra vars, stage events to progress lines and timings (events as ansible-runner emits them)."""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import pytest
import yaml

from jobs import driver
from jobs import stage as st
from tests.conftest import ROOT


def test_extra_vars_parse_like_ansible(tmp_path: Path) -> None:
    f = tmp_path / "vars.yml"
    f.write_text("a: 1\nb: [x, y]\n")
    # key=value gives strings, as ansible-playbook -e does; JSON/YAML keeps its types.
    parsed = driver.parse_extra_vars(["@" + str(f), "a=2", "c=", "d=true", '{"eagle3_aux_layer_ids": [1, 3, 4]}'])
    assert parsed == {"a": "2", "b": ["x", "y"], "c": "", "d": "true", "eagle3_aux_layer_ids": [1, 3, 4]}
    with pytest.raises(SystemExit, match="-e"):
        driver.parse_extra_vars(["[1, 2]"])  # not a mapping
    assert driver.extra_vars_args(["@vars.yml", "a=b c"]) == ["-e", f"@{Path('vars.yml').resolve()}", "-e", "a=b c"]


def test_stage_events_are_known_by_what_jobs_stage_prints(tmp_path: Path) -> None:
    # The real answers of jobs.stage start/wait/status (what roles/eagle3/tasks/stage.yml runs),
    # whatever the task that ran them is called.
    stage = st.Stage(tmp_path, "generate-0")
    out = tmp_path / "out"
    cmd = [sys.executable, "-c", f"import pathlib; pathlib.Path({str(out)!r}).write_text('x')"]
    started = st.start(stage, "h", cmd, [out], None)
    waited = st.wait(stage, timeout=60)
    status = st.status(stage, "h")
    assert driver.stage_of({"stdout": json.dumps(started)}) == ("generate-0", "start")
    assert driver.stage_of({"stdout": json.dumps(waited)}) == ("generate-0", "wait")
    assert driver.stage_of({"stdout": json.dumps(status)}) is None
    assert driver.stage_of({"stdout": "not json"}) is None


def test_the_stage_tasks_print_what_the_driver_reads() -> None:
    # stage.yml runs jobs.stage start and wait and leaves their stdout as they printed it.
    tasks = yaml.safe_load((ROOT / "roles/eagle3/tasks/stage.yml").read_text())
    argv = [json.dumps(t["ansible.builtin.command"]["argv"]) for t in tasks]
    assert "'start'" in argv[0] and '"wait"' in argv[1]


def event(kind: str, task: str, host: str = "h1", **res: object) -> dict:
    return {"event": kind, "event_data": {"host": host, "task": task, "play": "p", "res": res}}


def test_progress_follows_a_stage_and_records_failures() -> None:
    out = io.StringIO()
    progress = driver.Progress(out=out)
    progress({"event": "playbook_on_play_start", "event_data": {"play": "Generate"}})
    plan = {"todo": ["generate-0", "prepare"], "status": [], "server_active": False}
    progress(event("runner_on_ok", "Keep this host's plan", ansible_facts={"eagle3_plan": plan}))
    # The settled plan, the same for this host: not said twice.
    progress(event("runner_on_ok", "Plan the run on this host", ansible_facts={"eagle3_plan": plan}))
    progress(
        event(
            "runner_on_ok",
            "Start the stage unless complete: generate-0",
            stdout=json.dumps({"stage": "generate-0", "state": "running", "started": True}),
        )
    )
    progress(
        event(
            "runner_retry",
            "Wait for the stage, reporting progress: generate-0",
            stdout=json.dumps(
                {"stage": "generate-0", "done": False, "progress": "generate: 10/200 rows, 0 failed, 700 tok/s"}
            ),
        )
    )
    progress(
        event(
            "runner_on_ok",
            "Wait for the stage, reporting progress: generate-0",
            stdout=json.dumps(
                {"stage": "generate-0", "done": True, "rc": 0, "duration_s": 12.5, "summary": {"done": 200}}
            ),
        )
    )
    progress(
        event(
            "runner_on_ok",
            "Start the stage unless complete: prepare",
            stdout=json.dumps({"stage": "prepare", "state": "complete", "started": False}),
        )
    )
    progress(
        event(
            "runner_on_failed",
            "Wait for the stage, reporting progress: train",
            msg="non-zero return code",
            stderr="stage train failed (exit 3)",
        )
    )
    text = out.getvalue()
    assert text.count("h1: to run: generate-0, prepare") == 1
    assert "generate-0 started" in text and "10/200 rows" in text and "generate-0 done in 12.5 s" in text
    assert "prepare already complete, skipped" in text
    assert "FAILED h1 | Wait for the stage, reporting progress: train" in text and "stage train failed (exit 3)" in text
    gen = progress.stages["h1/generate-0"]
    assert gen["rc"] == 0 and gen["summary"] == {"done": 200} and gen["finished"] >= gen["started"]
    assert progress.stages["h1/prepare"]["skipped"] is True
    assert progress.failures == [
        {"host": "h1", "task": "Wait for the stage, reporting progress: train", "play": "p",
         "message": "non-zero return code\nstage train failed (exit 3)"}
    ]  # fmt: skip
    assert progress.plan == {"h1": plan}


def test_speculators_metrics_lines_are_shortened() -> None:
    line = (
        "2026-12-02 22:55:46,593 speculators.metrics INFO {'train': {'loss_0': 1.05, 'loss': 3.25}, "
        "'profile': {'tokens_per_s': 464.1}, 'epoch': 1, 'lr': {'Muon': 0.003}, 'global_step': 12}"
    )
    assert driver.brief_progress(line) == "epoch 1 step 12 loss 3.250 464 tok/s"
    assert driver.brief_progress("generate: 10/200 rows") == "generate: 10/200 rows"
    prefixed = "2026-12-04 20:32:34,983 jobs.validate INFO validate trained: server up in 40 s; 0/16 prompts"
    assert driver.brief_progress(prefixed) == "validate trained: server up in 40 s; 0/16 prompts"
    assert driver.brief_progress("2026-12-04 20:32:34,983 jobs.generate WARNING server x not answering") == (
        "WARNING: server x not answering"
    )
    assert len(driver.brief_progress("x" * 500)) == 200


def test_eta_from_row_progress() -> None:
    record: dict = {}
    assert driver.estimate_eta(record, "generate: 10/200 rows, 0 failed, 700 tok/s", 100.0) == ""
    # 20 more rows in 10 s: 2 rows/s, 170 rows left -> 85 s
    assert driver.estimate_eta(record, "generate: 30/200 rows, 0 failed, 700 tok/s", 110.0) == ", ETA 1m25s"
    assert driver.estimate_eta(record, "generate: 200/200 rows", 120.0) == ""
    assert driver.estimate_eta({}, "epoch 1 step 3 loss 2.000 400 tok/s", 5.0) == ""


def test_failure_message_gives_the_cause_line_by_line() -> None:
    # What the pre-flight's fail task returns: a list, one problem per line (not a Python repr).
    preflight = {
        "msg": ["Pre-flight failed on h1 (2 problems):", "h1: GPU 3: memory used 80000 MiB", "h1: port 8000 in use"]
    }
    assert driver.failure_message(preflight) == "\n".join(preflight["msg"])
    # What vllm_server_wait returns when the load died: its error lines and journal are shown.
    died = {
        "msg": "vllm-gen.service died while loading the model: unit is failed.",
        "errors": ["HFValidationError: Repo id must be in the form 'repo_name': '/nonexistent'"],
        "journal": [f"line {i}" for i in range(60)],
    }
    text = driver.failure_message(died)
    assert "  HFValidationError: Repo id must be in the form 'repo_name': '/nonexistent'" in text.splitlines()
    assert text.splitlines()[-1] == "  line 59" and "  line 45" in text and "  line 44" not in text


def test_failure_summary_keeps_the_end_of_a_log_tail() -> None:
    message = "\n".join(["non-zero return code", "stage train failed (exit 1); log x:"] + [f"l{i}" for i in range(40)])
    message += "\nValueError: the real cause"
    summary = driver.failure_summary(message)
    assert summary.startswith("non-zero return code\nstage train failed")
    assert summary.endswith("ValueError: the real cause") and "l20" not in summary
    assert driver.failure_summary("short\nmessage") == "short\nmessage"


def test_each_invocation_keeps_its_manifest(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text('{"run": "before manifests were kept"}')
    first = driver.write_manifest(tmp_path, {"run": 1}, 1_000_000.0)
    second = driver.write_manifest(tmp_path, {"run": 2}, 1_000_000.0)  # same second: still its own file
    third = driver.write_manifest(tmp_path, {"run": 3}, 1_000_100.0)
    assert len({first, second, third}) == 3
    assert [json.loads(p.read_text())["run"] for p in (first, second, third)] == [1, 2, 3]
    latest = tmp_path / "manifest.json"
    assert latest.is_symlink() and json.loads(latest.read_text()) == {"run": 3}
    kept = sorted(p.name for p in tmp_path.glob("manifest-*.json"))
    assert len(kept) == 4 and any(name.endswith("-earlier.json") for name in kept)


def test_a_quiet_task_gets_a_line_now_and_then_and_the_server_wait_says_when_it_is_healthy() -> None:
    out = io.StringIO()
    progress = driver.Progress(out=out)
    progress(event("runner_on_start", "Install vLLM into the venv"))
    progress(event("runner_on_start", "Wait for the model to be served (fails at once if the unit dies)"))
    start = progress.running[("h1", "Install vLLM into the venv")]["started"]
    progress.tick(now=start + 10)
    assert out.getvalue() == ""  # not quiet for long yet
    progress.tick(now=start + driver.QUIET_S + 1)
    progress.tick(now=start + driver.QUIET_S + 2)  # said once a QUIET_S, not on every tick
    lines = out.getvalue().splitlines()
    assert len([x for x in lines if "h1: Install vLLM into the venv [61s, running]" in x]) == 1, lines
    progress.running[("h1", "Install vLLM into the venv")]["started"] -= 100
    progress(event("runner_on_ok", "Install vLLM into the venv", changed=True))
    assert "h1: Install vLLM into the venv done in 100 s" in out.getvalue()
    progress(
        event(
            "runner_on_ok", "Wait for the model to be served (fails at once if the unit dies)",
            unit="vllm-gen.service", main_pid=41, waited_s=43.4, models=["tiny"],
        )
    )  # fmt: skip
    assert "h1: vllm-gen.service healthy, serving ['tiny'] after 43 s" in out.getvalue()
    assert progress.running == {}


def test_the_last_lines_give_prompts_tokens_per_position_and_the_plot(tmp_path: Path) -> None:
    validation = tmp_path / "records" / "validation"
    validation.mkdir(parents=True)
    report = {
        "num_prompts": 32, "num_speculative_tokens": 3, "trained_over_untrained": 1.44,
        "drafters": {
            "trained": {"mean_acceptance_length": 1.44, "per_position": [0.26, 0.12, 0.06], "completion_tokens": 3523},
            "untrained": {"mean_acceptance_length": 1.0, "per_position": [0.0, 0.0, 0.0], "completion_tokens": 3600},
        },
    }  # fmt: skip
    (validation / "report.json").write_text(json.dumps(report))
    (validation / "acceptance.svg").write_text("<svg/>")
    args = argparse.Namespace(run_dir=tmp_path, inventory=[], tags="")
    result = driver.manifest(args, {}, driver.Progress(out=io.StringIO()), 0, "successful")
    assert result["validation_plot"] == str(validation / "acceptance.svg")
    lines = driver.validation_lines(result["validation"], result["validation_plot"])
    assert lines[0].startswith("validation on 32 held-out prompts, 3 speculative tokens")
    assert "  trained: 1.44  per position [0.26, 0.12, 0.06]  (3523 tokens)" in lines
    assert lines[-1] == f"  plot, per position: {validation / 'acceptance.svg'}"
