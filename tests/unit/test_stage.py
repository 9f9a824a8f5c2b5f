"""jobs.stage: completion markers, detached runs, resume after a kill (real processes, no mocks)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

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
    assert first["wait"]["done"] and first["wait"]["rc"] == 0 and first["wait"]["summary"] == {"rows": 3}, first
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


# A resumable job: appends one line per run to out/rows.txt (keeping what is there, as
# jobs.generate keeps finished rows) and to the checkpoint it owns beside its output; it takes
# the line from argv, so each run's inputs are visible in what it wrote.
APPEND = (
    "import pathlib,sys; d=pathlib.Path(sys.argv[1]); d.mkdir(exist_ok=True); c=pathlib.Path(sys.argv[2]);"
    " [open(p,'a').write(sys.argv[3]+'\\n') for p in (d/'rows.txt', c)]"
)


def append_run(stage: st.Stage, h: str, out: Path, ckpt: Path, line: str) -> dict:
    started = st.start(stage, h, [PY, "-c", APPEND, str(out), str(ckpt), line], [out], None, owns=[out, ckpt])
    assert st.wait(stage, timeout=60)["rc"] == 0
    return started


def test_changed_inputs_delete_every_owned_path_before_the_job_starts(tmp_path: Path) -> None:
    stage, out, ckpt = st.Stage(tmp_path, "gen"), tmp_path / "gen", tmp_path / "ckpt.txt"
    assert append_run(stage, "h1", out, ckpt, "t=0.0")["discarded"] == []
    assert (out / "rows.txt").read_text() == "t=0.0\n"

    again = append_run(stage, "h2", out, ckpt, "t=0.3")
    assert again["discarded"] == sorted([str(out), str(ckpt)]) and again["resumed"] is False
    # Rebuilt from nothing: no row and no checkpoint of the old inputs survives.
    assert (out / "rows.txt").read_text() == "t=0.3\n" and ckpt.read_text() == "t=0.3\n"
    assert "inputs changed" in stage.file("log").read_text()
    assert not list(stage.state_dir.glob(".discard-*"))  # nothing left in the trash
    assert st.status(stage, "h2")["state"] == "complete"


def test_an_interrupted_stage_with_the_same_inputs_resumes_from_its_partial_output(tmp_path: Path) -> None:
    stage, out, ckpt = st.Stage(tmp_path, "gen"), tmp_path / "gen", tmp_path / "ckpt.txt"
    append_run(stage, "h1", out, ckpt, "first")
    stage.marker.unlink()  # as if the host died after the job's writes, before the marker
    again = append_run(stage, "h1", out, ckpt, "second")
    assert again["resumed"] is True and again["discarded"] == []
    assert (out / "rows.txt").read_text() == "first\nsecond\n" and ckpt.read_text() == "first\nsecond\n"


def test_outputs_of_unknown_origin_are_not_reused(tmp_path: Path) -> None:
    # Files already in place with no start recorded for them (copied in, or left by a run whose
    # .stages was removed) were made under unknown inputs.
    stage, out, ckpt = st.Stage(tmp_path, "gen"), tmp_path / "gen", tmp_path / "ckpt.txt"
    out.mkdir()
    (out / "rows.txt").write_text("stale\n")
    assert append_run(stage, "h", out, ckpt, "fresh")["discarded"] == [str(out)]
    assert (out / "rows.txt").read_text() == "fresh\n"


def test_owned_paths_outside_the_run_directory_are_refused(tmp_path: Path) -> None:
    run_dir, elsewhere = tmp_path / "run", tmp_path / "precious"
    run_dir.mkdir()
    elsewhere.mkdir()
    stage = st.Stage(run_dir, "gen")
    try:
        st.start(stage, "h", ["true"], [run_dir / "out"], None, owns=[elsewhere])
    except ValueError as err:
        assert "not inside its run directory" in str(err)
    else:
        raise AssertionError("an owned path outside the run directory was accepted")
    assert elsewhere.is_dir()


def test_own_pids_are_the_running_stages_process_trees(tmp_path: Path) -> None:
    stage = st.Stage(tmp_path, "train")
    # The job starts a child of its own (torchrun starts workers): both belong to the run.
    tree = "import subprocess,sys,time; subprocess.Popen([sys.executable,'-c','import time; time.sleep(60)']); time.sleep(60)"
    st.start(stage, "h", [PY, "-c", tree], [tmp_path / "o"], None)
    stranger = __import__("subprocess").Popen([PY, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 20
        while len(st.own_pids(tmp_path, [])) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        pids = st.own_pids(tmp_path, [])
        supervisor = int(stage.file("pid").read_text())
        assert supervisor in pids and len(pids) == 3  # supervisor, job, the job's child
        assert stranger.pid not in pids and os.getpid() not in pids
        assert st.own_pids(tmp_path, ["no-such-unit.service"]) == pids
    finally:
        os.killpg(int(stage.file("pid").read_text()), signal.SIGKILL)
        stranger.kill()
        stranger.wait()
    deadline = time.monotonic() + 10
    while st.own_pids(tmp_path, []) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert st.own_pids(tmp_path, []) == []


def test_a_stage_does_not_start_before_the_stages_it_reads(tmp_path: Path) -> None:
    """As with `--tags prepare` after generation's inputs changed: prepare must not run on the old rows."""
    gen, prep = st.Stage(tmp_path, "gen"), st.Stage(tmp_path, "prep")
    run(gen, "g1", tmp_path / "rows")
    cmd = [PY, "-c", WRITE_OUT, str(tmp_path / "prepared")]
    try:
        st.start(prep, "p2", cmd, [tmp_path / "prepared"], None, after={"gen": "g2"})
    except st.UpstreamIncomplete as err:
        assert "prep reads the outputs of gen" in str(err) and "inputs changed" in str(err)
        assert "--tags (gen,prep)" in str(err)
    else:
        raise AssertionError("prep started before gen was complete for its inputs")
    assert not prep.file("request.json").exists()  # nothing was started or removed
    assert st.start(prep, "p1", cmd, [tmp_path / "prepared"], None, after={"gen": "g1"})["started"] is True
    assert st.wait(prep, timeout=60)["rc"] == 0
    # The CLI says the same, exit 2.
    rc = st.main(["start", "--dir", str(tmp_path), "--name", "other", "--inputs-hash", "x", "--after", "gen=g2",
                  "--output", str(tmp_path / "o"), "--", "true"])  # fmt: skip
    assert rc == 2


