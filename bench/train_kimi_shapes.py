"""Drafter training throughput at Kimi-K2.5 shapes: jobs.train vs speculators' own CLI, one run.

Not a test. On one GPU it builds a Kimi-K2.5-shaped verifier stub (nested ``text_config``,
``language_model.`` weight names, sharded safetensors: only ``embed_tokens`` and ``lm_head``, at
hidden 7168 and vocab 163840), a prepared dataset of 4096-token rows with random tokens, and random
bf16 hidden states ``[4096, 4, 7168]`` per row (aux layers 2/30/58 + the last). Then it trains the
same drafter (draft vocab 32000) on the same data with each variant for ``--steps`` steps and
reports steady-state tokens/s (steps after ``--warmup``), peak GPU memory, and MFU against the
measured bf16 matmul rate, plus each variant's ratio to the first (the peer).

    python bench/train_kimi_shapes.py --work /tmp/bench --out results.json \\
        --variant 'peer=speculators' --variant 'ours=jobs'

A variant flag ``world1`` (not passed on) runs it as rank 0 of a one-process torch.distributed
world, with the environment torchrun would set: speculators' distributed path (NCCL, DDP, or FSDP
with ``fsdp_shard``) on one GPU, in-process so its peak memory is still measured.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jobs.train_kernels import last_error_line  # noqa: E402

HIDDEN, VOCAB, DRAFT_VOCAB, SEQ = 7168, 163840, 32000, 4096
AUX = [2, 30, 58]


def build_data(work: Path, rows: int) -> tuple[Path, Path]:
    import torch
    from datasets import Dataset
    from safetensors.torch import save_file

    from tests.support import verifier_stub

    verifier = work / "verifier"
    if not (verifier / "model.safetensors.index.json").exists():
        verifier_stub.build(verifier, HIDDEN, VOCAB)
    data = work / "data"
    hs = data / "hidden_states"
    if not (data / "done").exists():
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, VOCAB, (rows, SEQ), generator=gen)
        mask = torch.ones(rows, SEQ, dtype=torch.long)
        mask[:, :256] = 0
        table = Dataset.from_dict({"input_ids": ids.tolist(), "loss_mask": mask.tolist(), "seq_len": [SEQ] * rows})
        table.set_format("torch")  # as speculators prepare-data saves it
        table.save_to_disk(str(data))
        freq = torch.bincount(ids.flatten(), minlength=VOCAB)
        torch.save({int(i): int(c) for i, c in enumerate(freq.tolist()) if c}, data / "token_freq.pt")
        hs.mkdir(parents=True, exist_ok=True)
        cuda = torch.Generator(device="cuda").manual_seed(1)
        for i in range(rows):
            states = torch.randn(SEQ, len(AUX) + 1, HIDDEN, device="cuda", generator=cuda, dtype=torch.bfloat16)
            save_file({"hidden_states": states.cpu(), "token_ids": ids[i].clone()}, str(hs / f"hs_{i}.safetensors"))
        (data / "done").write_text("ok\n")
    return verifier, data


def common_flags(verifier: Path, data: Path, save: Path, steps: int) -> dict[str, object]:
    return {
        "verifier-name-or-path": str(verifier), "trust-remote-code": True, "speculator-type": "eagle3",
        "draft-arch": "llama", "data-path": str(data), "save-path": str(save), "log-dir": str(save / "logs"),
        "target-layer-ids": AUX, "draft-vocab-size": DRAFT_VOCAB, "token-freq-path": str(data / "token_freq.pt"),
        "mask-token-id": 0, "epochs": 1, "max-steps": steps,
    }  # fmt: skip


def flags_to_argv(flags: dict[str, object]) -> list[str]:
    argv: list[str] = []
    for key, value in flags.items():
        if value is True:
            argv.append(f"--{key}")
        elif isinstance(value, list):
            argv += [f"--{key}", *map(str, value)]
        elif value is not False:
            argv += [f"--{key}", str(value)]
    return argv


def variant_command(
    kind: str, extra: dict[str, object], verifier: Path, data: Path, save: Path, steps: int
) -> list[str]:
    """``speculators``: its CLI with the flags the peer measurement used; ``jobs``: our job's defaults."""
    flags = common_flags(verifier, data, save, steps)
    if kind == "speculators":
        flags |= {"draft-attn-impl": "sdpa"} | extra
        return [sys.executable, "-m", "speculators.train", *flags_to_argv(flags)]
    import yaml

    config = save.parent / f"{save.name}.yaml"
    passthrough = {k.replace("-", "_"): v for k, v in (flags | extra).items() if k in ("mask-token-id", "epochs", "max-steps") or k in extra}  # fmt: skip
    config.write_text(
        yaml.safe_dump(
            {
                "verifier": str(verifier),
                "data": str(data),
                "out": str(save),
                "aux_layer_ids": AUX,
                "draft_vocab_size": DRAFT_VOCAB,
                "seq_length": 8192,
                "device": "cuda",
                "trust_remote_code": True,
                "speculators": passthrough,
            }
        )
    )
    return [sys.executable, "-m", "jobs.train", "--config", str(config)]


# jobs.train's record of the kernels it chose (jobs.train_kernels)
KERNELS = re.compile(r"kernels: (.+)")


# speculators' per-step profile (device-synchronized), as a dict (plain logging, under jobs.train)
# or as rich key=value cells (its own CLI).
STEP_MS = re.compile(r"(?:'step_ms': |step_ms=)([0-9.e+]+)")
PHASES = {phase: re.compile(rf"(?:'{phase}_ms': |{phase}_ms=)([0-9.e+]+)") for phase in ("fwd", "bwd", "opt")}


