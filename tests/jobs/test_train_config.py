"""jobs.train's configuration, the CPU shim, and loading a Kimi-K2.5-shaped (nested) verifier."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import load_file

from jobs import cpu_training, train
from tests.support import verifier_stub


def write_config(path: Path, **values: object) -> Path:
    path.write_text(yaml.safe_dump(values))
    return path


def test_config_names_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(train.ConfigError, match=r"missing required keys \['aux_layer_ids'\]"):
        train.TrainSettings.load(write_config(tmp_path / "a.yaml", verifier="v", data="d", out="o"))
    with pytest.raises(train.ConfigError, match="unknown keys"):
        train.TrainSettings.load(
            write_config(tmp_path / "b.yaml", verifier="v", data="d", out="o", aux_layer_ids=[1], epochs=3)
        )
    with pytest.raises(train.ConfigError, match="needs endpoint"):
        train.TrainSettings.load(
            write_config(
                tmp_path / "c.yaml", verifier="v", data="d", out="o", aux_layer_ids=[1], hidden_states="online"
            )
        )


def test_cpu_shim_stands_in_for_an_accelerator_and_restores_torch() -> None:
    import speculators.train.checkpointer as checkpointer_module
    import speculators.train.trainer as trainer_module

    before = (torch.accelerator.current_accelerator, trainer_module.get_local_rank)
    with cpu_training.cpu_accelerator():
        assert torch.accelerator.current_accelerator() == torch.device("cpu")
        assert torch.accelerator.current_accelerator(check_available=True) is None
        assert torch.accelerator.is_available() is False  # so the DataLoader does not pin memory
        assert checkpointer_module.get_current_device() == "cpu"  # where a resumed checkpoint loads
        torch.accelerator.synchronize()  # raises without an accelerator outside the shim
        assert trainer_module.get_local_rank() == torch.device("cpu")
        assert torch.ones(2).to(trainer_module.get_local_rank()).device.type == "cpu"
    assert (torch.accelerator.current_accelerator, trainer_module.get_local_rank) == before
    if torch.accelerator.current_accelerator() is None:
        with pytest.raises(RuntimeError):
            torch.accelerator.synchronize()


def test_nested_kimi_shaped_verifier_loads_into_the_drafter(tmp_path: Path) -> None:
    """Nested text_config (DeepSeek-V3) behind a trust_remote_code config class, weights under
    ``language_model.`` in two shards with an index: the drafter gets exactly those weights."""
    stub = verifier_stub.build(tmp_path / "kimi-stub", hidden_size=64, vocab_size=512, layers=8)
    index = json.loads((stub / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
    data = tmp_path / "data"
    data.mkdir()
    config = write_config(
        tmp_path / "train.yaml", verifier=str(stub), data=str(data), out=str(tmp_path / "out"),
        aux_layer_ids=[2, 4, 6], draft_vocab_size=512, seq_length=256, trust_remote_code=True, device="cpu",
        speculators={"mask_token_id": 0},
    )  # fmt: skip
    settings = train.TrainSettings.load(config)
    assert train.verifier_text_config(str(stub))["hidden_size"] == 64
    checkpoint = train.dry_run(settings, tmp_path / "untrained")
    drafter_config = json.loads((checkpoint / "config.json").read_text())
    assert drafter_config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 6]
    assert drafter_config["transformer_layer_config"]["hidden_size"] == 64
    weights = load_file(checkpoint / "model.safetensors")
    with safe_open(stub / "model-00001-of-00002.safetensors", framework="pt") as f:
        embed = f.get_tensor(verifier_stub.EMBED)
    with safe_open(stub / "model-00002-of-00002.safetensors", framework="pt") as f:
        lm_head = f.get_tensor(verifier_stub.LM_HEAD)
    assert torch.equal(weights["embed_tokens.weight"].to(embed.dtype), embed)
    assert torch.equal(weights["lm_head.weight"].to(lm_head.dtype), lm_head)


def test_a_checkpoint_with_other_layer_ids_is_refused(tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "model.safetensors").write_bytes(b"")
    (checkpoint / "config.json").write_text(json.dumps({"eagle_aux_hidden_state_layer_ids": [2, 30, 58]}))
    settings = train.TrainSettings(verifier="v", data="d", out="o", aux_layer_ids=[1, 30, 58])
    with pytest.raises(RuntimeError, match="wrong layers"):
        train.check_checkpoint(checkpoint, settings)


def test_defaults_choose_muon_and_a_users_speculators_option_wins(tmp_path: Path) -> None:
    stub = verifier_stub.build(tmp_path / "kimi-stub", hidden_size=64, vocab_size=512, layers=8)
    base = {"verifier": str(stub), "data": str(tmp_path), "out": str(tmp_path / "o"), "aux_layer_ids": [2, 4, 6]}
    argv = train.speculators_argv(train.TrainSettings.load(write_config(tmp_path / "a.yaml", **base, device="cuda")))
    assert argv[argv.index("--optimizer") + 1] == "muon"
    assert argv[argv.index("--draft-attn-impl") + 1] == "sdpa"  # no CUDA here: nothing to probe
    chosen = write_config(tmp_path / "b.yaml", **base, device="cuda", speculators={"optimizer": "adamw"})
    argv = train.speculators_argv(train.TrainSettings.load(chosen))
    assert argv.count("--optimizer") == 1 and argv[argv.index("--optimizer") + 1] == "adamw"


def test_fsdp_shard_reaches_training_but_not_the_single_process_baseline(tmp_path: Path) -> None:
    stub = verifier_stub.build(tmp_path / "kimi-stub", hidden_size=64, vocab_size=512, layers=8)
    config = write_config(
        tmp_path / "c.yaml", verifier=str(stub), data=str(tmp_path), out=str(tmp_path / "o"),
        aux_layer_ids=[2, 4, 6], device="cuda", speculators={"fsdp_shard": True},
    )  # fmt: skip
    settings = train.TrainSettings.load(config)
    assert "--fsdp-shard" in train.speculators_argv(settings)
    # speculators refuses --fsdp-shard outside torchrun; the baseline is one plain process.
    assert "--fsdp-shard" not in train.speculators_argv(settings, dry_run=True)


def test_fp8_hidden_states_train_through_speculators_fp8_reader(tmp_path: Path) -> None:
    from hs_connectors import FP8Transfer, HiddenStatesBackend

    stub = verifier_stub.build(tmp_path / "kimi-stub", hidden_size=64, vocab_size=512, layers=8)
    base = {"verifier": str(stub), "data": str(tmp_path), "out": str(tmp_path / "o"), "aux_layer_ids": [2, 4, 6]}
    argv = train.speculators_argv(train.TrainSettings.load(write_config(tmp_path / "a.yaml", **base)))
    assert "--hidden-states-backend" not in argv  # bf16: speculators' file backend, its default
    argv = train.speculators_argv(
        train.TrainSettings.load(write_config(tmp_path / "b.yaml", **base, hidden_states_dtype="fp8"))
    )
    backend = argv[argv.index("--hidden-states-backend") + 1]
    # What speculators' CLI builds from that name (cli.py: registry[...].from_train_args).
    args = type("Args", (), {"hidden_states_path": None})()
    reader = HiddenStatesBackend.registry[backend].from_train_args(args, str(tmp_path))
    assert isinstance(reader, FP8Transfer) and reader.hidden_states_path == tmp_path / "hidden_states"
    with pytest.raises(train.ConfigError, match="hidden_states_dtype must be bf16 or fp8"):
        train.TrainSettings.load(write_config(tmp_path / "c.yaml", **base, hidden_states_dtype="int8"))
