"""Measure a trained EAGLE-3 drafter where it will run: in vLLM, as a speculative model.

For each drafter (the trained one, an untrained one of the same config for a baseline, and
optionally a reference), a vLLM server is started with the target and
``{"method": "eagle3", "model": <drafter>, "num_speculative_tokens": K}``, the held-out prompts
are sent at temperature 0, and vLLM's own counters are read from ``/metrics``:

* mean acceptance length = 1 + accepted tokens / drafts (tokens emitted per target step),
* acceptance rate per draft position = accepted at position i / drafts.

Writes ``report.json`` and ``acceptance.svg`` (acceptance per position) into ``--out``.

    python -m jobs.validate --target /srv/models/tiny --drafter trained=runs/x/drafter/final \\
        --drafter untrained=runs/x/drafter-untrained --prompts heldout.jsonl --out runs/x/validation
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from jobs.generate import read_records, to_question
from jobs.vllm_process import VllmProcess

LOG = logging.getLogger("jobs.validate")
METRIC = re.compile(r"^(vllm:spec_decode_num_\w+?)(?:_total)?(?:\{([^}]*)\})?\s+([0-9.eE+-]+)$")


def parse_metrics(text: str) -> dict[str, Any]:
    """vLLM's spec-decode counters: drafts, draft_tokens, accepted_tokens, per-position accepted."""
    out: dict[str, Any] = {"per_position": {}}
    for line in text.splitlines():
        match = METRIC.match(line.strip())
        if not match or line.startswith("#"):
            continue
        name, labels, value = match.group(1), match.group(2) or "", float(match.group(3))
        key = name.removeprefix("vllm:spec_decode_num_")
        if key.endswith("_created"):
            continue
        position = re.search(r'position="(\d+)"', labels)
        if key == "accepted_tokens_per_pos" and position:
            pos = int(position.group(1))
            out["per_position"][pos] = out["per_position"].get(pos, 0.0) + value
        elif key in ("drafts", "draft_tokens", "accepted_tokens"):
            out[key] = out.get(key, 0.0) + value
    return out


def acceptance(before: dict[str, Any], after: dict[str, Any], k: int) -> dict[str, Any]:
    drafts = after.get("drafts", 0.0) - before.get("drafts", 0.0)
    accepted = after.get("accepted_tokens", 0.0) - before.get("accepted_tokens", 0.0)
    if drafts <= 0:
        raise RuntimeError("vLLM reported no drafts: is the speculative config applied?")
    per_pos = [(after["per_position"].get(i, 0.0) - before["per_position"].get(i, 0.0)) / drafts for i in range(k)]
    return {
        "drafts": int(drafts),
        "accepted_tokens": int(accepted),
        "mean_acceptance_length": round(1 + accepted / drafts, 4),
        "acceptance_rate": round(accepted / (drafts * k), 4),
        "per_position": [round(p, 4) for p in per_pos],
    }


async def send_prompts(
    url: str, prompts: list[list[dict[str, str]]], max_tokens: int, concurrency: int, label: str = "",
    every: float = 5.0,
) -> int:  # fmt: skip
    """Send the prompts, ``concurrency`` at a time; logs '<label>: N/T prompts' every ``every`` s."""
    sem = asyncio.Semaphore(concurrency)
    done = 0

    async def report() -> None:
        while True:
            await asyncio.sleep(every)
            LOG.info("validate %s: %d/%d prompts", label, done, len(prompts))

    async with httpx.AsyncClient(base_url=url, timeout=600) as client:

        async def one(messages: list[dict[str, str]]) -> int:
            nonlocal done
            async with sem:
                body = {"model": "target", "messages": messages, "max_tokens": max_tokens, "temperature": 0.0}
                response = await client.post("/v1/chat/completions", json=body)
                response.raise_for_status()
                done += 1
                return int(response.json()["usage"]["completion_tokens"])

        reporter = asyncio.create_task(report())
        try:
            return sum(await asyncio.gather(*(one(m) for m in prompts)))
        finally:
            reporter.cancel()


