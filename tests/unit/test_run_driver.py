"""jobs.run: extra vars, stage events to progress lines and timings (events as ansible-runner emits them)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
import yaml

from jobs import run
from jobs import stage as st
from tests.conftest import ROOT


def test_extra_vars_parse_like_ansible(tmp_path: Path) -> None:
    f = tmp_path / "vars.yml"
    f.write_text("a: 1\nb: [x, y]\n")
    # key=value gives strings, as ansible-playbook -e does; JSON/YAML keeps its types.
    parsed = run.parse_extra_vars(["@" + str(f), "a=2", "c=", "d=true", '{"eagle3_aux_layer_ids": [1, 3, 4]}'])
    assert parsed == {"a": "2", "b": ["x", "y"], "c": "", "d": "true", "eagle3_aux_layer_ids": [1, 3, 4]}
    with pytest.raises(SystemExit, match="-e"):
        run.parse_extra_vars(["[1, 2]"])  # not a mapping
    assert run.extra_vars_args(["@vars.yml", "a=b c"]) == ["-e", f"@{Path('vars.yml').resolve()}", "-e", "a=b c"]


def test_stage_events_are_known_by_what_jobs_stage_prints(tmp_path: Path) -> None:
    # The real answers of jobs.stage start/wait/status (what roles/eagle3/tasks/stage.yml runs),
    # whatever the task that ran them is called.
    stage = st.Stage(tmp_path, "generate-0")
    out = tmp_path / "out"
    cmd = [sys.executable, "-c", f"import pathlib; pathlib.Path({str(out)!r}).write_text('x')"]
    started = st.start(stage, "h", cmd, [out], None)
    waited = st.wait(stage, timeout=60)
    status = st.status(stage, "h")
    assert run.stage_of({"stdout": json.dumps(started)}) == ("generate-0", "start")
    assert run.stage_of({"stdout": json.dumps(waited)}) == ("generate-0", "wait")
    assert run.stage_of({"stdout": json.dumps(status)}) is None
    assert run.stage_of({"stdout": "not json"}) is None


def test_the_stage_tasks_print_what_the_driver_reads() -> None:
    # stage.yml runs jobs.stage start and wait and leaves their stdout as they printed it.
    tasks = yaml.safe_load((ROOT / "roles/eagle3/tasks/stage.yml").read_text())
    argv = [json.dumps(t["ansible.builtin.command"]["argv"]) for t in tasks]
    assert "'start'" in argv[0] and '"wait"' in argv[1]


def event(kind: str, task: str, host: str = "h1", **res: object) -> dict:
    return {"event": kind, "event_data": {"host": host, "task": task, "play": "p", "res": res}}


def test_progress_follows_a_stage_and_records_failures() -> None:
    out = io.StringIO()
    progress = run.Progress(out=out)
    progress({"event": "playbook_on_play_start", "event_data": {"play": "Generate"}})
    plan = {"todo": ["generate-0", "prepare"], "status": [], "server_active": False}
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
                {"stage": "generate-0", "done": False, "progress": "generate: 10/200 rows, 0 errors, 700 tok/s"}
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
    assert "h1: to run: generate-0, prepare" in text
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
    assert run.brief_progress(line) == "epoch 1 step 12 loss 3.250 464 tok/s"
    assert run.brief_progress("generate: 10/200 rows") == "generate: 10/200 rows"
    assert len(run.brief_progress("x" * 500)) == 200


def test_eta_from_row_progress() -> None:
    record: dict = {}
    assert run.estimate_eta(record, "generate: 10/200 rows, 0 errors, 700 tok/s", 100.0) == ""
    # 20 more rows in 10 s: 2 rows/s, 170 rows left -> 85 s
    assert run.estimate_eta(record, "generate: 30/200 rows, 0 errors, 700 tok/s", 110.0) == ", ETA 1m25s"
    assert run.estimate_eta(record, "generate: 200/200 rows", 120.0) == ""
    assert run.estimate_eta({}, "epoch 1 step 3 loss 2.000 400 tok/s", 5.0) == ""
