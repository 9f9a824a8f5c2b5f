"""How much a target repeats itself: the share of each answer's token n-grams seen earlier in it.

A drafter finds a repeat easy to predict, so a target that repeats more is easier to draft. This
reads generated rows (``jobs.generate``'s ``rows-<rank>.jsonl``, their ``completion_token_ids``)
and prints, per file, the share of completion n-grams (default 4 tokens) that already occurred
earlier in the same completion, the share of rows cut at max_tokens and the mean completion length.

    python bench/repetition.py runs/dq800b/gen/rows-0.jsonl runs/dq4000/gen/rows-0.jsonl --rows 200
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def repetition(rows_file: Path, n: int = 4, rows: int | None = None) -> dict[str, float | int]:
    """Repeated n-gram share, truncation rate and mean completion tokens of the first ``rows`` rows."""
    repeated = total = truncated = tokens = count = 0
    with rows_file.open() as f:
        for line in f:
            if rows is not None and count == rows:
                break
            row = json.loads(line)
            ids = row["completion_token_ids"]
            count += 1
            tokens += len(ids)
            truncated += row.get("finish_reason") == "length"
            seen: set[tuple[int, ...]] = set()
            for i in range(len(ids) - n + 1):
                gram = tuple(ids[i : i + n])
                total += 1
                repeated += gram in seen
                seen.add(gram)
    if not count:
        raise SystemExit(f"{rows_file}: no rows")
    return {
        "rows": count,
        f"repeated_{n}gram_share": round(repeated / max(total, 1), 3),
        "truncated_share": round(truncated / count, 3),
        "mean_completion_tokens": round(tokens / count, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rows_files", type=Path, nargs="+")
    parser.add_argument("--n", type=int, default=4, help="n-gram length in tokens")
    parser.add_argument("--rows", type=int, help="only the first ROWS rows of each file")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.rows_files if not p.is_file()]
    if missing:
        parser.error(f"no rows file {', '.join(missing)} (jobs.generate writes <run>/gen/rows-<rank>.jsonl)")
    result = {str(p): repetition(p, args.n, args.rows) for p in args.rows_files}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
