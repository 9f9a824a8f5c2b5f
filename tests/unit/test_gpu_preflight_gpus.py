"""The nvidia-smi reader and gate, against every recorded scenario.

The scenarios under tests/fixtures/nvidia-smi/ replay real H200 output (h200-idle is
verbatim; the others change only the fields they are about). The fake nvidia-smi
(tests/fake_nvidia_smi.py) stands in for the real binary: there is no GPU here.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import FAKE_NVIDIA_SMI, NVIDIA_SMI_FIXTURES, ROOT, load_module

gpus_module = load_module(ROOT / "plugins/modules/gpu_preflight_gpus.py")

DEFAULTS = {
    "expected_gpus": -1,
    "max_memory_used_mib": 1024,
    "allow_compute_processes": False,
    "allowed_pids": [],
    "max_uncorrected_ecc": 0,
    "forbidden_compute_modes": ["Prohibited"],
    "expected_mig_mode": "Disabled",
    "nvidia_smi_path": str(FAKE_NVIDIA_SMI),
    "timeout": 20,
}


def read(monkeypatch: pytest.MonkeyPatch, scenario: str, **params: Any) -> dict[str, Any]:
    monkeypatch.setenv("FAKE_NVIDIA_SMI_DATA", str(NVIDIA_SMI_FIXTURES))
    monkeypatch.setenv("FAKE_NVIDIA_SMI_SCENARIO", scenario)
    return gpus_module.read_host({**DEFAULTS, **params})


def summary(result: dict[str, Any]) -> set[tuple[Any, str]]:
    return {(p["gpu"], p["field"]) for p in result["problems"]}


def test_real_h200_row_parses_field_by_field() -> None:
    text = (NVIDIA_SMI_FIXTURES / "h200-idle/query-gpu.csv").read_text()
    rows, bad = gpus_module.parse_rows(text, gpus_module.GPU_FIELDS)
    assert bad == []
    (row,) = rows
    assert row["index"] == 0
    assert row["uuid"] == "GPU-ac7866cb-8b62-b3da-c4c3-a0c33289e3ab"
    assert row["name"] == "NVIDIA H200"
    assert row["driver_version"] == "580.159.04"
    assert (row["memory.used"], row["memory.total"]) == (0, 143771)
    assert row["ecc.errors.uncorrected.volatile.total"] == 0
    assert row["retired_pages.pending"] is None  # [N/A] on Hopper
    assert row["raw"]["retired_pages.pending"] == "[N/A]"
    assert (row["remapped_rows.pending"], row["remapped_rows.failure"]) == ("No", "No")
    assert (row["persistence_mode"], row["compute_mode"], row["mig.mode.current"]) == ("Enabled", "Default", "Disabled")
    assert row["clocks_throttle_reasons.active"] == "0x0000000000000001"
    assert row["temperature.gpu"] == 39


def test_the_module_queries_the_fields_recorded_on_the_h200() -> None:
    recorded = (NVIDIA_SMI_FIXTURES / "h200-idle/query-gpu.fields").read_text().strip().split(",")
    readme = (NVIDIA_SMI_FIXTURES / "h200-idle/README.md").read_text()
    assert tuple(recorded) == gpus_module.GPU_FIELDS
    assert "--query-gpu=" + ",".join(recorded) in readme


def test_idle_h200_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    result = read(monkeypatch, "h200-idle", expected_gpus=1)
    assert result["problems"] == []
    assert result["driver_version"] == "580.159.04"
    assert [g["memory_total"] for g in result["gpus"]] == [143771]
    assert result["nvidia_smi"]["rc"] == 0


@pytest.mark.parametrize("expected", [-1, 8])
def test_idle_eight_gpus_pass(monkeypatch: pytest.MonkeyPatch, expected: int) -> None:
    result = read(monkeypatch, "h200x8-idle", expected_gpus=expected)
    assert result["problems"] == []
    assert [g["index"] for g in result["gpus"]] == list(range(8))


def test_idle_single_gpu_fails_where_eight_are_expected(monkeypatch: pytest.MonkeyPatch) -> None:
    (problem,) = read(monkeypatch, "h200-idle", expected_gpus=8)["problems"]
    assert (problem["field"], problem["value"], problem["limit"]) == ("gpu_count", "1", "== 8")


def test_busy_names_memory_and_every_compute_process(monkeypatch: pytest.MonkeyPatch) -> None:
    result = read(monkeypatch, "h200x8-busy", expected_gpus=8)
    assert summary(result) == {(3, "memory.used"), (3, "compute_process"), (5, "compute_process")}
    lines = [p["line"] for p in result["problems"]]
    assert "GPU 3 memory.used = 81234 MiB (limit: <= 1024 MiB): GPU memory is in use by something else" in lines
    assert any(line.startswith("GPU 3 compute_process = pid 4242 (/usr/bin/python3, 81220 MiB)") for line in lines)
    assert any(line.startswith("GPU 5 compute_process = pid 5151 (vllm-worker, 512 MiB)") for line in lines)
    assert {p["pid"]: p["gpu_index"] for p in result["compute_processes"]} == {4242: 3, 5151: 5}


def test_busy_passes_when_processes_are_allowed_and_memory_limit_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    result = read(monkeypatch, "h200x8-busy", allow_compute_processes=True, max_memory_used_mib=90000)
    assert result["problems"] == []


def test_the_runs_own_server_is_exempt_and_a_foreign_process_still_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    # The run's own vLLM server is pid 5151 (GPU 5); a stranger, pid 4242, holds GPU 3.
    result = read(monkeypatch, "h200x8-busy", expected_gpus=8, allowed_pids=[5151])
    assert summary(result) == {(3, "memory.used"), (3, "compute_process")}
    lines = " ".join(p["line"] for p in result["problems"])
    assert "pid 4242" in lines and "5151" not in lines


def test_only_the_allowed_processes_memory_is_discounted(monkeypatch: pytest.MonkeyPatch) -> None:
    # Allowing the process on GPU 3 discounts its 81220 MiB: 14 MiB remain, under the limit;
    # the other process (GPU 5) is still named.
    result = read(monkeypatch, "h200x8-busy", expected_gpus=8, allowed_pids=[4242])
    assert summary(result) == {(5, "compute_process")}
    strict = read(monkeypatch, "h200x8-busy", expected_gpus=8, allowed_pids=[4242], max_memory_used_mib=10)
    assert (3, "memory.used") in summary(strict)
    assert any("besides 81220 MiB of the run's own processes" in p["line"] for p in strict["problems"])


def test_missing_gpu_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    (problem,) = read(monkeypatch, "h200x8-missing-gpu", expected_gpus=8)["problems"]
    assert (problem["gpu"], problem["field"], problem["value"], problem["limit"]) == (None, "gpu_count", "7", "== 8")
    assert "0,1,2,3,4,5,6" in problem["message"]


def test_ecc_and_remapped_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    result = read(monkeypatch, "h200x8-ecc", expected_gpus=8)
    assert summary(result) == {
        (2, "ecc.errors.uncorrected.volatile.total"),
        (6, "remapped_rows.pending"),
        (7, "remapped_rows.failure"),
    }
    ecc = next(p for p in result["problems"] if p["gpu"] == 2)
    assert (ecc["value"], ecc["limit"]) == ("4", "<= 0")


def test_compute_mode_and_mig(monkeypatch: pytest.MonkeyPatch) -> None:
    result = read(monkeypatch, "h200x8-misconfigured", expected_gpus=8)
    assert summary(result) == {(1, "compute_mode"), (4, "mig.mode.current")}
    assert read(monkeypatch, "h200x8-misconfigured", expected_mig_mode="")["problems"][0]["gpu"] == 1


def test_na_fields_survive_and_only_unreadable_memory_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    result = read(monkeypatch, "na-fields", expected_gpus=2)
    assert summary(result) == {(1, "memory.used")}
    (problem,) = result["problems"]
    assert problem["value"] == "[N/A]"
    gpu0 = result["gpus"][0]
    assert gpu0["ecc_errors_uncorrected_volatile_total"] is None
    assert gpu0["mig_mode_current"] is None
    assert gpu0["temperature_gpu"] is None


def test_driver_not_answering(monkeypatch: pytest.MonkeyPatch) -> None:
    (problem,) = read(monkeypatch, "driver-down")["problems"]
    assert (problem["field"], problem["value"]) == ("driver", "exit 9")
    assert "couldn't communicate with the NVIDIA driver" in problem["message"]


def test_hung_driver_is_cut_off_at_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    result = read(monkeypatch, "driver-hung", timeout=1)
    (problem,) = result["problems"]
    assert (problem["field"], problem["value"], problem["limit"]) == ("driver", "no answer", "1 s")
    assert result["nvidia_smi"]["rc"] is None


def test_cpu_only_mode_does_not_run_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    result = read(monkeypatch, "driver-down", expected_gpus=0, nvidia_smi_path="/nonexistent/nvidia-smi")
    assert result["problems"] == []
    assert result["nvidia_smi"] is None


def test_nvidia_smi_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    (problem,) = read(monkeypatch, "h200-idle", nvidia_smi_path="/nonexistent/nvidia-smi")["problems"]
    assert problem["field"] == "nvidia-smi"
    assert "not found" in problem["message"]


def test_unparseable_line_is_reported() -> None:
    rows, bad = gpus_module.parse_rows("0, GPU-x, short\n", gpus_module.GPU_FIELDS)
    assert rows == []
    assert bad == ["0, GPU-x, short"]


@pytest.mark.parametrize("scenario", sorted(p.name for p in NVIDIA_SMI_FIXTURES.iterdir() if p.is_dir()))
def test_every_scenario_is_read_without_crashing(monkeypatch: pytest.MonkeyPatch, scenario: str) -> None:
    result = read(monkeypatch, scenario, timeout=1)
    for problem in result["problems"]:
        assert set(problem) == {"gpu", "field", "value", "limit", "message", "line"}
