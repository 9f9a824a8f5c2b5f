"""Train an EAGLE-3 drafter with speculators, from one YAML config.

The config names the verifier (target) model, the prepared dataset (``jobs.prepare``) with its
hidden states (``jobs.extract``), the target layers the hidden states were taken from, and the
training settings. Anything under ``speculators:`` is passed to speculators' ``TrainConfig`` as
``--<key>`` flags, so every speculators option stays reachable::

    verifier: /srv/models/tiny
    data: runs/x/prepared                # hidden states in <data>/hidden_states
    out: runs/x/drafter                  # checkpoints; the final one is <out>/final
    aux_layer_ids: [1, 2, 3]             # extraction captured these plus the last layer
    draft_vocab_size: 32000              # clipped to the verifier's vocabulary
    seq_length: 2048
    device: auto                         # auto | cpu | cuda
    hidden_states: offline               # offline | online (made per step by `endpoint`, then deleted)
    hidden_states_dtype: bf16            # bf16 | fp8 (jobs.extract --hidden-states-dtype fp8 files)
    endpoint: null
    speculators: {epochs: 3, lr: 0.0003}

    python -m jobs.train --config train.yaml
    torchrun --nproc-per-node 8 -m jobs.train --config train.yaml      # one node, 8 GPUs
    torchrun --nnodes 2 --node-rank R --master-addr H ... -m jobs.train --config train.yaml

An interrupted run resumes from speculators' last checkpoint (sub-epoch checkpoints are on by
default; a run whose epochs are all done only makes ``<out>/final`` again). Whether ``<out>`` is
still good for the data and config is decided by the stage layer (``jobs.stage`` deletes it
when the stage's inputs changed), not here. Each node
records its part in ``<out>/nodes/node-<r>.json`` (node rank, world size) when training ends. After
training, the checkpoint's ``eagle_aux_hidden_state_layer_ids`` is checked against the config:
a silently defaulted layer list would load in vLLM and collapse acceptance.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from jobs import extract, text_processor, train_kernels
from jobs.stage import write_atomic

LOG = logging.getLogger("jobs.train")
MARKER = "train-complete.json"


class ConfigError(ValueError):
    pass


@dataclass
class TrainSettings:
    verifier: str
    data: str
    out: str
    aux_layer_ids: list[int]
    draft_vocab_size: int = 32000
    seq_length: int = 8192
    device: str = "auto"
    hidden_states: str = "offline"
    # How the hidden-state files store the states: bf16, or fp8 (jobs.extract --hidden-states-dtype
    # fp8; read through speculators' --hidden-states-backend fp8, which dequantizes them to bf16).
    hidden_states_dtype: str = "bf16"
    endpoint: str | None = None
    trust_remote_code: bool = False
    speculators: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> TrainSettings:
        raw = yaml.safe_load(path.read_text()) or {}
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError(f"{path}: unknown keys {unknown}; known: {sorted(known)}")
        missing = sorted(k for k in ("verifier", "data", "out", "aux_layer_ids") if k not in raw)
        if missing:
            raise ConfigError(f"{path}: missing required keys {missing}")
        settings = cls(**raw)
        settings.check()
        return settings

    def check(self) -> None:
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"device must be auto, cpu or cuda, not {self.device!r}")
        if self.hidden_states not in ("offline", "online"):
            raise ConfigError(f"hidden_states must be offline or online, not {self.hidden_states!r}")
        if self.hidden_states_dtype not in extract.BYTES_PER_VALUE:
            formats = " or ".join(sorted(extract.BYTES_PER_VALUE))
            raise ConfigError(f"hidden_states_dtype must be {formats}, not {self.hidden_states_dtype!r}")
        if self.hidden_states == "online" and not self.endpoint:
            raise ConfigError("hidden_states: online needs endpoint: the vLLM server that extracts them")
        if len(self.aux_layer_ids) != len(set(self.aux_layer_ids)) or not self.aux_layer_ids:
            raise ConfigError(f"aux_layer_ids must be distinct layer numbers, got {self.aux_layer_ids}")


def verifier_text_config(verifier: str) -> dict[str, Any]:
    """The text model's config: top level, or ``text_config`` of a multimodal wrapper (Kimi-K2.5)."""
    config = json.loads((Path(verifier) / "config.json").read_text())
    return config.get("text_config") or config


