"""VllmProcess.stop waits for every process the server started, not just the server."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

from jobs.vllm_process import VllmProcess

# A stand-in for the API server and its engine process (a real vLLM server is in tests/jobs):
# the parent exits at once on SIGTERM; its child, like vLLM's EngineCore, takes a moment to
# shut down and writes to the shared log when it does.
SERVER = textwrap.dedent(
    """
    import os, signal, sys, time
    if os.fork() == 0:
        def bye(*_):
            time.sleep(1.0)
            print("engine: shut down", flush=True)
            os._exit(0)
        signal.signal(signal.SIGTERM, bye)
        print("engine: up", flush=True)
        while True:
            time.sleep(0.1)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print("api: up", flush=True)
    while True:
        time.sleep(0.1)
    """
)


def start(tmp_path: Path, script: str) -> VllmProcess:
    server = VllmProcess("unused", [], log=tmp_path / "vllm.log")
    with server.log.open("w") as out:
        server.proc = subprocess.Popen([sys.executable, "-c", script], stdout=out, start_new_session=True)
    while server.log.read_text().count("up") < 2:
        time.sleep(0.05)
    return server


def test_stop_returns_after_the_engine_process_is_gone(tmp_path: Path) -> None:
    server = start(tmp_path, SERVER)
    server.stop()
    assert "engine: shut down" in server.log.read_text()
    assert not server._group_alive()


def test_stop_kills_an_engine_that_ignores_sigterm(tmp_path: Path) -> None:
    stubborn = SERVER.replace("signal.signal(signal.SIGTERM, bye)", "signal.signal(signal.SIGTERM, signal.SIG_IGN)")
    server = start(tmp_path, stubborn)
    server.stop(timeout=1)
    assert not server._group_alive()
    assert "engine: shut down" not in server.log.read_text()
