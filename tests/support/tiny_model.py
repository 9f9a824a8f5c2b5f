"""Build the built-in tiny target: the trained one from ``models/tiny-python``, or a random-init Llama.

``--kind trained`` (the default) installs the committed artifact that ``tests.support.tiny_pretrain`` built:
the same Llama shape, pretrained on chat samples from the Python standard library (a question, a
reasoning part, the function's source), with the artifact's disjoint question pools as prompts.
Its sha256s are checked. ``--kind random`` builds the random-init model described below, for
tests that need no quality.

Nothing loads from a hub on test machines, so the project makes its own target model:
hidden 256, 4 heads of head_dim 64 (vLLM's CPU attention needs head_dim >= 32), a byte-level
BPE tokenizer trained on a built-in corpus, and a chat template that opens the assistant turn
with ``<think>`` and renders earlier reasoning as ``<think>…</think>`` (so a reasoning parser
has something to split).

    python -m tests.support.tiny_model --out /srv/models/tiny --prompts /srv/data            # trained
    python -m tests.support.tiny_model --kind random --out /srv/models/tiny-random
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import random
import sys
from pathlib import Path

LOG = logging.getLogger("tests.support.tiny_model")
TRAINED = Path(__file__).resolve().parents[2] / "models" / "tiny-python"
# A random-init model's next-token distribution is nearly flat, so a drafter trained on it (a KL
# loss against those distributions) gets almost no signal about which token wins. Scaling the
# output head makes the distributions as peaked as a trained model's, with the same random
# weights otherwise; greedy answers are unchanged.
LOGIT_SCALE = 8.0

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' and message.get('reasoning_content') %}"
    "{{ '<think>\\n' + message['reasoning_content'] + '\\n</think>\\n' }}"
    "{% endif %}"
    "{{ message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}"
)
WORDS = [
    "the",
    "a",
    "model",
    "token",
    "draft",
    "target",
    "speculative",
    "decoding",
    "accept",
    "reject",
    "layer",
    "hidden",
    "state",
    "attention",
    "head",
    "vocabulary",
    "train",
    "step",
    "loss",
    "batch",
    "sequence",
    "prompt",
    "answer",
    "question",
    "reason",
    "think",
    "because",
    "therefore",
    "first",
    "then",
    "finally",
    "number",
    "add",
    "multiply",
    "divide",
    "sum",
    "value",
    "result",
    "python",
    "function",
    "return",
    "list",
    "dict",
    "string",
    "integer",
    "float",
    "loop",
    "while",
    "for",
    "if",
    "else",
    "class",
    "server",
    "request",
    "response",
    "latency",
    "throughput",
    "memory",
    "disk",
    "cache",
    "shard",
    "rank",
    "world",
    "gpu",
    "cpu",
]


def corpus(lines: int, seed: int) -> list[str]:
    """Deterministic text for tokenizer training: word salad plus arithmetic and code shapes."""
    rng = random.Random(seed)
    out = []
    for i in range(lines):
        kind = i % 3
        if kind == 0:
            out.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 20))) + ".")
        elif kind == 1:
            a, b = rng.randint(0, 999), rng.randint(0, 999)
            out.append(f"What is {a} plus {b}? First add {a} and {b}, therefore the sum is {a + b}.")
        else:
            name = "_".join(rng.sample(WORDS, 2))
            out.append(f"def {name}(x):\n    return [v * {rng.randint(2, 9)} for v in x]\n")
    return out


def build_tokenizer(
    out: Path, vocab_size: int, seed: int, special_tokens: list[str] = SPECIAL_TOKENS,
    chat_template: str = CHAT_TEMPLATE, bos: str = "<|endoftext|>", eos: str = "<|im_end|>", pad: str = "<|endoftext|>",
    texts: list[str] | None = None, plain: tuple[str, ...] = (),
) -> None:  # fmt: skip
    """A byte-level BPE tokenizer trained on ``texts`` (default: ``corpus``), with
    ``special_tokens`` first in its vocabulary (ids 0, 1, ...) and ``chat_template``.

    Tokens in ``plain`` keep their ids but are not special, so decoding with
    ``skip_special_tokens`` keeps them: vLLM's reasoning parsers look for ``</think>`` in the
    decoded text, as they find it in real reasoning models' output."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts if texts is not None else corpus(20000, seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=pad, unk_token=None)
    fast.chat_template = chat_template
    fast.save_pretrained(out)
    if plain:
        path = out / "tokenizer.json"
        data = json.loads(path.read_text())
        for token in data["added_tokens"]:
            if token["content"] in plain:
                token["special"] = False
        path.write_text(json.dumps(data, ensure_ascii=False, indent=2))


def build_model(out: Path, vocab_size: int, layers: int, seed: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=4096,
        bos_token_id=0,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(LOGIT_SCALE)
    model = model.to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 0}, indent=2) + "\n"
    )