def steady_rate(log: str, warmup: int, tokens_per_step: int) -> dict[str, float]:
    """Tokens/s over the steps after ``warmup`` (every row is 4096 tokens, so a step's token count is known)."""
    steps = [float(ms) / 1000 for ms in STEP_MS.findall(log)]
    after = steps[warmup:]
    if len(after) < 2:
        raise RuntimeError(f"too few profiled steps after warm-up {warmup}: {len(steps)} in all")
    return {
        "steps_timed": len(after),
        "tokens_per_step": tokens_per_step,
        "tokens_per_s": round(tokens_per_step * len(after) / sum(after), 1),
        "median_step_s": round(statistics.median(after), 3),
        "first_step_s": round(steps[0], 1),
    } | {
        f"median_{phase}_s": round(statistics.median(float(ms) / 1000 for ms in found[warmup:]), 3)
        for phase, pattern in PHASES.items()
        if len(found := pattern.findall(log)) > warmup
    }


def trainable_flops_per_token(checkpoint_dir: Path) -> float:
    """6·P per token for trained matrices, per TTT step (3), plus the frozen verifier lm_head forward."""
    from safetensors import safe_open

    trained = 0
    for f in checkpoint_dir.glob("*.safetensors"):
        with safe_open(f, framework="pt") as st:
            for key in st.keys():  # noqa: SIM118 - safe_open is not iterable
                shape = st.get_slice(key).get_shape()
                if len(shape) == 2 and "embed_tokens" not in key and "verifier_lm_head" not in key:
                    trained += shape[0] * shape[1]
    return 3 * 6 * trained + 2 * VOCAB * HIDDEN


def matmul_tflops() -> float:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    return 2 * 8192**3 * 20 / (time.perf_counter() - start) / 1e12


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument(
        "--variant", action="append", required=True,
        help="NAME=KIND[,flag=value...]; KIND is speculators (its CLI) or jobs (jobs.train)",
    )  # fmt: skip
    args = parser.parse_args()
    started = time.monotonic()
    verifier, data = build_data(args.work, args.rows)
    print(f"data ready in {time.monotonic() - started:.0f} s", flush=True)
    peak_tflops = matmul_tflops()
    results = []
    for spec in args.variant:
        name, _, rest = spec.partition("=")
        kind, *pairs = rest.split(",")
        extra: dict[str, object] = {}
        for pair in pairs:
            key, _, value = pair.partition("=")
            extra[key] = True if value == "" else (int(value) if value.isdigit() else value)
        world1 = extra.pop("world1", False)
        save = args.work / "runs" / name
        subprocess.run(["rm", "-rf", str(save)], check=True)
        save.mkdir(parents=True)
        cmd = variant_command(kind, extra, verifier, data, save, args.steps)
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        if world1:
            env |= {"LOCAL_RANK": "0", "RANK": "0", "LOCAL_WORLD_SIZE": "1", "WORLD_SIZE": "1",
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}  # fmt: skip
        wrapped = [sys.executable, str(ROOT / "bench" / "peak_memory.py"), *cmd[1:]]
        proc = subprocess.run(wrapped, cwd=ROOT, env=env, capture_output=True, text=True)
        log = proc.stdout + proc.stderr
        (args.out.parent / f"log-{name}.txt").write_text(log[-200_000:])
        row: dict[str, object] = {"name": name, "kind": kind, "extra": extra | ({"world1": True} if world1 else {}),
                                  "rc": proc.returncode}  # fmt: skip
        if proc.returncode:
            row["failure"] = last_error_line(log)
        chosen = KERNELS.findall(log)
        if chosen:
            row["kernels"] = chosen[-1]
        peak = re.search(r"PEAK_MEMORY_GIB=([0-9.]+)", log)
        row["peak_memory_gib"] = float(peak.group(1)) if peak else None
        try:
            seq = int(extra.get("total-seq-len", 8192))  # type: ignore[call-overload]
            row |= steady_rate(log, args.warmup, seq // SEQ * SEQ)
            ckpt = next((p for p in sorted((save / "checkpoints").glob("*")) if p.is_dir() and p.name.isdigit()), None)
            ckpt = ckpt or next(iter(sorted((save).rglob("config.json"))), Path(".")).parent
            flops = trainable_flops_per_token(ckpt)
            row["mfu"] = round(row["tokens_per_s"] * flops / (peak_tflops * 1e12), 4)  # type: ignore[operator]
        except (RuntimeError, StopIteration, OSError, TypeError, ValueError) as err:
            row["error"] = str(err)[-500:]
        results.append(row)
        print(json.dumps(row), flush=True)
    base = results[0].get("tokens_per_s")
    for row in results:
        if base and row.get("tokens_per_s"):
            row["ratio_to_first"] = round(row["tokens_per_s"] / base, 3)  # type: ignore[operator]
    report = {"measured_bf16_matmul_tflops": round(peak_tflops, 1), "rows": args.rows, "steps": args.steps,
              "warmup": args.warmup, "results": results}  # fmt: skip
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'name':<14}{'tok/s':>10}{'ratio':>8}{'peak GiB':>10}{'MFU':>8}  rc")
    for row in results:
        print(f"{row['name']:<14}{row.get('tokens_per_s', '-')!s:>10}{row.get('ratio_to_first', '-')!s:>8}"
              f"{row.get('peak_memory_gib', '-')!s:>10}{row.get('mfu', '-')!s:>8}  {row['rc']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
