"""Which attention and loss kernels drafter training uses on this GPU, chosen by what works here.

speculators' defaults, flex attention and the fused Triton loss inside its ``torch.compile``'d
forward, are its fast path. Whether they compile depends on the installed PyTorch and Triton:
under PyTorch 2.11 the fused loss fails inside TorchDynamo (``bench/README.md``). So on a GPU
``jobs.train`` asks once per host and software stack: a fresh interpreter trains a tiny drafter
(the verifier's own text config, shrunk; two steps) with the fast kernels, under a time limit.
If it trains, training uses speculators' defaults; if not, ``sdpa`` attention and the eager loss,
which train everywhere, with the failure's last line as the reason. The answer is cached in
``$XDG_CACHE_HOME/eagle3/train-kernels.json`` (default ``~/.cache``) under the torch, Triton,
speculators and GPU names, and recorded in the training marker. A stack measured to fail
(``KNOWN_FAILING``: torch 2.11) gets the safe kernels without a probe.

    EAGLE3_TRAIN_KERNELS=fast|safe|probe    # force one, or probe again (default: cached probe)
    python -m jobs.train_kernels --verifier /srv/models/kimi-k2.5     # probe now, print the answer
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

LOG = logging.getLogger("jobs.train_kernels")
FAST = {"draft-attn-impl": "simple_flex_attention", "loss-implementation": "fused"}
SAFE = {"draft-attn-impl": "sdpa", "loss-implementation": "eager"}
PROBE_TIMEOUT = 300.0
# Stacks measured to fail the fast path: no probe there, the safe kernels and this reason.
KNOWN_FAILING = {
    "2.11.": "torch 2.11: speculators' fused loss fails inside TorchDynamo ('ListVariable ... is already "
    "tracked for mutation'), measured on an H200 (bench/README.md)",
}
# torchrun's variables: the probe is a plain single-process run, whatever rank asked for it.
DISTRIBUTED_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                   "MASTER_PORT", "TORCHELASTIC_RUN_ID", "ROLE_RANK", "ROLE_WORLD_SIZE")  # fmt: skip


def cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "eagle3" / "train-kernels.json"


def stack_key() -> str:
    """What the answer depends on: the software that compiles the kernels and the GPU they run on."""
    import torch

    parts = [f"torch {torch.__version__}"]
    with contextlib.suppress(ImportError):
        import triton

        parts.append(f"triton {triton.__version__}")
    from importlib.metadata import version

    parts.append(f"speculators {version('speculators')}")
    if torch.cuda.is_available():
        parts.append(torch.cuda.get_device_name(torch.cuda.current_device()))
    return ", ".join(parts)


def shrunk_text_config(verifier: Path) -> dict[str, Any]:
    """The verifier's text config at a size that trains in seconds, with its attention shape
    (heads, head_dim) kept where the config names it: what flex attention compiles for."""
    config = json.loads((verifier / "config.json").read_text())
    text = dict(config.get("text_config") or config)
    text.pop("auto_map", None)
    text.pop("quantization_config", None)
    if text.get("model_type") == "kimi_k2":
        # Kimi-K2.5's text model: transformers has no kimi_k2 type and reads it as DeepSeek-V3
        # (seen on an H100: "model type `kimi_k2` ... Transformers does not recognize").
        text |= {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"]}
    heads = int(text.get("num_attention_heads", 8))
    kv = int(text.get("num_key_value_heads", heads))
    small_heads = min(heads, 4)
    if "head_dim" not in text and not str(text.get("model_type", "")).startswith("deepseek"):
        # hidden / heads, as Llama-style configs derive it (DeepSeek's comes from qk_rope_head_dim)
        text["head_dim"] = int(text["hidden_size"]) // heads
    text |= {
        "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 64, "vocab_size": 4096,
        "num_hidden_layers": 4, "num_attention_heads": small_heads,
        "num_key_value_heads": max(1, small_heads * kv // heads),
        "n_routed_experts": 4, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "tie_word_embeddings": False,
    }  # fmt: skip
    return text


def build_probe_inputs(work: Path, verifier: Path, rows: int = 4, seq: int = 256) -> tuple[Path, Path]:
    """A tiny verifier (config, embedding, head, final norm) and a prepared dataset with hidden
    states in speculators' layout, made from the verifier's own text config."""
    import torch
    from datasets import Dataset
    from datasets.table import InMemoryTable
    from safetensors.torch import save_file

    text = shrunk_text_config(verifier)
    hidden, vocab = text["hidden_size"], text["vocab_size"]
    model = work / "verifier"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps(text, indent=2) + "\n")
    gen = torch.Generator().manual_seed(0)
    weights = {
        "model.embed_tokens.weight": torch.randn(vocab, hidden, generator=gen) * 0.02,
        "lm_head.weight": torch.randn(vocab, hidden, generator=gen) * 0.02,
        "model.norm.weight": torch.ones(hidden),
    }
    save_file({k: v.to(torch.bfloat16) for k, v in weights.items()}, str(model / "model.safetensors"))
    data = work / "data"
    ids = torch.randint(3, vocab, (rows, seq), generator=gen)
    mask = torch.ones(rows, seq, dtype=torch.long)
    mask[:, : seq // 4] = 0
    # A fixed fingerprint: datasets would otherwise hash the table through dill, which fails on
    # some pyarrow/dill pairs (seen on an H100 host: "Can't pickle <class 'MonthDayNano'>") and
    # says nothing about kernels.
    columns = {"input_ids": ids.tolist(), "loss_mask": mask.tolist(), "seq_len": [seq] * rows}
    table = Dataset(InMemoryTable.from_pydict(columns), fingerprint="eagle3-kernel-probe")
    table.set_format("torch")
    table.save_to_disk(str(data))
    (data / "hidden_states").mkdir()
    for i in range(rows):
        states = torch.randn(seq, 4, hidden, generator=gen).to(torch.bfloat16)
        save_file(
            {"hidden_states": states, "token_ids": ids[i].clone()}, str(data / "hidden_states" / f"hs_{i}.safetensors")
        )
    return model, data


def probe_run(work: Path, verifier: Path, kernels: dict[str, str], device: str) -> None:
    """Train the tiny drafter for two steps with ``kernels`` (in this process; raises on failure)."""
    from jobs import train

    model, data = build_probe_inputs(work, verifier)
    settings = train.TrainSettings(
        verifier=str(model), data=str(data), out=str(work / "out"), aux_layer_ids=[1, 2, 3],
        draft_vocab_size=4096, seq_length=512, device=device,
        speculators=kernels | {"epochs": 1, "max-steps": 2, "checkpoint-freq": 1.0, "mask-token-id": 0},
    )  # fmt: skip
    train.train(settings)


def probe_failure(verifier: Path, kernels: str, timeout: float) -> str:
    """Train the probe drafter in a fresh interpreter with ``kernels``; '' if it trained, else why not."""
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_ENV}
    with tempfile.TemporaryDirectory(prefix="eagle3-kernel-probe-") as work:
        argv = [sys.executable, "-m", "jobs.train_kernels", "--verifier", str(verifier), "--probe-run", work,
                "--kernels", kernels]  # fmt: skip
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return f"did not finish in {timeout:.0f} s"
    return "" if done.returncode == 0 else last_error_line(done.stderr + done.stdout)


class ProbeError(RuntimeError):
    """The probe failed with the safe kernels too: it says nothing about kernels (nothing is cached)."""


def probe(verifier: Path, timeout: float = PROBE_TIMEOUT) -> dict[str, Any]:
    """The fast kernels if the probe drafter trains with them; else the safe ones, once they are
    shown to train the same probe (a failure of both is the harness's or the stack's, not the kernels')."""
    started = time.monotonic()
    failure = probe_failure(verifier, "fast", timeout)
    seconds = round(time.monotonic() - started, 1)
    if not failure:
        return FAST | {
            "path": "fast",
            "why": f"speculators' flex attention and fused loss trained the probe ({seconds} s)",
        }
    also = probe_failure(verifier, "safe", timeout)
    if also:
        raise ProbeError(f"the kernel probe failed with the safe kernels too, so it cannot tell: {also}")
    return SAFE | {
        "path": "safe",
        "why": f"speculators' fast kernels failed the probe: {failure}",
        "probe_seconds": seconds,
    }


def last_error_line(log: str) -> str:
    """The exception line of a traceback (the last line naming an error), else the last line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception", "Unsupported")) and " " not in head:
            return line[:300]
    return lines[-1][:300] if lines else "no output"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """One probe per host: torchrun's ranks wait for the first one's answer."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with (path.with_suffix(".lock")).open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def choose(verifier: Path, configured: dict[str, Any]) -> dict[str, Any]:
    """The kernels for a GPU run: the config's own, ``EAGLE3_TRAIN_KERNELS``, else the probe's cached answer."""
    keys = set(FAST)
    if keys <= {k.replace("_", "-") for k in configured}:
        given = {k.replace("_", "-"): v for k, v in configured.items() if k.replace("_", "-") in keys}
        return given | {"path": "config", "why": "set in the config's speculators block"}
    forced = os.environ.get("EAGLE3_TRAIN_KERNELS", "")
    if forced in ("fast", "safe"):
        return (FAST if forced == "fast" else SAFE) | {"path": forced, "why": f"EAGLE3_TRAIN_KERNELS={forced}"}
    if forced not in ("", "probe"):
        raise ValueError(f"EAGLE3_TRAIN_KERNELS must be fast, safe or probe, not {forced!r}")
    import torch

    if not torch.cuda.is_available():
        return SAFE | {"path": "safe", "why": "no CUDA device visible: nothing to probe"}
    known = next((why for prefix, why in KNOWN_FAILING.items() if torch.__version__.startswith(prefix)), None)
    if known and forced != "probe":
        return SAFE | {"path": "safe", "why": known}
    key, path = stack_key(), cache_path()
    with locked(path):
        cache = json.loads(path.read_text()) if path.exists() else {}
        if forced != "probe" and key in cache:
            return cache[key] | {"cached": str(path)}
        LOG.info("probing speculators' fast kernels on %s (once per host and stack; %s)", key, path)
        try:
            answer = probe(verifier)
        except ProbeError as err:
            LOG.warning("%s; training with sdpa and the eager loss, not cached", err)
            return SAFE | {"path": "safe", "why": str(err)}
        cache[key] = answer
        path.write_text(json.dumps(cache, indent=2) + "\n")
    return answer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.train_kernels", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--verifier", type=Path, required=True, help="the target model whose text config the probe shrinks"
    )
    parser.add_argument("--probe-run", type=Path, metavar="DIR", help="(internal) train the probe drafter in DIR")
    parser.add_argument("--kernels", choices=["fast", "safe"], default="fast", help="with --probe-run")
    parser.add_argument("--device", default="cuda", help="with --probe-run: cuda, or cpu to check the harness")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.probe_run:
        probe_run(args.probe_run, args.verifier, FAST if args.kernels == "fast" else SAFE, args.device)
        return 0
    print(json.dumps(choose(args.verifier, {}), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
