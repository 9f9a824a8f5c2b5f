"""jobs.train under torchrun: two CPU processes on the gloo backend (the multi-GPU path, minus the
GPUs), fully sharded (speculators' ``fsdp_shard``, torch FSDP2). Data parallel (DDP, the default)
runs in molecule/pipeline's Kimi-K2.5 rehearsal: two hosts, one process each, killed and resumed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.jobs.conftest import AUX_LAYER_IDS, Server, fused_training_data
from tests.support import tiny_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def prepared(hs_server: Server, tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("distributed-data")
    questions = work / "q.jsonl"
    questions.write_text(
        "".join(json.dumps({"id": f"d{i}", "prompt": q}) + "\n" for i, q in enumerate(tiny_model.corpus(48, seed=3)))
    )
    return fused_training_data(hs_server, questions, work, rows=48, max_tokens=96, concurrency=16, seq_length=1024)


def test_two_process_fsdp_torchrun_trains_one_drafter_with_the_single_process_config(
    hs_server: Server, prepared: Path, tmp_path: Path
) -> None:
    config = tmp_path / "train.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "verifier": str(hs_server.model_path), "data": str(prepared), "out": str(tmp_path / "drafter"),
                "aux_layer_ids": AUX_LAYER_IDS, "draft_vocab_size": 512, "seq_length": 1024,
                "speculators": {"epochs": 1, "fsdp_shard": True},
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
    node = json.loads((tmp_path / "drafter" / "nodes" / "node-0.json").read_text())
    assert (node["node_rank"], node["world_size"], node["local_world_size"]) == (0, 2, 2)
    assert json.loads((tmp_path / "drafter" / "train-complete.json").read_text())["aux_layer_ids"] == AUX_LAYER_IDS
    # FSDP checkpoints are written by every rank (torch.distributed.checkpoint) and gathered into
    # one safetensors file; DDP's by rank 0. Either way vLLM needs one loadable weights file.
    assert (final / "model.safetensors").stat().st_size > 0

    single = subprocess.run(
        [sys.executable, "-m", "jobs.train", "--config", str(config), "--dry-run", str(tmp_path / "single")],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert single.returncode == 0, single.stderr[-3000:]
    # Same drafter config; only the saved dtype differs (training saves bf16, the dry run fp32).
    trained, untrained = (json.loads((d / "config.json").read_text()) for d in (final, tmp_path / "single"))
    assert {k: v for k, v in trained.items() if k != "dtype"} == {k: v for k, v in untrained.items() if k != "dtype"}
    # The trained weights have the untrained drafter's tensors, names and shapes (no FSDP prefixes).
    from safetensors import safe_open

    def shapes(path: Path) -> dict[str, tuple[int, ...]]:
        with safe_open(str(path / "model.safetensors"), "pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118

    assert shapes(final) == shapes(tmp_path / "single")
