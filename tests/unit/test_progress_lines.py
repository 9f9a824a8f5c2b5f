"""Progress lines of training and validation, as the driver reads them (tests/unit/test_run_driver.py).

The validation test answers chat completions from a small local HTTP stub: what is tested is the
counting of prompts, not vLLM (jobs.validate against a real vLLM runs in molecule/pipeline)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from jobs import driver, train, validate


def test_training_steps_are_logged_against_their_total(caplog: pytest.LogCaptureFixture) -> None:
    handler = train.StepProgress()
    handler.total, handler.epochs = 60, 3
    metrics = logging.getLogger("speculators.metrics")
    metrics.addHandler(handler)
    try:
        # Level INFO as speculators' logging setup gives its metrics logger.
        with caplog.at_level(logging.INFO, logger="speculators.metrics"), caplog.at_level(logging.INFO, "jobs.train"):
            metrics.info({"train": {"loss": 3.25}, "profile": {"tokens_per_s": 464.1}, "epoch": 0, "global_step": 11})
            metrics.info({"val": {"loss_epoch": 2.0}, "epoch": 0})  # validation: no step, no line
    finally:
        metrics.removeHandler(handler)
    lines = [r.getMessage() for r in caplog.records if r.name == "jobs.train"]
    assert lines == ["train: 12/60 steps (epoch 1/3), loss 3.250, 464 tok/s"]
    # The driver turns the step rate into an ETA: 12 more steps in 10 s, 36 left -> 30 s.
    record: dict = {}
    assert driver.estimate_eta(record, lines[0], 100.0) == ""
    assert driver.estimate_eta(record, "train: 24/60 steps (epoch 2/3), loss 3.0, 464 tok/s", 110.0) == ", ETA 0m30s"


class Completions(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(0.05)
        body = json.dumps({"usage": {"completion_tokens": 2}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_validation_counts_prompts_done(caplog: pytest.LogCaptureFixture) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Completions)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    prompts = [[{"role": "user", "content": str(i)}] for i in range(12)]
    try:
        with caplog.at_level(logging.INFO, logger="jobs.validate"):
            tokens = asyncio.run(validate.send_prompts(url, prompts, 4, 2, "trained", every=0.05))
    finally:
        server.shutdown()
    assert tokens == 24
    counts = [int(r.getMessage().split(": ")[1].split("/")[0]) for r in caplog.records if r.name == "jobs.validate"]
    lines = {
        r.getMessage().split(": ")[1].split(" ")[0].split("/")[1] for r in caplog.records if r.name == "jobs.validate"
    }
    assert counts and counts == sorted(counts) and 0 < counts[-1] <= 12 and lines == {"12"}


def test_the_step_line_follows_the_metrics_line_it_is_made_from() -> None:
    # As counting_steps arranges it: speculators' own root handler first, StepProgress last, so
    # the stage log's last line (the driver's progress) is the one with the total.
    root, stream = logging.getLogger(), io.StringIO()
    printed = logging.StreamHandler(stream)
    step = train.StepProgress()
    step.total, step.epochs = 4, 1
    metrics = logging.getLogger("speculators.metrics")
    level = metrics.level
    metrics.setLevel(logging.INFO)
    logging.getLogger("jobs.train").setLevel(logging.INFO)
    root.addHandler(printed)
    root.addHandler(step)
    try:
        metrics.info({"train": {"loss": 1.0}, "profile": {"tokens_per_s": 10.0}, "epoch": 0, "global_step": 3})
    finally:
        root.removeHandler(step)
        root.removeHandler(printed)
        metrics.setLevel(level)
    assert stream.getvalue().splitlines()[-1] == "train: 4/4 steps (epoch 1/1), loss 1.000, 10 tok/s"
    assert "'global_step': 3" in stream.getvalue().splitlines()[0]


class Packing:
    """Stands for speculators' packing sampler: its batch count depends on the epoch's shuffle."""

    def __init__(self) -> None:
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return (190, 192, 194)[self.epoch]


def test_the_total_sums_each_epochs_batches() -> None:
    sampler = Packing()
    sampler.set_epoch(1)
    # 576, not 3 x 190 or 3 x 192: the last step line reads S/S (the CI run that read 223/225).
    assert train.planned_steps(None, 3, sampler) == 576
    assert sampler.epoch == 1
    assert train.planned_steps(50, 3, sampler) == 50
    assert train.planned_steps(None, 2, [0] * 7) == 14
