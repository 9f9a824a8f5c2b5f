"""jobs.stage: completion markers, detached runs, resume after a kill (real processes, no mocks)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from jobs import stage as st

PY = sys.executable


def job(script: str) -> list[str]:
    return [PY, "-c", script]


WRITE_OUT = "import pathlib,sys; d=pathlib.Path(sys.argv[1]); d.mkdir(exist_ok=True); (d/'a.txt').write_text('x'*10); (d/'summary.json').write_text('{\"rows\": 3}'); print('rows 3/3')"


def run(stage: st.Stage, h: str, out: Path) -> dict:
    started = st.start(stage, h, [PY, "-c", WRITE_OUT, str(out)], [out], out / "summary.json")
    result = st.wait(stage, timeout=60)
    return {"start": started, "wait": result}


def test_complete_then_skipped_then_rerun_on_changed_inputs(tmp_path: Path) -> None:
    stage, out = st.Stage(tmp_path, "gen"), tmp_path / "out"
    assert st.status(stage, "h1") == {"stage": "gen", "state": "todo", "reason": "no completion marker"}
    first = run(stage, "h1", out)
    assert first["start"]["started"] is True
    assert first["wait"]["done"] and first["wait"]["rc"] == 0 and first["wait"]["summary"] == {"rows": 3}
    marker = json.loads(stage.marker.read_text())
    assert [Path(o["path"]).name for o in marker["outputs"]] == ["a.txt", "summary.json"]
    assert marker["outputs"][0]["size"] == 10 and len(marker["outputs"][0]["sha256"]) == 64
    assert st.status(stage, "h1")["state"] == "complete"
    assert st.start(stage, "h1", ["false"], [out], None)["started"] is False

    assert st.status(stage, "h2") == {"stage": "gen", "state": "todo", "reason": "inputs changed"}
    (out / "a.txt").write_text("shorter")
    assert "changed size" in st.status(stage, "h1")["reason"]
    (out / "a.txt").unlink()
    assert "is gone" in st.status(stage, "h1")["reason"]
    assert run(stage, "h1", out)["start"]["started"] is True
    assert st.status(stage, "h1")["state"] == "complete"


def test_a_failed_job_leaves_no_marker_and_reports_its_log(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    stage = st.Stage(tmp_path, "train")
    argv = ["start", "--dir", str(tmp_path), "--name", "train", "--inputs-hash", "h", "--output", str(tmp_path / "o")]
    assert st.main([*argv, "--", PY, "-c", "import sys; print('boom: no hidden states'); sys.exit(3)"]) == 0
    assert st.main(["wait", "--dir", str(tmp_path), "--name", "train", "--timeout", "60"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out.splitlines()[-1])["rc"] == 3
    assert "boom: no hidden states" in err
    assert not stage.marker.exists()
    assert st.status(stage, "h")["state"] == "todo"


def test_a_job_whose_outputs_are_missing_is_not_complete(tmp_path: Path) -> None:
    stage = st.Stage(tmp_path, "prepare")
    st.start(stage, "h", ["true"], [tmp_path / "never-written"], None)
    result = st.wait(stage, timeout=60)
    assert result["rc"] == 70 and "outputs are not complete" in result["log_tail"]
    assert not stage.marker.exists()


def test_running_stage_is_attached_to_and_a_killed_one_restarts(tmp_path: Path) -> None:
    stage, out = st.Stage(tmp_path, "gen"), tmp_path / "out"
    slow = "import time; print('working', flush=True); time.sleep(60)"
    assert st.start(stage, "h", [PY, "-c", slow], [out], None)["started"] is True
    time.sleep(0.5)
    assert st.status(stage, "h")["state"] == "running"
    again = st.start(stage, "h", [PY, "-c", slow], [out], None)
    assert again["started"] is False and again["state"] == "running"
    pending = st.wait(stage, timeout=2)
    assert pending["done"] is False and pending["progress"] == "working"

    # The host "dies": supervisor and job are killed together, nothing is recorded.
    os.killpg(int(stage.file("pid").read_text()), signal.SIGKILL)
    deadline = time.monotonic() + 10
    while st.status(stage, "h")["state"] == "running" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert st.status(stage, "h")["state"] == "todo"
    assert run(stage, "h", out)["wait"]["rc"] == 0
    assert st.status(stage, "h")["state"] == "complete"


def test_concurrent_atomic_writes_to_one_file_do_not_collide(tmp_path: Path) -> None:
    # `start` and the supervisor it spawns both write <stage>.pid; a shared temporary name let one
    # rename the other's file away (FileNotFoundError), killing the supervisor before its log.
    from concurrent.futures import ThreadPoolExecutor

    target = tmp_path / "x.pid"

    def write(i: int) -> None:
        for _ in range(200):
            st.write_atomic(target, f"{i}\n")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(write, range(8)))  # re-raises any writer's exception
    assert target.read_text().strip() in {str(i) for i in range(8)}
    assert [p.name for p in tmp_path.iterdir()] == ["x.pid"]  # no temporary file left behind