def kernels(s: TrainSettings) -> dict[str, Any]:
    """The attention and loss kernels this run trains with, and why (logged, and kept in the marker)."""
    if on_cpu(s):
        given = {k.replace("_", "-"): v for k, v in s.speculators.items() if k.replace("_", "-") in train_kernels.FAST}
        return (
            train_kernels.SAFE
            | given
            | {"path": "cpu", "why": "CPU: sdpa and the eager loss (no Triton) unless the config says"}
        )
    chosen = train_kernels.choose(Path(s.verifier), s.speculators)
    LOG.info(
        "kernels: %s attention, %s loss (%s)", chosen["draft-attn-impl"], chosen["loss-implementation"], chosen["why"]
    )
    return chosen


def speculators_argv(s: TrainSettings, dry_run: bool = False) -> list[str]:
    text = verifier_text_config(s.verifier)
    vocab = int(text["vocab_size"])
    options: dict[str, Any] = {
        "verifier-name-or-path": s.verifier,
        "speculator-type": "eagle3",
        "draft-arch": "llama",
        "data-path": s.data,
        "save-path": str(Path(s.out) / "checkpoints"),
        "log-dir": str(Path(s.out) / "logs"),
        "target-layer-ids": s.aux_layer_ids,
        "total-seq-len": s.seq_length,
        "hidden-states-dtype": "bfloat16",
        "checkpoint-freq": 0.25,
        "on-missing": "raise",
        # Muon, speculators' default: on the trained tiny target it accepts 1.71 against AdamW's
        # 1.48 (same rows, steps and lr; bench/README.md). It costs ~1.5x the step time at
        # Kimi-K2.5 shapes (its Newton-Schulz iterations); `optimizer: adamw` buys that back.
        "optimizer": "muon",
    }
    token_freq = Path(s.data) / "token_freq.pt"
    if s.draft_vocab_size < vocab and token_freq.exists():
        options |= {"draft-vocab-size": s.draft_vocab_size, "token-freq-path": str(token_freq)}
    if s.hidden_states_dtype == "fp8":
        options["hidden-states-backend"] = "fp8"
    if s.hidden_states == "online":
        options |= {"on-missing": "generate", "vllm-endpoint": s.endpoint.rstrip("/") + "/v1"}  # type: ignore[union-attr]
    if not on_cpu(s):
        # speculators' fast kernels where they compile on this host, else sdpa + the eager loss
        # (the fused loss fails under torch.compile with torch 2.11): jobs.train_kernels.
        options |= {k: v for k, v in kernels(s).items() if k in train_kernels.FAST}
    else:
        # speculators' defaults (flex attention, the fused Triton loss) need a GPU; bf16 matmuls on
        # CPUs without bf16 units are emulated and several times slower than fp32.
        options |= {
            "loss-implementation": "eager", "draft-attn-impl": "sdpa", "num-workers": 0,
            "hidden-states-dtype": "float32",
        }  # fmt: skip
    options |= {k.replace("_", "-"): v for k, v in s.speculators.items()}
    if dry_run:
        # The untrained baseline is written by one plain process; speculators refuses
        # --fsdp-shard outside torchrun, and sharding changes nothing that is saved.
        options.pop("fsdp-shard", None)
    argv = []
    for key, value in options.items():
        if isinstance(value, bool):
            argv += [f"--{key}"] if value else []
        elif isinstance(value, list):
            argv += [f"--{key}", *map(str, value)]
        else:
            argv += [f"--{key}", str(value)]
    if s.trust_remote_code:
        argv.append("--trust-remote-code")
    if dry_run:
        argv.append("--dry-run")
    return argv


