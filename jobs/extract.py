"""Hidden states for EAGLE-3 training, written where speculators' trainer reads them.

Input is a dataset made by ``speculators prepare-data`` (``input_ids``, ``loss_mask``,
``seq_len``). Output is ``<data>/hidden_states/hs_<i>.safetensors`` for row ``i``: the
``token_ids`` and the ``hidden_states`` ``[tokens, layers, hidden]`` of the aux layers plus the
final layer, as vLLM's ``extract_hidden_states`` writes them.

Two sources, usable together:

* ``--server``: a vLLM server started with the ``extract_hidden_states`` speculative config; each
  row is sent as token ids with ``max_tokens=1`` (speculators' own client call) and the file the
  server wrote is checked and moved into place.
* ``--fused-rows``: rows ``jobs.generate --fused-hidden-states`` wrote; their hidden states were
  captured while the answer was generated, so no second pass is needed. A row's file is matched
  to the prepared row by its exact token ids.

Resumable (complete files are kept, unreadable or mismatched ones redone), validated with
speculators' ``check_hidden_states`` plus the layer count and hidden size, sharded by
``--rank/--world-size``, and it refuses to start when the disk cannot hold what it will write.

``--hidden-states-dtype fp8``: the files are in speculators' FP8 format (``hs_connectors``' FP8
connector: ``hidden_states`` as float8_e4m3fn, ``hidden_states_scales`` one float32 per token),
half the bytes of bf16; they are validated dequantized, and a file of the other format is redone.
Train on them with speculators' ``--hidden-states-backend fp8`` (``jobs.train``'s
``hidden_states_dtype: fp8``).

    python -m jobs.extract --data runs/x/prepared --server http://127.0.0.1:8000 \\
        --layers 4 --hidden-size 7168
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.prepare import rows_paths

LOG = logging.getLogger("jobs.extract")
BYTES_PER_VALUE = {"bf16": 2, "fp8": 1}
EXIT_NO_SPACE = 4
EXIT_INCOMPLETE = 5


class NotEnoughDisk(RuntimeError):
    pass


@dataclass
class Shape:
    layers: int
    hidden_size: int
    dtype: str = "bf16"

    def __post_init__(self) -> None:
        if self.dtype not in BYTES_PER_VALUE:
            raise ValueError(f"hidden-state dtype must be one of {sorted(BYTES_PER_VALUE)}, not {self.dtype!r}")

    def bytes_per_token(self) -> int:
        return self.layers * self.hidden_size * BYTES_PER_VALUE[self.dtype] + (4 if self.dtype == "fp8" else 0)

    def bytes_for(self, tokens: int) -> int:
        return tokens * self.bytes_per_token()


@dataclass
class Stats:
    total: int = 0
    kept: int = 0
    redone: int = 0
    fused: int = 0
    extracted: int = 0
    failed: dict[int, str] = field(default_factory=dict)
    missing: int = 0
    tokens: int = 0
    started: float = field(default_factory=time.monotonic)

    def summary(self) -> dict[str, Any]:
        elapsed = time.monotonic() - self.started
        return {
            "total": self.total,
            "kept": self.kept,
            "redone": self.redone,
            "fused": self.fused,
            "extracted": self.extracted,
            "failed": len(self.failed),
            "missing": self.missing,
            "failures": {str(k): v for k, v in sorted(self.failed.items())[:20]},
            "tokens_written": self.tokens,
            "elapsed_s": round(elapsed, 2),
            "tokens_per_s": round(self.tokens / elapsed, 1) if elapsed > 0 else 0.0,
        }


def hs_path(out: Path, index: int) -> Path:
    return out / f"hs_{index}.safetensors"


def shard(num_rows: int, rank: int, world_size: int) -> range:
    """Contiguous chunks differing by at most one row, as speculators' own sharding."""
    size, extra = divmod(num_rows, world_size)
    start = rank * size + min(rank, extra)
    return range(start, start + size + (1 if rank < extra else 0))


def token_key(ids: Iterable[int]) -> str:
    return hashlib.sha1(json.dumps(list(ids)).encode()).hexdigest()


