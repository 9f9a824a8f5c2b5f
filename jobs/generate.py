"""Synthetic generation: the target's own answers, reasoning included, as training rows.

Each question goes to the vLLM server's chat API on its own, with bounded concurrency. A row
keeps the whole output: reasoning (``reasoning``/``reasoning_content`` when the server runs a
reasoning parser, else the raw ``<think>`` text inside the answer), the final answer,
``finish_reason``, usage, and the exact prompt and completion token ids the server used
(``return_token_ids``), so the training row is the very token sequence the target produced:
``input_ids`` = prompt + completion, ``loss_mask`` 0 over the prompt and 1 over the generated
tokens -- the speculator format ``speculators prepare-data`` passes through.

Resumable: rows are appended and flushed one by one to ``<out>/rows-<rank>.jsonl``; a restart
skips every id already in any ``rows-*.jsonl`` of the directory and cuts a partial last line
left by a killed run. Permanent errors go to ``<out>/errors-<rank>.jsonl``. Sharded by
``--rank``/``--world-size`` on a hash of the row id, so hosts split one dataset with no
overlap and no gap.

    python -m jobs.generate --input questions.jsonl --out runs/gen \\
        --server http://127.0.0.1:8000 --model tiny --concurrency 64 --max-tokens 8192
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import random
import sys
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from jobs import hidden_state_files

LOG = logging.getLogger("jobs.generate")
RETRYABLE_STATUS = {408, 429, 500, 502, 503, 504}
# Seconds a fused row waits for the server to write its hidden-state file.
HIDDEN_STATES_WAIT = 60.0
ROLE_NAMES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


class ServerUnreachable(RuntimeError):
    """The server did not answer for longer than the allowed bound."""


@dataclass
class Question:
    id: str
    messages: list[dict[str, str]]


@dataclass
class Stats:
    total: int = 0
    skipped_done: int = 0
    done: int = 0
    errors: int = 0
    failed: int = 0
    malformed: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_rows: int = 0
    truncated: int = 0
    started: float = field(default_factory=time.monotonic)

    def summary(self) -> dict[str, Any]:
        elapsed = time.monotonic() - self.started
        out = {k: v for k, v in asdict(self).items() if k != "started"}
        out["elapsed_s"] = round(elapsed, 2)
        out["completion_tokens_per_s"] = round(self.completion_tokens / elapsed, 1) if elapsed else 0.0
        out["truncation_rate"] = round(self.truncated / self.done, 4) if self.done else 0.0
        out["error_fraction"] = round(self.failed / self.total, 4) if self.total else 0.0
        return out


# ---------- input ----------


class InputUnreadable(ValueError):
    """The dataset file itself cannot be read (as opposed to one malformed row in it)."""


class NothingToGenerate(ValueError):
    """This generator's shard of the dataset holds no question at all."""


def read_records(path: Path) -> Iterator[Any]:
    """Rows of a JSON list, JSONL, Parquet file or a ``datasets`` directory, as they are.

    Raises InputUnreadable, with one line naming the file and what is wrong, when the file as a
    whole cannot be read; a malformed JSONL line is yielded as a ValueError (one row skipped)."""
    try:
        yield from _records(path)
    except InputUnreadable:
        raise
    except UnicodeDecodeError as err:
        raise InputUnreadable(f"{path}: not UTF-8 text (byte 0x{err.object[err.start]:02x})") from None
    except json.JSONDecodeError as err:
        raise InputUnreadable(f"{path}: not valid JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    except Exception as err:  # pyarrow's and datasets' own errors: their message says what is wrong
        if not (path.is_dir() or path.suffix == ".parquet"):
            raise
        what = "a datasets directory" if path.is_dir() else "a Parquet file"
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputUnreadable(f"{path}: cannot be read as {what} ({first})") from None


def _records(path: Path) -> Iterator[Any]:
    if path.is_dir():
        from datasets import load_from_disk

        yield from load_from_disk(str(path))
    elif path.suffix == ".parquet":
        import pyarrow.parquet as pq

        yield from pq.read_table(path).to_pylist()
    elif path.suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, list | dict):
            raise InputUnreadable(
                f'{path}: holds a JSON {type(data).__name__}, not a list of rows or {{"data": [...]}}'
            )
        yield from data if isinstance(data, list) else data.get("data", [])
    else:
        with path.open("rb") as raw:
            for number, data in enumerate(raw, 1):
                try:
                    line = data.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise InputUnreadable(
                        f"{path}: not UTF-8 text (line {number}, byte 0x{data[err.start]:02x} at column {err.start + 1})"
                    ) from None
                if not line.strip():
                    continue
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as err:
                    yield ValueError(f"line {number}: not JSON ({err.msg})")


