"""Run ``python -m MODULE ARGS...`` and print its peak GPU memory at exit (PEAK_MEMORY_GIB=...).

python bench/peak_memory.py -m jobs.train --config c.yaml
"""

from __future__ import annotations

import atexit
import runpy
import sys

import torch


def report() -> None:
    if torch.cuda.is_available():
        print(f"PEAK_MEMORY_GIB={torch.cuda.max_memory_allocated() / 2**30:.2f}", flush=True)


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] != "-m":
        sys.exit("usage: peak_memory.py -m MODULE [ARGS...]")
    module = sys.argv[2]
    sys.argv = [module, *sys.argv[3:]]
    atexit.register(report)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