def on_cpu(s: TrainSettings) -> bool:
    import torch

    return s.device == "cpu" or (s.device == "auto" and torch.accelerator.current_accelerator() is None)


class StepProgress(logging.Handler):
    """After each of speculators' metric records (a dict with ``global_step``) logs one line with
    the total: 'train: 12/60 steps (epoch 1/3), loss 3.250, 464 tok/s'. speculators logs the step
    alone; the total is its trainer's (``planned_steps``), read when
    training starts (``counting_steps``)."""

    def __init__(self) -> None:
        super().__init__()
        self.total: int | None = None
        self.epochs: int | None = None

    def emit(self, record: logging.LogRecord) -> None:
        metrics = record.msg
        if record.name != "speculators.metrics" or not isinstance(metrics, dict) or "global_step" not in metrics:
            return
        if not self.total:
            return
        train, profile = metrics.get("train") or {}, metrics.get("profile") or {}
        LOG.info(
            "train: %d/%d steps (epoch %d/%d), loss %.3f, %.0f tok/s",
            metrics["global_step"] + 1, self.total, int(metrics.get("epoch", 0)) + 1, self.epochs or 0,
            train.get("loss", float("nan")), profile.get("tokens_per_s", 0.0),
        )  # fmt: skip


def planned_steps(max_steps: int | None, epochs: int, sampler: Any) -> int:
    """The steps speculators' trainer will take: ``max_steps`` if set, else the sum of each
    epoch's batches. Its packing sampler reshuffles per epoch, so the count differs from epoch
    to epoch (190, 192, 194 for one 681-row set): epochs x the first epoch's count is not the
    total. The sampler's epoch is put back as it was."""
    if max_steps:
        return max_steps
    if not hasattr(sampler, "set_epoch"):
        return epochs * len(sampler)
    current = getattr(sampler, "epoch", 0)
    try:
        total = 0
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            total += len(sampler)
        return total
    finally:
        sampler.set_epoch(current)


@contextlib.contextmanager
def counting_steps() -> Iterator[StepProgress]:
    """While speculators trains in this process: its total step count is known to a
    StepProgress handler. The handler goes last on the root logger when training starts (after
    speculators' logging setup), so that its line follows the metrics line it is made from: a
    stage's progress is its log's last line."""
    from speculators.train.trainer import Trainer

    handler, original = StepProgress(), Trainer.run_training
    root = logging.getLogger()

    def run_training(self: Trainer, *args: Any, **kwargs: Any) -> Any:
        config = self.config
        handler.epochs = config.num_epochs
        handler.total = planned_steps(config.max_steps, config.num_epochs, self.train_loader.batch_sampler)
        root.addHandler(handler)
        try:
            return original(self, *args, **kwargs)
        finally:
            root.removeHandler(handler)

    Trainer.run_training = run_training  # type: ignore[method-assign]
    try:
        yield handler
    finally:
        Trainer.run_training = original  # type: ignore[method-assign]


def run_speculators(s: TrainSettings, argv: list[str]) -> None:
    from speculators.train.cli import main as train_main
    from speculators.train.config import TrainConfig

    cfg = TrainConfig.resolve(argv)
    with contextlib.ExitStack() as stack:
        stack.enter_context(text_processor.text_only())
        stack.enter_context(counting_steps())
        if on_cpu(s):
            from jobs.cpu_training import cpu_accelerator

            stack.enter_context(cpu_accelerator())
        train_main(cfg)


def last_checkpoint(checkpoints: Path) -> Path | None:
    epochs = sorted((int(p.name), p) for p in checkpoints.glob("*") if p.is_dir() and p.name.isdigit())
    return epochs[-1][1] if epochs else None