def check_input(path: Path) -> dict[str, int]:
    """Read every row of the dataset without generating: how many there are and how many are
    usable questions. Raises InputUnreadable for a file that cannot be read at all."""
    counts = {"rows": 0, "questions": 0, "malformed": 0}
    for record in read_records(path):
        counts["rows"] += 1
        try:
            to_question(record)
        except ValueError:
            counts["malformed"] += 1
        else:
            counts["questions"] += 1
    return counts


def to_question(record: Any) -> Question:
    """One input row as the messages to send; raises ValueError for a row that has none."""
    if isinstance(record, Exception):
        raise record
    if not isinstance(record, dict):
        raise ValueError(f"row is {type(record).__name__}, not an object")
    if isinstance(record.get("prompt"), str) and not record["prompt"].strip():
        raise ValueError("row's 'prompt' is empty")
    if isinstance(record.get("prompt"), str):
        messages = [{"role": "user", "content": record["prompt"]}]
    elif isinstance(record.get("conversations") or record.get("messages"), list):
        messages = []
        for turn in record.get("conversations") or record.get("messages"):
            if not isinstance(turn, dict):
                raise ValueError("a conversation turn is not an object")
            role = ROLE_NAMES.get(str(turn.get("from", turn.get("role", ""))).lower())
            text = turn.get("value", turn.get("content"))
            if role is None or not isinstance(text, str):
                raise ValueError(f"turn without a known role and text: {sorted(turn)}")
            if role == "assistant":
                break  # the target writes its own answer to the question that came before
            messages.append({"role": role, "content": text})
        if not any(m["role"] == "user" for m in messages):
            raise ValueError("conversation has no user turn before the first answer")
    else:
        raise ValueError("row has neither 'prompt' nor 'conversations'/'messages'")
    given = record.get("id")
    row_id = str(given) if given not in (None, "") else content_id(messages)
    return Question(row_id, messages)


def content_id(messages: list[dict[str, str]]) -> str:
    blob = json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def shard_of(row_id: str, world_size: int) -> int:
    return int(hashlib.sha256(row_id.encode()).hexdigest()[:8], 16) % world_size


# ---------- output ----------


def repair_tail(path: Path) -> None:
    """Cut a partial last line (a run killed mid-write) so the file holds whole rows only."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb+") as handle:
        handle.seek(-1, os.SEEK_END)
        if handle.read(1) == b"\n":
            return
        data = path.read_bytes()
        keep = data.rfind(b"\n") + 1
        handle.truncate(keep)
        LOG.warning("cut a partial last row (%d bytes) from %s", len(data) - keep, path)


MALFORMED = "malformed input"


def failed_rows(path: Path) -> int:
    """Questions recorded in ``errors-<rank>.jsonl`` as failed for good, by this run or an
    earlier one (not the malformed input rows rank 0 records there too)."""
    if not path.exists():
        return 0
    with path.open() as lines:
        return sum(not json.loads(line)["reason"].startswith(MALFORMED) for line in lines if line.strip())


def finished_ids(out: Path) -> set[str]:
    done: set[str] = set()
    for path in sorted(out.glob("rows-*.jsonl")) + sorted(out.glob("errors-*.jsonl")):
        repair_tail(path)
        with path.open() as lines:
            for line in lines:
                done.add(json.loads(line)["id"])
    return done


class RowWriter:
    """Appends one JSON line per call with a single write, flushed and synced at once."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, row: dict[str, Any]) -> None:
        os.write(self.fd, (json.dumps(row, ensure_ascii=False) + "\n").encode())
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


