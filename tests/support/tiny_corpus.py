"""Chat samples from the Python standard library: the trained tiny target's text and questions.

Every machine with Python has the standard library's sources, so this text needs no download.
Each function or method with a docstring becomes one chat sample:

* user: ``Write `{qualname}` from `{module}`.``
* assistant reasoning (rendered inside ``<think>…</think>`` by the chat template): where it lives,
  its signature and the first sentence of its docstring;
* assistant answer: its source, at most ``MAX_LINES`` lines.

Functions are split by a hash of ``module:qualname`` into the generation pool (questions whose
answers the drafter is trained on), a disjoint held-out pool (validation prompts), and the rest.
The target (``tests.support.tiny_pretrain``) is trained on all of them, as a real model has seen the text
its users ask about; the drafter never sees a held-out question.

    python -m tests.support.tiny_corpus --out /tmp/corpus     # samples.jsonl, generation.jsonl, heldout.jsonl
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import logging
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

LOG = logging.getLogger("tests.support.tiny_corpus")
MAX_LINES = 24
# Shares of the functions (by hash) in the held-out and generation pools; the rest train only the target.
HELDOUT_SHARE = 0.02
GENERATION_SHARE = 0.10
SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__", "lib2to3", "turtledemo"}


@dataclass(frozen=True)
class Sample:
    id: str
    module: str
    qualname: str
    question: str
    reasoning: str
    answer: str

    def messages(self) -> list[dict[str, str]]:
        return [
            {"role": "user", "content": self.question},
            {"role": "assistant", "reasoning_content": self.reasoning, "content": self.answer},
        ]


def first_sentence(doc: str) -> str:
    text = " ".join(doc.strip().split("\n\n")[0].split())
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]


def functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Module-level functions and methods of module-level classes, with their qualified names."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    yield f"{node.name}.{item.name}", item


def samples_of(path: Path, module: str) -> Iterator[Sample]:
    source = path.read_text(encoding="utf-8")
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return
    lines = source.splitlines()
    for qualname, node in functions(tree):
        doc = ast.get_docstring(node)
        if not doc or not first_sentence(doc) or node.end_lineno is None:
            continue
        start = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
        body = lines[start : min(node.end_lineno, start + MAX_LINES)]
        indent = min(len(line) - len(line.lstrip()) for line in body if line.strip())
        answer = "\n".join(line[indent:] for line in body).rstrip()
        signature = f"{node.name}({ast.unparse(node.args)})"
        yield Sample(
            id=f"{module}:{qualname}",
            module=module,
            qualname=qualname,
            question=f"Write `{qualname}` from `{module}`.",
            reasoning=f"`{qualname}` is in `{module}`: `{signature}`. {first_sentence(doc)}",
            answer=answer,
        )


def stdlib_samples(root: Path | None = None) -> list[Sample]:
    """Every sample of the standard library at ``root`` (this Python's by default), sorted by id."""
    root = root or Path(sysconfig.get_paths()["stdlib"])
    found: dict[str, Sample] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if SKIP_DIRS.intersection(rel.parts[:-1]):
            continue
        module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        for sample in samples_of(path, module):
            found.setdefault(sample.id, sample)
    return [found[k] for k in sorted(found)]


def pool(sample_id: str) -> str:
    """``heldout``, ``generation`` or ``target``: a fixed split by the id's hash."""
    share = int(hashlib.sha256(sample_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    if share < HELDOUT_SHARE:
        return "heldout"
    if share < HELDOUT_SHARE + GENERATION_SHARE:
        return "generation"
    return "target"


def write(out: Path, samples: list[Sample]) -> dict[str, int]:
    """``samples.jsonl`` (all), and the questions of the two pools as ``generation.jsonl`` and
    ``heldout.jsonl`` (``{"id", "prompt"}`` rows, the pipeline's input format)."""
    out.mkdir(parents=True, exist_ok=True)
    counts = {"samples": len(samples), "generation": 0, "heldout": 0}
    with (
        (out / "samples.jsonl").open("w") as all_f,
        (out / "generation.jsonl").open("w") as gen_f,
        (out / "heldout.jsonl").open("w") as held_f,
    ):
        for sample in samples:
            all_f.write(json.dumps(asdict(sample)) + "\n")
            where = pool(sample.id)
            if where != "target":
                (gen_f if where == "generation" else held_f).write(
                    json.dumps({"id": sample.id, "prompt": sample.question}) + "\n"
                )
                counts[where] += 1
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="directory for samples.jsonl and the question pools")
    parser.add_argument("--stdlib", type=Path, help="standard library to read (default: this Python's)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    counts = write(args.out, stdlib_samples(args.stdlib))
    LOG.info("wrote %s to %s", counts, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
