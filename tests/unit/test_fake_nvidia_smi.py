"""The fake nvidia-smi used on test hosts answers like the real one for what it recorded."""

from __future__ import annotations

import os
import subprocess

from tests.conftest import FAKE_NVIDIA_SMI, NVIDIA_SMI_FIXTURES


def fake(scenario: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FAKE_NVIDIA_SMI_DATA": str(NVIDIA_SMI_FIXTURES), "FAKE_NVIDIA_SMI_SCENARIO": scenario}
    return subprocess.run([str(FAKE_NVIDIA_SMI), *args], env=env, capture_output=True, text=True, timeout=30)


def test_replays_the_real_row_in_the_recorded_order() -> None:
    fields = (NVIDIA_SMI_FIXTURES / "h200-idle/query-gpu.fields").read_text().strip()
    out = fake("h200-idle", f"--query-gpu={fields}", "--format=csv,noheader,nounits")
    assert out.returncode == 0
    assert out.stdout == (NVIDIA_SMI_FIXTURES / "h200-idle/query-gpu.csv").read_text()


def test_selects_columns_by_name() -> None:
    out = fake("h200x8-busy", "--query-gpu=memory.used,index", "--format=csv,noheader,nounits")
    assert out.stdout.splitlines()[3] == "81234, 3"


def test_empty_compute_apps_exits_zero() -> None:
    out = fake("h200-idle", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader,nounits")
    assert (out.returncode, out.stdout) == (0, "")


def test_unknown_field_is_refused_like_the_real_tool() -> None:
    out = fake("h200-idle", "--query-gpu=index,bogus", "--format=csv,noheader,nounits")
    assert out.returncode == 2
    assert 'Field "bogus" is not a valid field to query.' in out.stdout


def test_driver_down_exits_nonzero() -> None:
    out = fake("driver-down", "--query-gpu=index", "--format=csv,noheader,nounits")
    assert out.returncode == 9
    assert "NVIDIA-SMI has failed" in out.stdout