# ---------- requests ----------


def split_reasoning(message: dict[str, Any]) -> tuple[str | None, str]:
    """(reasoning, answer) from a chat message, with or without a server-side reasoning parser."""
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    content = message.get("content") or ""
    if reasoning is None and "</think>" in content:
        head, _, tail = content.partition("</think>")
        reasoning, content = head.replace("<think>", "", 1).strip("\n"), tail.lstrip("\n")
    return reasoning, content


def build_row(question: Question, body: dict[str, Any], sampling: dict[str, Any]) -> dict[str, Any]:
    choice = body["choices"][0]
    prompt_ids = body.get("prompt_token_ids") or []
    completion_ids = choice.get("token_ids") or []
    if not prompt_ids or not completion_ids:
        raise ValueError("server returned no token ids; is it vLLM with return_token_ids support?")
    reasoning, content = split_reasoning(choice["message"])
    hidden_states_path = (body.get("kv_transfer_params") or {}).get("hidden_states_path")
    # With fused capture the last generated token was never fed through the model, so it has no
    # hidden state: the training sequence ends one token earlier, matching the captured file.
    trained_ids = completion_ids[:-1] if hidden_states_path else completion_ids
    return {
        "id": question.id,
        "messages": question.messages,
        "reasoning": reasoning,
        "content": content,
        "finish_reason": choice.get("finish_reason"),
        "usage": body.get("usage"),
        "prompt_token_ids": prompt_ids,
        "completion_token_ids": completion_ids,
        "input_ids": prompt_ids + trained_ids,
        "loss_mask": [0] * len(prompt_ids) + [1] * len(trained_ids),
        "sampling": sampling,
        "model": body.get("model"),
        "hidden_states_path": hidden_states_path,
    }


@dataclass
class Settings:
    server: str
    model: str
    concurrency: int
    sampling: dict[str, Any]
    unreachable_timeout: float
    request_timeout: float
    max_attempts: int
    fused_hidden_states: bool
    # The server's hidden-states directory (fused capture): locks and orphaned files are removed.
    hidden_states_dir: Path | None = None
    # Start of every request id (X-Request-Id): hidden_state_files.request_prefix, set by generate().
    request_prefix: str = "e3g-"


