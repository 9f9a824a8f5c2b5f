"""Train the tiny target: the built-in Llama shape, pretrained on ``tests.support.tiny_corpus``'s samples.

Three steps, so that the GPU step needs only torch, transformers and safetensors:

    python -m tests.support.tiny_pretrain prepare --out /tmp/pre        # tokenizer, config, tokens.pt (here)
    python -m tests.support.tiny_pretrain train --dir /tmp/pre          # model.safetensors (GPU: ~15 s on an H100)
    python -m tests.support.tiny_pretrain package --dir /tmp/pre --out models/tiny-python   # the committed artifact

``prepare`` trains the BPE tokenizer on the samples (chat template with ``<think>``), renders
every sample as one chat (user question, assistant reasoning and answer) and packs their token
ids, each chat ending with ``<|im_end|>``, into one stream. ``train`` trains a
``LlamaForCausalLM`` of ``config.json`` on random windows of that stream (seeded) with AdamW and
a cosine schedule, logs the loss, and writes the weights in bf16. ``package`` copies what vLLM
loads, plus the question pools, into the artifact directory with ``recipe.json``: the recipe, its
hash, every file's sha256 and the commands that rebuilt it. ``tests.support.tiny_model --kind trained``
installs that artifact (checking the hashes).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import sys
import time
from pathlib import Path

LOG = logging.getLogger("tests.support.tiny_pretrain")
VOCAB_SIZE = 2048
RECIPE_VERSION = 2  # 2: <think> and </think> are not special tokens (vLLM's parser sees them)
# What the artifact holds: what vLLM and transformers load, and the pipeline's question pools.
ARTIFACT_FILES = (
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
    "model.safetensors", "generation.jsonl", "heldout.jsonl",
)  # fmt: skip


def llama_config(vocab_size: int = VOCAB_SIZE) -> dict:
    """The built-in target's shape (as ``tests.support.tiny_model``'s random one): hidden 256, 4 layers,
    4 heads of head_dim 64."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab_size,
        "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 4, "head_dim": 64, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "hidden_act": "silu", "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 0,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }  # fmt: skip


def prepare(out: Path, corpus_dir: Path) -> dict:
    import torch
    from transformers import AutoTokenizer

    from tests.support import tiny_corpus, tiny_model

    samples = tiny_corpus.stdlib_samples()
    tiny_corpus.write(corpus_dir, samples)
    out.mkdir(parents=True, exist_ok=True)
    texts = [f"{s.question}\n{s.reasoning}\n{s.answer}" for s in samples]
    tiny_model.build_tokenizer(out, VOCAB_SIZE, seed=0, texts=texts, plain=("<think>", "</think>"))
    tokenizer = AutoTokenizer.from_pretrained(out)
    stream: list[int] = []
    for sample in samples:
        chat = tokenizer.apply_chat_template(sample.messages(), tokenize=False)
        stream += tokenizer(chat, add_special_tokens=False)["input_ids"]
    tokens = torch.tensor(stream, dtype=torch.int16)
    torch.save(tokens, out / "tokens.pt")
    (out / "config.json").write_text(json.dumps(llama_config(), indent=2) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 0}) + "\n"
    )
    digest = hashlib.sha256((out / "tokens.pt").read_bytes()).hexdigest()
    LOG.info("%d samples, %d tokens (sha256 %s) in %s", len(samples), len(stream), digest[:16], out)
    return {"samples": len(samples), "tokens": len(stream), "tokens_sha256": digest}