def test_wait_reads_the_rc_of_a_stage_that_exits_between_its_two_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor writes its rc and exits after wait found no rc file but before it asks
    whether the supervisor lives (seen in CI as rc -1 for a stage that had finished)."""
    stage = st.Stage(tmp_path, "gen")
    stage.state_dir.mkdir(parents=True)

    def exits_now(pid_file: Path) -> bool:
        stage.file("rc").write_text("0\n")
        return False

    monkeypatch.setattr(st, "pid_alive", exits_now)
    assert st.wait(stage, timeout=5, poll=0.01)["rc"] == 0


def fake_proc(root: Path, pid: int, state: str, cmdline: bytes) -> Path:
    """A /proc entry as the kernel shows it (a real exec is too brief to catch on purpose)."""
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "stat").write_text(f"{pid} (python (x)) {state} 1 {pid} {pid} 0 -1\n")
    (root / str(pid) / "cmdline").write_bytes(cmdline)
    return root


def test_a_supervisor_still_inside_exec_is_alive_once_its_arguments_appear(tmp_path: Path) -> None:
    import threading

    pid_file = tmp_path / "gen.pid"
    pid_file.write_text("4242\n")
    proc = fake_proc(tmp_path / "proc", 4242, "R", b"")  # exec has not placed the arguments yet
    threading.Timer(
        0.2, lambda: (proc / "4242" / "cmdline").write_bytes(b"python\0-m\0jobs.stage\0_supervise\0")
    ).start()
    assert st.pid_alive(pid_file, proc=proc, settle_s=5) is True


def test_a_zombie_or_a_process_that_stays_without_arguments_is_not_a_supervisor(tmp_path: Path) -> None:
    pid_file = tmp_path / "gen.pid"
    pid_file.write_text("4242\n")
    assert st.pid_alive(pid_file, proc=fake_proc(tmp_path / "a", 4242, "S", b""), settle_s=0.1) is False
    assert st.pid_alive(pid_file, proc=fake_proc(tmp_path / "b", 4242, "S", b"bash\0"), settle_s=5) is False

    # A real zombie: a child that exited and was not reaped; its cmdline named jobs.stage while it ran.
    import subprocess

    child = subprocess.Popen([PY, "-c", "pass", "jobs.stage"])
    pid_file.write_text(f"{child.pid}\n")
    deadline = time.monotonic() + 20
    while st.stat_fields(Path(f"/proc/{child.pid}/stat"))[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert st.pid_alive(pid_file) is False
    child.wait()
    assert st.pid_alive(pid_file) is False  # reaped: no /proc entry at all


def test_a_command_that_cannot_be_started_fails_the_stage_with_the_reason(tmp_path: Path) -> None:
    stage = st.Stage(tmp_path, "gen")
    st.start(stage, "h", [str(tmp_path / "no-such-program")], [tmp_path / "o"], None)
    result = st.wait(stage, timeout=60)
    assert result["rc"] == 127, result
    assert "no-such-program" in result["log_tail"] and "No such file" in result["log_tail"]
    assert not stage.marker.exists()