class Generator:
    def __init__(self, settings: Settings, rows: RowWriter, errors: RowWriter, stats: Stats) -> None:
        self.s = settings
        self.rows, self.errors, self.stats = rows, errors, stats
        self.unreachable_since: float | None = None
        self.client = httpx.AsyncClient(
            base_url=settings.server.rstrip("/"),
            timeout=httpx.Timeout(settings.request_timeout, connect=10.0),
            limits=httpx.Limits(max_connections=settings.concurrency, max_keepalive_connections=settings.concurrency),
        )

    def payload(self, question: Question) -> dict[str, Any]:
        body = {"model": self.s.model, "messages": question.messages, "return_token_ids": True, **self.s.sampling}
        if self.s.fused_hidden_states:
            body["kv_transfer_params"] = {"include_output_tokens": True}
        return body

    async def ask(self, question: Question) -> None:
        """Send one question until it succeeds or fails for good.

        A server that does not answer at all is retried until ``unreachable_timeout`` and then
        stops the whole job (no row is written off as an error for it); overload and server
        errors (429, 5xx) are retried ``max_attempts`` times; other answers are final.
        """
        attempt = 0
        while True:
            try:
                response = await self.client.post(
                    "/v1/chat/completions", json=self.payload(question),
                    headers={"X-Request-Id": f"{self.s.request_prefix}{uuid.uuid4().hex[:16]}"},
                )  # fmt: skip
            except (httpx.TransportError, OSError) as err:
                self.note_unreachable(err)
                await self.backoff(min(attempt + 1, 4))
                continue
            self.unreachable_since = None
            if response.status_code in RETRYABLE_STATUS:
                attempt += 1
                if attempt >= self.s.max_attempts:
                    self.fail(question, f"HTTP {response.status_code} after {attempt} attempts: {response.text[:300]}")
                    return
                await self.backoff(attempt)
                continue
            if response.status_code != 200:
                self.fail(question, f"HTTP {response.status_code}: {response.text[:500]}")
                return
            try:
                row = build_row(question, response.json(), self.s.sampling)
            except (ValueError, KeyError, IndexError) as err:
                self.fail(question, f"unusable response: {err}")
                return
            if row["hidden_states_path"]:
                await self.wait_for_hidden_states(row)
            self.rows.write(row)
            self.count(row)
            return

    async def wait_for_hidden_states(self, row: dict[str, Any]) -> None:
        """Record a fused row only once the server has written its file (and, with
        ``hidden_states_dir``, remove its lock): the server answers before it writes, and a job
        that ended on its last answers would let the server be stopped with those writes pending.
        A file that does not appear in ``HIDDEN_STATES_WAIT`` s is left out of the row (extraction
        then makes it); a server whose directory is not on this machine is not waited for."""
        path = Path(row["hidden_states_path"])
        if not path.parent.is_dir():
            return
        release = hidden_state_files.release_lock if self.s.hidden_states_dir else hidden_state_files.wait_written
        if not await asyncio.to_thread(release, path, HIDDEN_STATES_WAIT):
            LOG.warning(
                "%s: hidden states %s not written after %.0f s; the row is kept without them",
                row["id"],
                path,
                HIDDEN_STATES_WAIT,
            )
            row["hidden_states_path"] = None

    def note_unreachable(self, err: Exception) -> None:
        now = time.monotonic()
        if self.unreachable_since is None:
            self.unreachable_since = now
            LOG.warning("server %s not answering (%s); retrying", self.s.server, type(err).__name__)
        elif now - self.unreachable_since > self.s.unreachable_timeout:
            raise ServerUnreachable(
                f"server {self.s.server} unreachable for {now - self.unreachable_since:.0f} s "
                f"(limit {self.s.unreachable_timeout:.0f} s): is the vLLM unit running? Finished rows are "
                "kept; rerun the same command to resume."
            )

    async def backoff(self, attempt: int) -> None:
        self.stats.retries += 1
        await asyncio.sleep(min(30.0, 0.5 * 2 ** (attempt - 1)) * (0.5 + random.random()))

    def fail(self, question: Question, reason: str) -> None:
        self.errors.write({"id": question.id, "reason": reason})
        self.stats.errors += 1
        self.stats.failed += 1
        LOG.error("row %s failed: %s", question.id, reason)

    def count(self, row: dict[str, Any]) -> None:
        self.stats.done += 1
        self.stats.prompt_tokens += len(row["prompt_token_ids"])
        self.stats.completion_tokens += len(row["completion_token_ids"])
        self.stats.reasoning_rows += bool(row["reasoning"])
        self.stats.truncated += row["finish_reason"] == "length"

    async def run(self, questions: Iterator[Question]) -> None:
        """Ask every question, ``concurrency`` at a time; the first fatal error stops them all."""

        async def worker() -> None:
            # One event loop: the workers take turns on the shared iterator, each question once.
            for question in questions:
                await self.ask(question)

        workers = [asyncio.create_task(worker()) for _ in range(self.s.concurrency)]
        progress = asyncio.create_task(self.report())
        try:
            await asyncio.gather(*workers)
        finally:
            for task in [*workers, progress]:
                task.cancel()
            await self.client.aclose()

    async def report(self, every: float = 5.0, window: float = 60.0) -> None:
        """A progress line every ``every`` s: rows done, errors, and the token rate over the last
        ``window`` s (not the lifetime average, which hides a stall); while the server does not
        answer, how long it has not and the limit, from the first failed request."""
        recent: deque[tuple[float, int]] = deque([(time.monotonic(), self.stats.completion_tokens)])
        while True:
            await asyncio.sleep(every)
            print(self.progress_line(recent, window), file=sys.stderr, flush=True)

    def progress_line(self, recent: deque[tuple[float, int]], window: float) -> str:
        s, now = self.stats, time.monotonic()
        recent.append((now, s.completion_tokens))
        while len(recent) > 2 and now - recent[1][0] >= window:
            recent.popleft()
        tokens_then, span = recent[0][1], now - recent[0][0]
        line = f"generate: {s.done + s.skipped_done}/{s.total} rows, {s.failed} failed"
        if self.unreachable_since is not None:
            return (
                f"{line}, server unreachable for {now - self.unreachable_since:.0f} s "
                f"(limit {self.s.unreachable_timeout:.0f} s)"
            )
        return f"{line}, {(s.completion_tokens - tokens_then) / span if span > 0 else 0.0:.0f} tok/s"