def build(out: Path, vocab_size: int = 2048, layers: int = 4, seed: int = 0) -> Path:
    """Write the tiny target into ``out`` (skipped when a complete one is already there)."""
    marker = out / ".tiny-model.json"
    recipe = {"vocab_size": vocab_size, "layers": layers, "seed": seed, "logit_scale": LOGIT_SCALE, "version": 2}
    if marker.exists() and json.loads(marker.read_text()) == recipe:
        LOG.info("tiny model already at %s", out)
        return out
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out, vocab_size, seed)
    build_model(out, vocab_size, layers, seed)
    marker.write_text(json.dumps(recipe) + "\n")
    for path in out.iterdir():
        path.chmod(0o644)  # save_pretrained writes 0600; the server runs as another user
    LOG.info("tiny model written to %s", out)
    return out


def install_trained(out: Path, artifact: Path = TRAINED) -> Path:
    """Copy the trained target's artifact into ``out`` after checking every file's sha256
    (skipped when the same recipe is already there)."""
    import shutil

    manifest = json.loads((artifact / "recipe.json").read_text())
    marker = out / ".tiny-model.json"
    recipe = {"kind": "trained", "recipe_sha256": manifest["recipe_sha256"], "files": manifest["files"]}
    if marker.exists() and json.loads(marker.read_text()) == recipe:
        LOG.info("trained tiny model already at %s", out)
        return out
    for name, expected in manifest["files"].items():
        actual = hashlib.sha256((artifact / name).read_bytes()).hexdigest()
        if actual != expected:
            raise SystemExit(
                f"{artifact / name}: sha256 {actual[:16]}… is not the recipe's {expected[:16]}…; "
                "restore it (git checkout models/) or rebuild it with the commands in recipe.json"
            )
    out.mkdir(parents=True, exist_ok=True)
    for name in [*manifest["files"], "recipe.json"]:
        shutil.copyfile(artifact / name, out / name)
        (out / name).chmod(0o644)
    marker.write_text(json.dumps(recipe) + "\n")
    LOG.info("trained tiny model (recipe %s) installed in %s", manifest["recipe_sha256"][:16], out)
    return out


def write_trained_prompts(
    out: Path, train: int | None = 200, heldout: int = 32, artifact: Path = TRAINED
) -> tuple[Path, Path]:
    """The first ``train`` questions of the artifact's generation pool (``None``: all of them) and
    the first ``heldout`` of its disjoint held-out pool, as ``train.jsonl`` and ``heldout.jsonl``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, pool, count in (("train", "generation", train), ("heldout", "heldout", heldout)):
        rows = (artifact / f"{pool}.jsonl").read_text().splitlines(keepends=True)
        count = len(rows) if count is None else count
        if count > len(rows):
            raise SystemExit(f"{artifact / pool}.jsonl has {len(rows)} questions, {count} were asked for")
        path = out / f"{name}.jsonl"
        path.write_text("".join(rows[:count]))
        path.chmod(0o644)
        paths.append(path)
    return paths[0], paths[1]


def write_prompts(out: Path, train: int = 200, heldout: int = 16, seed: int = 11) -> tuple[Path, Path]:
    """Questions for the pipeline on the random target: ``train.jsonl`` and disjoint ``heldout.jsonl``."""
    lines = corpus(2 * train + heldout, seed)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, prefix, rows in (("train", "t", lines[:train]), ("heldout", "h", lines[-heldout:])):
        path = out / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"id": f"{prefix}{i}", "prompt": q}) + "\n" for i, q in enumerate(rows)))
        path.chmod(0o644)
        paths.append(path)
    return paths[0], paths[1]


def prompt_count(text: str) -> int | None:
    """``--train-prompts``: a number, or ``all`` (``None``)."""
    return None if text == "all" else int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="directory to write the model into")
    parser.add_argument("--kind", choices=["trained", "random"], default="trained")
    parser.add_argument("--vocab-size", type=int, default=2048, help="random only")
    parser.add_argument("--layers", type=int, default=4, help="random only")
    parser.add_argument("--seed", type=int, default=0, help="random only")
    parser.add_argument("--prompts", type=Path, help="also write train.jsonl and heldout.jsonl questions here")
    parser.add_argument(
        "--train-prompts",
        type=prompt_count,
        default=200,
        help="default: 200; `all`: the trained target's whole generation pool",
    )
    parser.add_argument("--heldout-prompts", type=int, help="default: 32 (trained), 16 (random)")
    args = parser.parse_args(argv)
    if args.kind == "random" and args.train_prompts is None:
        parser.error("--train-prompts all needs --kind trained (the random target's questions have no pool)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.kind == "trained":
        install_trained(args.out)
        if args.prompts:
            write_trained_prompts(args.prompts, args.train_prompts, args.heldout_prompts or 32)
    else:
        build(args.out, args.vocab_size, args.layers, args.seed)
        if args.prompts:
            write_prompts(args.prompts, args.train_prompts, args.heldout_prompts or 16)
    return 0


if __name__ == "__main__":
    sys.exit(main())
