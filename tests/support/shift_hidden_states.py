"""Negative control: a copy of a prepared dataset whose hidden states are off by N tokens.

Row ``i``'s copy holds, at position ``t``, the states the target produced at ``t - N`` (the first
N positions repeat position 0): the off-by-one bug a capture or gather could have. Everything
else (the dataset, ``token_freq.pt``, token ids) is the same, so a drafter trained on the copy
differs from the real one only in that alignment, and validation must score it clearly lower.

    python tests/support/shift_hidden_states.py --data runs/x/prepared --out runs/x/prepared-shifted

Standalone (safetensors and torch only), so it can run in a test host's vLLM venv.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def rewrite_states(data: Path, out: Path, transform: Callable[[dict[str, Any]], dict[str, Any]]) -> int:
    """Copy the prepared dataset ``data`` to ``out`` with each hidden-state file's tensors passed
    through ``transform``; the number of files."""
    from safetensors.torch import load_file, save_file

    states_out = out / "hidden_states"
    states_out.mkdir(parents=True, exist_ok=True)
    for item in data.iterdir():
        if item.is_file():
            shutil.copyfile(item, out / item.name)
    files = sorted((data / "hidden_states").glob("hs_*.safetensors"))
    if not files:
        raise SystemExit(f"no hidden-state files in {data / 'hidden_states'}")
    for path in files:
        tmp = states_out / f".{path.name}.tmp"
        save_file(transform(load_file(path)), tmp)
        os.replace(tmp, states_out / path.name)
    return len(files)


def shift(data: Path, out: Path, tokens: int = 1) -> dict[str, int]:
    import torch

    if tokens < 1:
        raise SystemExit(f"--tokens must be at least 1, got {tokens}")

    def shifted(tensors: dict[str, Any]) -> dict[str, Any]:
        hs = tensors["hidden_states"]
        n = min(tokens, hs.shape[0])
        moved = torch.cat([hs[:1].expand(n, *hs.shape[1:]), hs[: hs.shape[0] - n]]).contiguous()
        return tensors | {"hidden_states": moved}

    return {"files": rewrite_states(data, out, shifted), "shift_tokens": tokens}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="prepared dataset with hidden_states/")
    parser.add_argument("--out", type=Path, required=True, help="where the shifted copy goes")
    parser.add_argument("--tokens", type=int, default=1, help="shift (default 1)")
    args = parser.parse_args(argv)
    print(json.dumps(shift(args.data, args.out, args.tokens)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