# ---------- the job ----------


def plan(
    input_path: Path, rank: int, world_size: int, done: set[str], stats: Stats, errors: RowWriter
) -> list[Question]:
    """This rank's questions not yet finished; malformed rows are reported and counted."""
    todo: list[Question] = []
    seen: set[str] = set()
    for number, record in enumerate(read_records(input_path), 1):
        try:
            question = to_question(record)
        except ValueError as err:
            stats.malformed += 1
            LOG.warning("input row %d skipped: %s", number, err)
            if rank == 0 and f"input-row-{number}" not in done:
                errors.write({"id": f"input-row-{number}", "reason": f"{MALFORMED}: {err}"})
            continue
        if shard_of(question.id, world_size) != rank or question.id in seen:
            continue
        seen.add(question.id)
        stats.total += 1
        if question.id in done:
            stats.skipped_done += 1
        else:
            todo.append(question)
    return todo


def tidy_hidden_states(settings: Settings, out: Path) -> hidden_state_files.Reclaimed:
    """Remove the hidden-state files no recorded row names (requests of a killed run) and
    leftover locks from the server's directory."""
    if not (settings.fused_hidden_states and settings.hidden_states_dir):
        return hidden_state_files.Reclaimed()
    return hidden_state_files.remove_orphans(settings.hidden_states_dir, [out], settings.request_prefix)