def stored_dtype(dtype: str, has_scales: bool) -> str:
    """The format a file is in: fp8 (float8 states with per-token scales), bf16 (the states as the
    server computed them: bf16 for Kimi-K2.5), or what else it is."""
    if has_scales:
        return "fp8" if dtype == "F8_E4M3" else f"{dtype} with scales"
    return f"{dtype} without scales" if dtype.startswith("F8") else "bf16"


def dequantized(data: dict[str, Any]) -> dict[str, Any]:
    """An FP8 file's tensors as bf16, as speculators' FP8 reader (``hs_connectors.FP8Transfer``) gives them."""
    from hs_connectors.fp8_utils import SCALES_KEY, dequantize_fp8_tensor

    if SCALES_KEY not in data:
        return data

    states = dequantize_fp8_tensor(data["hidden_states"], data[SCALES_KEY])
    return {k: v for k, v in data.items() if k != SCALES_KEY} | {"hidden_states": states}


def check_file(path: Path, token_ids: list[int], shape: Shape, full: bool = False) -> str | None:
    """Why ``path`` is not a usable hidden-states file for these tokens (None when it is)."""
    from hs_connectors.fp8_utils import SCALES_KEY
    from safetensors import safe_open
    from speculators.data_generation.offline import check_hidden_states

    try:
        with safe_open(path, framework="pt") as f:
            states = f.get_slice("hidden_states")
            stored = stored_dtype(states.get_dtype(), SCALES_KEY in f.keys())  # noqa: SIM118 - not iterable
            if stored != shape.dtype:
                return f"stored as {stored}, expected {shape.dtype}"
            dims = list(states.get_shape())
            if not full and f.get_tensor("token_ids").tolist() != token_ids:
                return "token ids differ from the prepared row"
        if full:
            from safetensors.torch import load_file

            check_hidden_states(dequantized(load_file(path)), token_ids)
    except FileNotFoundError:
        return "missing"
    except Exception as err:
        return f"unreadable: {err}"
    if dims != [len(token_ids), shape.layers, shape.hidden_size]:
        return f"shape {dims}, expected {[len(token_ids), shape.layers, shape.hidden_size]}"
    return None


