"""Turn generated rows into the dataset speculators trains on (``speculators prepare-data``).

Rows from ``jobs.generate`` already carry ``input_ids`` and ``loss_mask`` (the exact tokens the
target produced), so speculators passes them through without re-rendering; this job collects
every ``rows-*.jsonl`` of one or more generation outputs, runs speculators' own prepare step and
records the token frequencies the draft vocabulary is chosen from (``token_freq.pt``).

    python -m jobs.prepare --rows runs/x/generated --target /srv/models/tiny --out runs/x/prepared
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from jobs import text_processor

LOG = logging.getLogger("jobs.prepare")


def rows_paths(rows: list[Path]) -> list[Path]:
    """The rows files named: a ``.jsonl`` file as is, a ``jobs.generate`` directory its ``rows-*.jsonl``."""
    return sorted({f for r in rows for f in ([r] if r.suffix == ".jsonl" else r.glob("rows-*.jsonl"))})


def row_files(rows: list[Path]) -> list[Path]:
    """The rows files named (see ``rows_paths``) that hold rows; a named file must exist."""
    files = rows_paths(rows)
    missing = [f for f in files if not f.exists()]
    if missing:
        raise FileNotFoundError(f"rows file {missing[0]} does not exist: run jobs.generate for it")
    files = [f for f in files if f.stat().st_size > 0]
    if not files:
        raise FileNotFoundError(f"no rows-*.jsonl with rows under {', '.join(map(str, rows))}: run jobs.generate")
    return files


def prepare(rows_dirs: list[Path], target: Path, out: Path, seq_length: int) -> dict[str, Any]:
    """Run speculators' prepare-data into a scratch dir and rename it into place when complete,
    so an interrupted run never leaves a half-written dataset. It always rebuilds: whether an
    existing dataset is still good for these rows is the stage layer's call (``jobs.stage``)."""
    import shutil

    from datasets import load_from_disk
    from speculators.cli.prepare_data import prepare_data

    files = row_files(rows_dirs)
    scratch = out.with_name(f".{out.name}.partial")
    shutil.rmtree(scratch, ignore_errors=True)
    with text_processor.text_only():
        prepare_data(
            model=str(target), data=[str(f) for f in files], output=str(scratch), seq_length=seq_length,
            skip_token_freq=False, minimum_valid_tokens=1,
        )  # fmt: skip
    shutil.rmtree(out, ignore_errors=True)
    scratch.rename(out)
    dataset = load_from_disk(str(out))
    summary = {
        "rows": len(dataset),
        "tokens": int(sum(dataset.with_format(None)["seq_len"])),
        "inputs": [str(f) for f in files],
        "out": str(out),
        "seq_length": seq_length,
    }
    (out / "prepare-summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.prepare", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows",
        type=Path,
        action="append",
        required=True,
        help="a rows-<rank>.jsonl file, or a jobs.generate output dir (all its rows files); repeat",
    )
    parser.add_argument("--target", type=Path, required=True, help="target model dir (its tokenizer)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seq-length", type=int, default=8192, help="longest training sequence")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    print(json.dumps(prepare(args.rows, args.target, args.out, args.seq_length)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