def generate(input_path: Path, out: Path, settings: Settings, rank: int = 0, world_size: int = 1) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    settings = replace(settings, request_prefix=hidden_state_files.request_prefix(out, rank))
    done = finished_ids(out)
    stats = Stats(failed=failed_rows(out / f"errors-{rank}.jsonl"))
    rows = RowWriter(out / f"rows-{rank}.jsonl")
    errors = RowWriter(out / f"errors-{rank}.jsonl")
    try:
        todo = plan(input_path, rank, world_size, done, stats, errors)
        if stats.total == 0:
            raise NothingToGenerate(
                f"{input_path}: no question for rank {rank} of {world_size}"
                + (f" ({stats.malformed} malformed rows skipped)" if stats.malformed else " (the file has no rows)")
                + ": check the dataset, or run fewer generators than it has questions"
            )
        LOG.info(
            "rank %d/%d: %d rows, %d already done, %d to generate",
            rank,
            world_size,
            stats.total,
            stats.skipped_done,
            len(todo),
        )
        reclaimed = tidy_hidden_states(settings, out)
        asyncio.run(Generator(settings, rows, errors, stats).run(iter(todo)))
        reclaimed.add(tidy_hidden_states(settings, out))  # what requests of a killed run wrote since
    finally:
        rows.close()
        errors.close()
    summary = {"rank": rank, "world_size": world_size, **stats.summary()}
    if settings.fused_hidden_states and settings.hidden_states_dir:
        summary["hidden_states_reclaimed"] = asdict(reclaimed)
    (out / f"summary-{rank}.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", type=Path, required=True, help="JSON, JSONL, Parquet file or datasets directory")
    parser.add_argument("--out", type=Path, help="output directory (resumable); required unless --check-input")
    parser.add_argument("--server", default="http://127.0.0.1:8000")
    parser.add_argument("--model", help="served model name; required unless --check-input")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=8192)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=None, help="per-request sampling seed")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--unreachable-timeout", type=float, default=300, help="seconds of no answer before stopping")
    parser.add_argument("--request-timeout", type=float, default=3600)
    parser.add_argument("--max-attempts", type=int, default=8, help="tries per row on transient errors")
    parser.add_argument("--fused-hidden-states", action="store_true", help="ask the server for hidden states too")
    parser.add_argument(
        "--hidden-states-dir", type=Path,
        help="the server's hidden-states directory (with --fused-hidden-states): remove the locks of recorded rows "
        "and the files of requests whose rows were never recorded (a killed run)",
    )  # fmt: skip
    parser.add_argument(
        "--max-error-fraction", type=float, default=0.01,
        help="share of this shard's questions that may fail for good (recorded in errors-<rank>.jsonl, not retried "
        "on resume) before the job exits 1",
    )  # fmt: skip
    parser.add_argument(
        "--check-input", action="store_true",
        help="only read --input through (no server needed): print its row counts, or one line on why it cannot be read",
    )  # fmt: skip
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if not 0 <= args.rank < args.world_size:
        parser.error(f"--rank must be in [0, --world-size); got {args.rank} of {args.world_size}")
    if not args.input.exists():
        parser.error(f"--input {args.input} does not exist")
    if args.check_input:
        try:
            print(json.dumps(check_input(args.input)))
        except InputUnreadable as err:
            print(f"jobs.generate: {err}", file=sys.stderr)
            return 2
        return 0
    if args.out is None or args.model is None:
        parser.error("--out and --model are required (unless --check-input)")
    sampling = {"max_tokens": args.max_tokens, "temperature": args.temperature, "top_p": args.top_p}
    if args.seed is not None:
        sampling["seed"] = args.seed
    settings = Settings(
        server=args.server,
        model=args.model,
        concurrency=args.concurrency,
        sampling=sampling,
        unreachable_timeout=args.unreachable_timeout,
        request_timeout=args.request_timeout,
        max_attempts=args.max_attempts,
        fused_hidden_states=args.fused_hidden_states,
        hidden_states_dir=args.hidden_states_dir,
    )
    try:
        summary = generate(args.input, args.out, settings, args.rank, args.world_size)
    except ServerUnreachable as err:
        LOG.error("%s", err)
        return 3
    except (InputUnreadable, NothingToGenerate) as err:
        LOG.error("%s", err)
        return 2
    print(json.dumps(summary))
    return 0 if within_error_budget(summary, args.max_error_fraction, args.out / f"errors-{args.rank}.jsonl") else 1


def within_error_budget(summary: dict[str, Any], max_fraction: float, errors: Path) -> bool:
    """Questions that failed for good (a prompt longer than the context: HTTP 400) are recorded
    with their reason and counted in every summary, this run's and earlier ones'; they fail the
    job only above ``max_fraction`` of the shard."""
    if not summary["failed"] and not summary["malformed"]:
        return True
    what = f"{summary['failed']} of {summary['total']} questions failed for good ({summary['error_fraction']:.2%})"
    if summary["malformed"]:
        what += f", {summary['malformed']} input rows malformed (skipped)"
    if summary["error_fraction"] > max_fraction:
        LOG.error("%s: above --max-error-fraction %s; reasons in %s", what, max_fraction, errors)
        return False
    LOG.warning("%s, within --max-error-fraction %s; reasons in %s", what, max_fraction, errors)
    return True


if __name__ == "__main__":
    sys.exit(main())
