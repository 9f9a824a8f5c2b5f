"""How jobs.train picks its GPU kernels (jobs.train_kernels). The probe itself needs a GPU and
Triton: it ran on the lent H100/H200 (bench/README.md); here its answer is stubbed, and its harness
(the tiny verifier and data it trains on) is checked with the kernels a CPU can run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from jobs import train, train_kernels
from tests.support import tiny_kimi, verifier_stub

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("EAGLE3_TRAIN_KERNELS", raising=False)
    monkeypatch.setattr(train_kernels, "stack_key", lambda: "torch 9, triton 9, speculators 9, GPU X")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the probe's answer is stubbed
    monkeypatch.setattr(torch, "__version__", "9.0.0")
    return tmp_path / "cache" / "eagle3" / "train-kernels.json"


def test_probe_answer_is_cached_per_stack(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Path] = []

    def fake_probe(verifier: Path) -> dict:
        calls.append(verifier)
        return train_kernels.SAFE | {"path": "safe", "why": "failed: X"}

    monkeypatch.setattr(train_kernels, "probe", fake_probe)
    first = train_kernels.choose(Path("/m"), {})
    second = train_kernels.choose(Path("/m"), {})
    assert calls == [Path("/m")]
    assert first["loss-implementation"] == second["loss-implementation"] == "eager"
    assert second["cached"] == str(cache)
    assert "torch 9, triton 9, speculators 9, GPU X" in json.loads(cache.read_text())
    monkeypatch.setenv("EAGLE3_TRAIN_KERNELS", "probe")
    train_kernels.choose(Path("/m"), {})
    assert len(calls) == 2


def test_config_and_environment_win_over_the_probe(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(train_kernels, "probe", lambda verifier: pytest.fail("probed"))
    given = train_kernels.choose(Path("/m"), {"draft_attn_impl": "sdpa", "loss-implementation": "fused"})
    assert (given["draft-attn-impl"], given["loss-implementation"], given["path"]) == ("sdpa", "fused", "config")
    monkeypatch.setenv("EAGLE3_TRAIN_KERNELS", "fast")
    assert train_kernels.choose(Path("/m"), {})["loss-implementation"] == "fused"
    monkeypatch.setenv("EAGLE3_TRAIN_KERNELS", "quick")
    with pytest.raises(ValueError, match="fast, safe or probe"):
        train_kernels.choose(Path("/m"), {})
    assert not cache.exists()


def test_a_failed_probe_gives_the_safe_kernels_with_the_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    log = "Traceback (most recent call last):\n  File x\ntorch._dynamo.exc.InternalTorchDynamoError: ListVariable is already tracked for mutation\n\nfrom user code: y\n"
    outcome = {"fast": 1, "safe": 0}

    def run(argv: list[str], **kwargs: object) -> object:
        return type("Done", (), {"returncode": outcome[argv[-1]], "stdout": "", "stderr": log})

    monkeypatch.setattr(train_kernels.subprocess, "run", run)
    answer = train_kernels.probe(tmp_path)
    assert (answer["draft-attn-impl"], answer["loss-implementation"]) == ("sdpa", "eager")
    assert answer["why"].endswith("InternalTorchDynamoError: ListVariable is already tracked for mutation")
    outcome["fast"] = 0
    assert train_kernels.probe(tmp_path)["loss-implementation"] == "fused"


def test_a_probe_that_fails_with_both_kernels_caches_nothing(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # seen on the GPU: a missing package failed the fast probe, and "safe" was cached for good
    fails = type(
        "Done", (), {"returncode": 1, "stdout": "", "stderr": "ModuleNotFoundError: No module named 'pydantic'"}
    )
    monkeypatch.setattr(train_kernels.subprocess, "run", lambda *a, **k: fails)
    answer = train_kernels.choose(Path("/m"), {})
    assert answer["loss-implementation"] == "eager" and "cannot tell: ModuleNotFoundError" in answer["why"]
    assert not cache.exists() or "GPU X" not in json.loads(cache.read_text())


def test_gpu_runs_pass_the_chosen_kernels_to_speculators(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(train_kernels, "probe", lambda verifier: train_kernels.FAST | {"path": "fast", "why": "ok"})
    settings = train.TrainSettings(
        verifier=str(ROOT / "models" / "tiny-python"), data="/d", out="/o", aux_layer_ids=[1, 2], device="cuda"
    )
    argv = train.speculators_argv(settings)
    assert argv[argv.index("--draft-attn-impl") + 1] == "simple_flex_attention"
    assert argv[argv.index("--loss-implementation") + 1] == "fused"
    settings.speculators = {"loss-implementation": "eager"}
    argv = train.speculators_argv(settings)
    assert argv[argv.index("--loss-implementation") + 1] == "eager"
    assert (
        train.kernels(train.TrainSettings(verifier="/m", data="/d", out="/o", aux_layer_ids=[1], device="cpu"))["path"]
        == "cpu"
    )


def test_probe_shrinks_the_verifiers_own_text_config(tmp_path: Path) -> None:
    kimi = verifier_stub.build(tmp_path / "kimi", hidden_size=64, vocab_size=512, layers=4)
    text = train_kernels.shrunk_text_config(kimi)
    assert text["model_type"] == "deepseek_v3" and text["kv_lora_rank"] == 512 and "head_dim" not in text
    # Kimi-K2.5's published config names its text model kimi_k2, a type transformers lacks.
    (tmp_path / "k25").mkdir()
    (tmp_path / "k25" / "config.json").write_text(json.dumps(tiny_kimi.config(163840, 61, 384)))
    published = train_kernels.shrunk_text_config(tmp_path / "k25")
    assert published["model_type"] == "deepseek_v3" and published["architectures"] == ["DeepseekV3ForCausalLM"]
    assert published["qk_rope_head_dim"] == 64 and "head_dim" not in published
    llama = train_kernels.shrunk_text_config(ROOT / "models" / "tiny-python")
    assert (llama["head_dim"], llama["num_attention_heads"], llama["vocab_size"]) == (64, 4, 4096)


def test_probe_harness_trains_with_the_kernels_a_cpu_runs(tmp_path: Path) -> None:
    # As the probe runs it: a fresh interpreter (speculators imports torch._dynamo, which cannot
    # register its sys.intern polyfill once another test has imported ansible's module_utils).
    argv = [sys.executable, "-m", "jobs.train_kernels", "--verifier", str(ROOT / "models" / "tiny-python"),
            "--probe-run", str(tmp_path), "--kernels", "safe", "--device", "cpu"]  # fmt: skip
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    marker = json.loads((tmp_path / "out" / train.MARKER).read_text())
    assert marker["kernels"]["path"] == "cpu" and (tmp_path / "out" / "final" / "config.json").exists()


def test_without_a_cuda_device_nothing_is_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EAGLE3_TRAIN_KERNELS", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(train_kernels, "probe", lambda verifier: pytest.fail("probed"))
    answer = train_kernels.choose(Path("/m"), {})
    assert answer["loss-implementation"] == "eager" and "no CUDA device" in answer["why"]


def test_a_stack_measured_to_fail_gets_the_safe_kernels_without_a_probe(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    monkeypatch.setattr(train_kernels, "probe", lambda verifier: pytest.fail("probed"))
    answer = train_kernels.choose(Path("/m"), {})
    assert answer["loss-implementation"] == "eager" and "torch 2.11" in answer["why"]