def train(directory: Path, steps: int, batch: int, seq: int, lr: float, seed: int) -> dict:
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokens = torch.load(directory / "tokens.pt").long().to(device)
    config = LlamaConfig(**{k: v for k, v in llama_config().items() if k not in ("architectures", "model_type")})
    model = LlamaForCausalLM(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, betas=(0.9, 0.95))
    generator = torch.Generator(device=device).manual_seed(seed)
    start, losses = time.monotonic(), []
    for step in range(steps):
        scale = min(1.0, (step + 1) / 200) * 0.5 * (1 + math.cos(math.pi * step / steps))
        for group in optimizer.param_groups:
            group["lr"] = lr * max(scale, 0.02)
        offsets = torch.randint(0, tokens.numel() - seq - 1, (batch,), device=device, generator=generator)
        window = tokens[offsets[:, None] + torch.arange(seq + 1, device=device)]
        with torch.autocast(device, dtype=torch.bfloat16):
            logits = model(input_ids=window[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), window[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if (step + 1) % 250 == 0 or step + 1 == steps:
            LOG.info(
                "step %d/%d loss %.3f (%.0f s)",
                step + 1,
                steps,
                sum(losses[-50:]) / len(losses[-50:]),
                time.monotonic() - start,
            )
    state = {k: v.detach().to(torch.bfloat16).cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, directory / "model.safetensors", metadata={"format": "pt"})
    if device == "cuda":
        device = f"cuda ({torch.cuda.get_device_name()})"
    result = {"steps": steps, "batch": batch, "seq": seq, "lr": lr, "seed": seed, "device": device,
              "final_loss": sum(losses[-50:]) / len(losses[-50:]), "seconds": round(time.monotonic() - start, 1)}  # fmt: skip
    (directory / "pretrain.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def recipe_hash(recipe: dict) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


def package(directory: Path, out: Path, corpus_dir: Path) -> dict:
    """Copy the trained model and the question pools into ``out`` with ``recipe.json``."""
    import platform
    import shutil

    trained = json.loads((directory / "pretrain.json").read_text())
    recipe = {
        "version": RECIPE_VERSION, "config": llama_config(), "vocab_size": VOCAB_SIZE, "tokens_sha256": sha256(directory / "tokens.pt"),
        "train": {k: trained[k] for k in ("steps", "batch", "seq", "lr", "seed")},
    }  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    for name in ARTIFACT_FILES:
        source = corpus_dir / name if name.endswith(".jsonl") else directory / name
        shutil.copyfile(source, out / name)
        (out / name).chmod(0o644)
    t = recipe["train"]
    manifest = {
        "recipe": recipe,
        "recipe_sha256": recipe_hash(recipe),
        "files": {name: sha256(out / name) for name in ARTIFACT_FILES},
        "trained": {"device": trained["device"], "seconds": trained["seconds"], "final_loss": round(trained["final_loss"], 4)},
        "stdlib": f"Python {platform.python_version()} (the question pools and the corpus come from its standard library)",
        "rebuild": [
            "python -m tests.support.tiny_pretrain prepare --out /tmp/pre",
            f"python -m tests.support.tiny_pretrain train --dir /tmp/pre --steps {t['steps']} --batch {t['batch']} --seq {t['seq']} --lr {t['lr']} --seed {t['seed']}",
            f"python -m tests.support.tiny_pretrain package --dir /tmp/pre --out {out}",
        ],
    }  # fmt: skip
    (out / "recipe.json").write_text(json.dumps(manifest, indent=2) + "\n")
    LOG.info("artifact in %s, recipe %s", out, manifest["recipe_sha256"][:16])
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="tokenizer, config and token stream from the standard library")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--corpus", type=Path, help="where the samples and question pools go (default: OUT/corpus)")
    t = sub.add_parser("train", help="train the model on DIR/tokens.pt, write DIR/model.safetensors")
    t.add_argument("--dir", type=Path, required=True)
    t.add_argument("--steps", type=int, default=800)
    t.add_argument("--batch", type=int, default=64)
    t.add_argument("--seq", type=int, default=512)
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--seed", type=int, default=0)
    k = sub.add_parser("package", help="copy DIR's model and the question pools into OUT with recipe.json")
    k.add_argument("--dir", type=Path, required=True)
    k.add_argument("--out", type=Path, required=True)
    k.add_argument("--corpus", type=Path, help="where prepare wrote the question pools (default: DIR/corpus)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.command == "prepare":
        prepare(args.out, args.corpus or args.out / "corpus")
    elif args.command == "package":
        package(args.dir, args.out, args.corpus or args.dir / "corpus")
    else:
        LOG.info("%s", train(args.dir, args.steps, args.batch, args.seq, args.lr, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
