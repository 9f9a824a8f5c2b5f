"""jobs.train under torchrun: two CPU processes on the gloo backend (the multi-GPU path, minus the GPUs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from jobs import tiny_model
from tests.jobs.conftest import AUX_LAYER_IDS, Server, fused_training_data

ROOT = Path(__file__).resolve().parents[2]


def test_two_process_torchrun_trains_one_drafter_with_the_single_process_config(
    hs_server: Server, tmp_path: Path
) -> None:
    questions = tmp_path / "q.jsonl"
    questions.write_text(
        "".join(json.dumps({"id": f"d{i}", "prompt": q}) + "\n" for i, q in enumerate(tiny_model.corpus(48, seed=3)))
    )
    prepared = fused_training_data(
        hs_server, questions, tmp_path, rows=48, max_tokens=96, concurrency=16, seq_length=1024
    )

    config = tmp_path / "train.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "verifier": str(hs_server.model_path), "data": str(prepared), "out": str(tmp_path / "drafter"),
                "aux_layer_ids": AUX_LAYER_IDS, "draft_vocab_size": 512, "seq_length": 1024,
                "speculators": {"epochs": 1},
            }
        )
    )  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "jobs.train", "--config", str(config)]  # fmt: skip
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-4000:]
    assert "dp_size=2" in log, log[-3000:]
    final = tmp_path / "drafter" / "final"
    assert json.loads((tmp_path / "drafter" / "train-complete.json").read_text())["aux_layer_ids"] == AUX_LAYER_IDS

    single = subprocess.run(
        [sys.executable, "-m", "jobs.train", "--config", str(config), "--dry-run", str(tmp_path / "single")],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert single.returncode == 0, single.stderr[-3000:]
    # Same drafter config; only the saved dtype differs (training saves bf16, the dry run fp32).
    trained, untrained = (json.loads((d / "config.json").read_text()) for d in (final, tmp_path / "single"))
    assert {k: v for k, v in trained.items() if k != "dtype"} == {k: v for k, v in untrained.items() if k != "dtype"}
