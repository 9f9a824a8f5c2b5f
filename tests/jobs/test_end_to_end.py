"""generate → prepare → extract → train → validate on the tiny target, CPU only, real vLLM servers.

The drafter is trained with speculators on the target's own answers (fused hidden-state capture),
killed mid-epoch once and resumed, and then measured in vLLM as an eagle3 speculative model
against an untrained drafter of the same config on held-out prompts at temperature 0.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from jobs import tiny_model, validate
from tests.jobs.conftest import AUX_LAYER_IDS, CPU_SERVER_ARGS, Server, fused_training_data

ROOT = Path(__file__).resolve().parents[2]


def write_prompts(path: Path, lines: list[str], prefix: str) -> Path:
    path.write_text("".join(json.dumps({"id": f"{prefix}{i}", "prompt": line}) + "\n" for i, line in enumerate(lines)))
    return path


def wait_for(predicate, proc: subprocess.Popen[bytes], what: str, timeout: float = 900) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"training exited with {proc.returncode} before {what}"
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(1)


def test_trained_drafter_beats_an_untrained_one_in_vllm(hs_server: Server, tmp_path: Path) -> None:
    corpus = tiny_model.corpus(400, seed=11)
    train_prompts = write_prompts(tmp_path / "train.jsonl", corpus[:200], "t")
    heldout = write_prompts(tmp_path / "heldout.jsonl", corpus[300:316], "h")

    prepared = fused_training_data(
        hs_server, train_prompts, tmp_path, rows=200, max_tokens=160, concurrency=32, seq_length=2048
    )

    out = tmp_path / "drafter"
    config = tmp_path / "train.yaml"
    train_settings = {
        "verifier": str(hs_server.model_path),
        "data": str(prepared),
        "out": str(out),
        "aux_layer_ids": AUX_LAYER_IDS,
        "draft_vocab_size": 1024,
        "seq_length": 2048,
        "speculators": {"epochs": 5, "lr": 0.003},
    }
    config.write_text(yaml.safe_dump(train_settings))
    cmd = [sys.executable, "-m", "jobs.train", "--config", str(config)]

    # Kill the first run after its first sub-epoch checkpoint, mid-epoch.
    log1 = (tmp_path / "train-1.log").open("w")
    first = subprocess.Popen(cmd, cwd=ROOT, stdout=log1, stderr=subprocess.STDOUT, start_new_session=True)
    checkpoints = out / "checkpoints"
    wait_for(
        lambda: any(p.name.startswith("epoch0_step") for p in checkpoints.glob("*")), first, "mid-epoch checkpoint"
    )
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    assert not (out / "final").exists()

    second = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    log2 = second.stdout + second.stderr
    assert "Resuming mid-epoch" in log2 or "Fast-skipping" in log2, log2[-3000:]
    final = json.loads((out / "train-complete.json").read_text())
    assert final["aux_layer_ids"] == AUX_LAYER_IDS

    # Whether <out> is still good for its inputs is the stage layer's call (jobs.stage), not the
    # job's: run again by hand with every epoch done, it resumes at the end and makes final/ again
    # from the last checkpoint.
    shutil.rmtree(out / "final")
    third = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert third.returncode == 0, third.stderr[-2000:]
    assert json.loads((out / "final" / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == AUX_LAYER_IDS

    untrained = tmp_path / "untrained"
    dry = subprocess.run([*cmd, "--dry-run", str(untrained)], cwd=ROOT, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr[-3000:]

    report = validate.validate(
        hs_server.model_path, {"trained": out / "final", "untrained": untrained}, heldout, tmp_path / "validation",
        k=3, max_tokens=128, server_args=CPU_SERVER_ARGS,
    )  # fmt: skip
    trained = report["drafters"]["trained"]["mean_acceptance_length"]
    baseline = report["drafters"]["untrained"]["mean_acceptance_length"]
    assert trained >= 1.3 * baseline and trained >= baseline + 0.3, json.dumps(report, indent=2)
    assert (tmp_path / "validation" / "acceptance.svg").read_text().startswith("<svg")