def measure(
    name: str, target: Path, drafter: Path, prompts: list[list[dict[str, str]]], k: int, max_tokens: int, concurrency: int,
    server_args: list[str], log: Path,
) -> dict[str, Any]:  # fmt: skip
    spec = {"method": "eagle3", "model": str(drafter), "num_speculative_tokens": k}
    LOG.info("validate %s: starting vLLM with the drafter (log %s)", name, log)
    loading = time.monotonic()
    with VllmProcess(target, ["--speculative-config", json.dumps(spec), *server_args], log=log) as url:
        LOG.info("validate %s: server up in %.0f s; 0/%d prompts", name, time.monotonic() - loading, len(prompts))
        before = parse_metrics(httpx.get(f"{url}/metrics").text)
        started = time.monotonic()
        tokens = asyncio.run(send_prompts(url, prompts, max_tokens, concurrency, name))
        elapsed = time.monotonic() - started
        LOG.info("validate %s: %d/%d prompts in %.0f s", name, len(prompts), len(prompts), elapsed)
        after = parse_metrics(httpx.get(f"{url}/metrics").text)
    return acceptance(before, after, k) | {"completion_tokens": tokens, "elapsed_s": round(elapsed, 2)}


def plot_svg(results: dict[str, dict[str, Any]], k: int) -> str:
    """Acceptance rate per draft position, one polyline per drafter (no plotting library needed)."""
    width, height, pad = 480, 300, 40
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]

    def x(i: int) -> float:
        return pad + (width - 2 * pad) * (i / max(k - 1, 1))

    def y(v: float) -> float:
        return height - pad - (height - 2 * pad) * v

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        'font-size="12">',
        f'<line x1="{pad}" y1="{y(0)}" x2="{width - pad}" y2="{y(0)}" stroke="black"/>',
        f'<line x1="{pad}" y1="{y(0)}" x2="{pad}" y2="{y(1)}" stroke="black"/>',
        f'<text x="{width / 2}" y="{height - 8}" text-anchor="middle">draft position</text>',
        f'<text x="10" y="{pad - 12}">acceptance rate (1.0 at top)</text>',
    ]
    for i in range(k):
        parts.append(f'<text x="{x(i)}" y="{y(0) + 16}" text-anchor="middle">{i + 1}</text>')
    for n, (name, result) in enumerate(results.items()):
        color = colors[n % len(colors)]
        points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(result["per_position"]))
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{points}"/>')
        label = f"{name}: mean acceptance length {result['mean_acceptance_length']}"
        parts.append(f'<text x="{width - pad}" y="{pad + 16 * n}" text-anchor="end" fill="{color}">{label}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def validate(
    target: Path, drafters: dict[str, Path], prompts_path: Path, out: Path, k: int = 3, max_tokens: int = 256,
    concurrency: int = 8, server_args: list[str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    prompts = [to_question(record).messages for record in read_records(prompts_path)]
    if not prompts:
        raise ValueError(f"no prompts in {prompts_path}")
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for name, drafter in drafters.items():
        LOG.info("measuring %s (%s) on %d prompts", name, drafter, len(prompts))
        results[name] = measure(
            name, target, drafter, prompts, k, max_tokens, concurrency, server_args or [], out / f"vllm-{name}.log"
        ) | {"drafter": str(drafter)}
        LOG.info("%s: mean acceptance length %s", name, results[name]["mean_acceptance_length"])
    report: dict[str, Any] = {
        "target": str(target), "prompts": str(prompts_path), "num_prompts": len(prompts),
        "num_speculative_tokens": k, "max_tokens": max_tokens, "temperature": 0.0, "drafters": results,
    }  # fmt: skip
    if "trained" in results and "untrained" in results:
        trained, untrained = (results[n]["mean_acceptance_length"] for n in ("trained", "untrained"))
        report["trained_over_untrained"] = round(trained / untrained, 4)
        report["trained_minus_untrained"] = round(trained - untrained, 4)
    (out / "acceptance.svg").write_text(plot_svg(results, k))
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.validate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--drafter", action="append", required=True, metavar="NAME=DIR", help="repeatable")
    parser.add_argument("--prompts", type=Path, required=True, help="held-out prompts (JSON/JSONL/Parquet)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--num-speculative-tokens", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--server-arg", action="append", default=[], help="extra vLLM argument (repeatable)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    drafters = {}
    for item in args.drafter:
        name, sep, path = item.partition("=")
        if not sep:
            parser.error(f"--drafter takes NAME=DIR, got {item!r}")
        drafters[name] = Path(path)
    report = validate(
        args.target, drafters, args.prompts, args.out, args.num_speculative_tokens, args.max_tokens,
        args.concurrency, args.server_arg,
    )  # fmt: skip
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