def check_checkpoint(path: Path, s: TrainSettings) -> dict[str, Any]:
    config = json.loads((path / "config.json").read_text())
    layers = config.get("eagle_aux_hidden_state_layer_ids")
    if layers != s.aux_layer_ids:
        raise RuntimeError(
            f"{path}/config.json has eagle_aux_hidden_state_layer_ids={layers}, but the hidden states were "
            f"taken from {s.aux_layer_ids}: vLLM would feed the drafter the wrong layers"
        )
    if not any(path.glob("*.safetensors")):
        raise RuntimeError(f"{path} has no weights")
    return config


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def write_node_record(out: Path) -> Path | None:
    """``<out>/nodes/node-<r>.json`` from each torchrun node's first process once training has
    finished: the node's share of the world, the output a multi-node stage checks on every node
    (rank 0 alone writes the drafter)."""
    if int(os.environ.get("LOCAL_RANK", "0")) != 0:
        return None
    node = int(os.environ.get("GROUP_RANK", "0"))
    record = {
        "node_rank": node,
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        "finished": time.time(),
    }
    path = out / "nodes" / f"node-{node}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(record, indent=2) + "\n")
    return path


def train(s: TrainSettings) -> dict[str, Any]:
    out = Path(s.out)
    marker = out / MARKER
    if s.hidden_states == "offline":
        missing = missing_hidden_states(Path(s.data))
        if missing:
            raise RuntimeError(
                f"{len(missing)} prepared rows have no hidden states (first: {missing[:5]}) under "
                f"{s.data}/hidden_states: run jobs.extract first, or train with hidden_states: online"
            )
    out.mkdir(parents=True, exist_ok=True)
    run_speculators(s, speculators_argv(s))
    write_node_record(out)
    if rank() != 0:
        return {}
    checkpoint = last_checkpoint(out / "checkpoints")
    if checkpoint is None:
        raise RuntimeError(f"speculators wrote no checkpoint under {out}/checkpoints")
    config = check_checkpoint(checkpoint, s)
    final = out / "final"
    scratch = out / ".final.partial"
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(checkpoint, scratch, ignore=shutil.ignore_patterns("optimizer*", "scheduler*", "*.pt"))
    shutil.rmtree(final, ignore_errors=True)
    scratch.rename(final)
    result = {
        "checkpoint": str(final),
        "from_epoch": checkpoint.name,
        "aux_layer_ids": config.get("eagle_aux_hidden_state_layer_ids"),
        "draft_vocab_size": config.get("draft_vocab_size"),
        "settings": asdict(s),
        "kernels": kernels(s),
    }
    write_atomic(marker, json.dumps(result, indent=2) + "\n")
    return result


def dry_run(s: TrainSettings, dest: Path) -> Path:
    """An untrained drafter with the same config (the baseline validation compares against)."""
    if not (dest / "config.json").exists():
        argv = speculators_argv(s, dry_run=True)
        argv[argv.index("--save-path") + 1] = str(dest)
        run_speculators(s, argv)
    check_checkpoint(dest, s)
    return dest


def missing_hidden_states(data: Path) -> list[int]:
    from datasets import load_from_disk

    rows = len(load_from_disk(str(data)))
    have = {p.name for p in (data / "hidden_states").glob("hs_*.safetensors")}
    return [i for i in range(rows) if f"hs_{i}.safetensors" not in have]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True, help="YAML training config (see module doc)")
    parser.add_argument("--dry-run", type=Path, metavar="DIR", help="only write an untrained drafter to DIR")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        settings = TrainSettings.load(args.config)
        if args.dry_run:
            print(json.dumps({"checkpoint": str(dry_run(settings, args.dry_run))}))
            return 0
        result = train(settings)
    except (ConfigError, RuntimeError, FileNotFoundError) as err:
        LOG.error("%s", err)
        return 2
    if result:
        print(json.dumps({k: result[k] for k in ("checkpoint", "aux_layer_ids", "draft_vocab_size")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