def place(src: Path, dst: Path, token_ids: list[int], shape: Shape, keep_source: bool = False) -> None:
    """Validate ``src`` fully, then put it at ``dst`` atomically: moved (a server's scratch file),
    or with ``keep_source`` hard-linked (copied across filesystems), so that a fused capture stays
    where generation recorded it and extraction can be redone (prepare ran again) without
    generating again. A hard link costs no disk."""
    problem = check_file(src, token_ids, shape, full=True)
    if problem:
        raise ValueError(f"{src}: {problem}")
    tmp = dst.with_name(f".{dst.name}.tmp")
    tmp.unlink(missing_ok=True)
    same_fs = src.stat().st_dev == dst.parent.stat().st_dev
    try:
        if same_fs:
            os.link(src, tmp) if keep_source else os.replace(src, tmp)
        else:
            shutil.copyfile(src, tmp)
        with tmp.open("rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    if not keep_source:
        src.unlink(missing_ok=True)


def free_bytes(path: Path) -> int:
    probe = path
    while not probe.exists():
        probe = probe.parent
    return shutil.disk_usage(probe).free


def check_disk(out: Path, needed: int, reserve: int) -> None:
    free = free_bytes(out)
    if needed + reserve > free:
        raise NotEnoughDisk(
            f"hidden states need {needed / 2**30:.2f} GiB (+ {reserve / 2**30:.2f} GiB reserve) under {out}, "
            f"only {free / 2**30:.2f} GiB free: free space, point --out at a larger disk, "
            "shard over more hosts (--world-size), or train online (hidden states made and deleted per step)"
        )


def fused_index(rows_dirs: list[Path]) -> dict[str, list[Path]]:
    """token-id key → hidden-states files (identical answers share a key), from
    ``jobs.generate --fused-hidden-states`` rows."""
    index: dict[str, list[Path]] = {}
    for rows_file in rows_paths(rows_dirs):
        with rows_file.open() as f:
            for line in f:
                row = json.loads(line)
                if row.get("hidden_states_path"):
                    path = Path(row["hidden_states_path"])
                    # Rows gathered from another host carry their files in hidden_states/.
                    gathered = rows_file.parent / "hidden_states" / path.name
                    if not path.exists() and gathered.exists():
                        path = gathered
                    index.setdefault(token_key(row["input_ids"]), []).append(path)
    return index


@dataclass
class Plan:
    todo: list[int]
    tokens: dict[int, list[int]]


def plan(dataset: Any, indices: Iterable[int], out: Path, shape: Shape, stats: Stats) -> Plan:
    todo, tokens = [], {}
    for i in indices:
        ids = [int(t) for t in dataset[i]["input_ids"]]
        stats.total += 1
        path = hs_path(out, i)
        problem = check_file(path, ids, shape) if path.exists() else "missing"
        if problem is None:
            stats.kept += 1
            continue
        if problem != "missing":
            LOG.warning("redoing %s: %s", path.name, problem)
            stats.redone += 1
            path.unlink()
        todo.append(i)
        tokens[i] = ids
    return Plan(todo, tokens)


async def extract_from_server(
    server: str, model: str | None, todo: list[int], tokens: dict[int, list[int]], out: Path, shape: Shape,
    concurrency: int, request_timeout: float, max_retries: int, stats: Stats,
) -> None:  # fmt: skip
    import openai
    from speculators.data_generation.vllm_client import generate_hidden_states_async, wait_for_lock_async

    async with openai.AsyncOpenAI(base_url=server.rstrip("/") + "/v1", api_key="EMPTY", max_retries=0) as client:
        served = [m.id for m in (await client.models.list()).data]
        model = model or served[0]
        if model not in served:
            raise ValueError(f"model {model!r} is not served at {server} (serves {served})")
        pending: Iterator[int] = iter(todo)
        last_report = time.monotonic()

        async def worker() -> None:
            nonlocal last_report
            for i in pending:
                try:
                    handle, _ = await generate_hidden_states_async(
                        client, model, {"input_ids": tokens[i]}, timeout=request_timeout, max_retries=max_retries
                    )
                    if Path(handle + ".lock").exists():
                        await wait_for_lock_async(handle + ".lock")
                    await asyncio.to_thread(place, Path(handle), hs_path(out, i), tokens[i], shape)
                except Exception as err:
                    stats.failed[i] = f"{type(err).__name__}: {err}"
                    continue
                stats.extracted += 1
                stats.tokens += len(tokens[i])
                if time.monotonic() - last_report > 10:
                    last_report = time.monotonic()
                    LOG.info("extracted %d/%d rows, %d failed", stats.extracted, len(todo), len(stats.failed))

        await asyncio.gather(*(worker() for _ in range(concurrency)))


def gather_fused(
    index: dict[str, list[Path]], todo: list[int], tokens: dict[int, list[int]], out: Path, shape: Shape, stats: Stats
) -> list[int]:
    """Link fused-capture files into place; return the rows still without hidden states."""
    left = []
    for i in todo:
        candidates = [p for p in index.get(token_key(tokens[i]), []) if p.exists()]
        src = candidates[0] if candidates else None
        if src is None:
            left.append(i)
            continue
        try:
            place(src, hs_path(out, i), tokens[i], shape, keep_source=True)
        except ValueError as err:
            LOG.warning("fused file for row %d not usable (%s); it will be extracted", i, err)
            left.append(i)
            continue
        Path(str(src) + ".lock").unlink(missing_ok=True)
        stats.fused += 1
        stats.tokens += len(tokens[i])
    return left


@dataclass
class Settings:
    data: Path
    out: Path
    shape: Shape
    server: str | None = None
    model: str | None = None
    fused_rows: list[Path] = field(default_factory=list)
    rank: int = 0
    world_size: int = 1
    concurrency: int = 32
    request_timeout: float = 600.0
    max_retries: int = 3
    reserve_bytes: int = 1 << 30
    partial: bool = False


def extract(s: Settings) -> dict[str, Any]:
    from datasets import load_from_disk

    dataset = load_from_disk(str(s.data))
    s.out.mkdir(parents=True, exist_ok=True)
    stats = Stats()
    # Fused files are matched by content, so every host gathers the rows it generated;
    # a server pass covers this rank's shard.
    indices = range(len(dataset)) if s.fused_rows and not s.server else shard(len(dataset), s.rank, s.world_size)
    work = plan(dataset, indices, s.out, s.shape, stats)
    needed = s.shape.bytes_for(sum(len(work.tokens[i]) for i in work.todo))
    LOG.info(
        "%d rows in shard, %d complete, %d to write (%.2f GiB)", stats.total, stats.kept, len(work.todo), needed / 2**30
    )
    check_disk(s.out, needed, s.reserve_bytes)
    left = work.todo
    if s.fused_rows:
        left = gather_fused(fused_index(s.fused_rows), left, work.tokens, s.out, s.shape, stats)
    if s.server and left:
        asyncio.run(
            extract_from_server(
                s.server, s.model, left, work.tokens, s.out, s.shape, s.concurrency, s.request_timeout,
                s.max_retries, stats,
            )
        )  # fmt: skip
    stats.missing = stats.total - stats.kept - stats.fused - stats.extracted
    summary = stats.summary() | {"rank": s.rank, "world_size": s.world_size, "out": str(s.out)}
    (s.out / f"extract-summary-{s.rank}.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def shape_from_model(model_dir: Path, layers: int, dtype: str = "bf16") -> Shape:
    """Hidden size from a model's config.json (nested ``text_config`` for multimodal wrappers)."""
    config = json.loads((model_dir / "config.json").read_text())
    config = config.get("text_config") or config
    return Shape(layers=layers, hidden_size=int(config["hidden_size"]), dtype=dtype)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.extract", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="dataset dir from speculators prepare-data")
    parser.add_argument("--out", type=Path, help="default: <data>/hidden_states (where speculators reads them)")
    parser.add_argument("--server", help="vLLM server with extract_hidden_states, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", help="served model name (default: the server's only model)")
    parser.add_argument(
        "--fused-rows",
        type=Path,
        action="append",
        default=[],
        help="a rows-<rank>.jsonl file or a jobs.generate output dir (repeat)",
    )
    parser.add_argument("--layers", type=int, required=True, help="layers captured per token (aux + final)")
    parser.add_argument("--hidden-size", type=int, help="target hidden size (or give --target)")
    parser.add_argument("--target", type=Path, help="target model dir, to read hidden_size from config.json")
    parser.add_argument(
        "--hidden-states-dtype", choices=sorted(BYTES_PER_VALUE), default="bf16",
        help="how the files store the states: bf16 as the server computes them, or fp8 (the FP8 connector's)",
    )  # fmt: skip
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--request-timeout", type=float, default=600.0)
    parser.add_argument("--max-retries", type=int, default=3)
    parser.add_argument("--reserve-gb", type=float, default=1.0, help="free space to leave on the disk")
    parser.add_argument(
        "--partial", action="store_true", help="rows without hidden states are not an error (multi-host fused gather)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for noisy in ("httpx", "httpx2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if not args.server and not args.fused_rows:
        parser.error("give --server, --fused-rows, or both")
    if args.hidden_size:
        shape = Shape(args.layers, args.hidden_size, args.hidden_states_dtype)
    elif args.target:
        shape = shape_from_model(args.target, args.layers, args.hidden_states_dtype)
    else:
        parser.error("give --hidden-size or --target")
    settings = Settings(
        data=args.data, out=args.out or args.data / "hidden_states", shape=shape, server=args.server,
        model=args.model, fused_rows=args.fused_rows, rank=args.rank, world_size=args.world_size,
        concurrency=args.concurrency, request_timeout=args.request_timeout, max_retries=args.max_retries,
        reserve_bytes=int(args.reserve_gb * 2**30), partial=args.partial,
    )  # fmt: skip
    try:
        summary = extract(settings)
    except NotEnoughDisk as err:
        LOG.error("%s", err)
        return EXIT_NO_SPACE
    print(json.dumps(summary))
    if summary["missing"] and not settings.partial:
        LOG.error(
            "%d of %d rows have no hidden states (%d failed: see the summary); rerun to retry them",
            summary["missing"], summary["total"], summary["failed"],
        )  # fmt: skip
        return EXIT_INCOMPLETE
    return 0


if __name__ == "__main__":
    sys.exit(main())
