"""The plan (plugins/plugin_utils/plan.py, run by the action eagle3.pipeline.eagle3_plan): stage names, that every
input reruns exactly its stage and those after it, and each host's part of the plan."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.plugins.loader import action_loader

from tests.conftest import ROOT, load_module

plan = load_module(ROOT / "plugins/plugin_utils/plan.py")
ORDER = ["generate-0", "generate-1", "gather", "prepare", "extract", "train", "validate"]


def tiny_settings() -> dict[str, Any]:
    """inventory/tiny's settings over the role's defaults, as the plan reads them."""
    settings = yaml.safe_load((ROOT / "roles/eagle3/defaults/main.yml").read_text())
    settings |= yaml.safe_load((ROOT / "inventory/tiny/group_vars/all.yml").read_text())
    return {k: v for k, v in settings.items() if k.startswith("eagle3_")}


FILES = {"dataset_sha256": "d" * 64, "model_config_sha256": "m" * 64, "heldout_sha256": "h" * 64}


def hosts(settings: dict[str, Any] | None = None, files: dict[str, str] | None = None) -> dict[str, Any]:
    one = {"settings": settings or tiny_settings(), "files": files or dict(FILES)}
    return {"a": copy.deepcopy(one), "b": copy.deepcopy(one)}


def hashes(result: dict[str, Any]) -> dict[str, str]:
    return {name: st["hash"] for h in result["hosts"].values() for name, st in h["stages"].items()}


def rerun(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    old, new = hashes(before), hashes(after)
    assert old.keys() == new.keys()
    return [name for name in ORDER if old[name] != new[name]]


def test_two_generators_one_trainer_names_every_stage_once() -> None:
    result = plan.stage_plan(hosts(), ["a", "b"], ["a"])
    assert result["problems"] == []
    assert list(result["hosts"]["a"]["stages"]) == ["generate-0", "gather", "prepare", "extract", "train", "validate"]
    assert list(result["hosts"]["b"]["stages"]) == ["generate-1"]
    assert (result["hosts"]["a"]["rank"], result["hosts"]["b"]["rank"]) == (0, 1)
    assert result["remote_generators"] == ["b"]
    run = "/var/lib/eagle3/runs/tiny"
    assert result["rows_files"] == [f"{run}/gen/rows-0.jsonl", f"{run}/gathered/b/rows-1.jsonl"]
    assert result["gathered_rows_files"] == [f"{run}/gathered/b/rows-1.jsonl"]
    assert (result["hosts"]["a"]["generate_stage"], result["hosts"]["b"]["generate_stage"]) == (
        "generate-0",
        "generate-1",
    )
    assert result["captured_layers"] == [1, 2, 3, 4]


CHANGES = [
    # (setting, new value, first stage to rerun)
    ("eagle3_dataset", "/srv/data/other.jsonl", "generate"),
    ("eagle3_served_model_name", "tiny-2", "generate"),
    ("eagle3_generate_max_tokens", 64, "generate"),
    ("eagle3_generate_temperature", 0.3, "generate"),
    ("eagle3_generate_top_p", 0.5, "generate"),
    ("eagle3_hidden_states", "separate", "generate"),
    ("eagle3_hidden_states_dtype", "fp8", "generate"),  # fused: the generators' servers write the files
    ("eagle3_aux_layer_ids", [0, 2, 3], "generate"),  # fused capture takes them during generation
    ("eagle3_num_layers", 5, "generate"),
    ("eagle3_seq_length", 1024, "prepare"),
    ("eagle3_draft_vocab_size", 512, "train"),
    ("eagle3_speculators", {"epochs": 2, "lr": 0.003}, "train"),
    ("eagle3_train_nproc_per_node", 2, "train"),
    ("eagle3_validate_num_speculative_tokens", 2, "validate"),
    ("eagle3_validate_max_tokens", 64, "validate"),
    ("eagle3_validate_server_args", ["--max-model-len", "1024"], "validate"),
]


def expected_from(first: str) -> list[str]:
    kinds = [n.split("-")[0] for n in ORDER]
    start = kinds.index(first)
    return [n for n, k in zip(ORDER, kinds, strict=True) if kinds.index(k) >= start]


@pytest.mark.parametrize(("setting", "value", "first"), CHANGES, ids=[c[0] for c in CHANGES])
def test_a_changed_setting_reruns_its_stage_and_those_after_it(setting: str, value: Any, first: str) -> None:
    before = plan.stage_plan(hosts(), ["a", "b"], ["a"])
    changed = tiny_settings() | {setting: value}
    after = plan.stage_plan(hosts(changed), ["a", "b"], ["a"])
    assert rerun(before, after) == expected_from(first)


def test_with_a_separate_pass_the_file_format_reruns_extraction_not_generation() -> None:
    separate = tiny_settings() | {"eagle3_hidden_states": "separate"}
    before = plan.stage_plan(hosts(separate), ["a", "b"], ["a"])
    after = plan.stage_plan(hosts(separate | {"eagle3_hidden_states_dtype": "fp8"}), ["a", "b"], ["a"])
    assert rerun(before, after) == expected_from("extract")


def test_every_input_setting_is_covered_by_a_change_above() -> None:
    assert set(plan.INPUTS) - {c[0] for c in CHANGES} == {"eagle3_shared_storage"}  # tested below


@pytest.mark.parametrize(
    ("file", "expected"),
    [
        ("dataset_sha256", expected_from("generate")),
        ("model_config_sha256", expected_from("generate")),
        ("heldout_sha256", ["validate"]),
    ],
)
def test_a_changed_file_reruns_what_reads_it(file: str, expected: list[str]) -> None:
    before = plan.stage_plan(hosts(), ["a", "b"], ["a"])
    after = plan.stage_plan(hosts(files=FILES | {file: "0" * 64}), ["a", "b"], ["a"])
    assert rerun(before, after) == expected


def test_one_generators_dataset_changed_reruns_its_shard_only() -> None:
    before = plan.stage_plan(hosts(), ["a", "b"], ["a"])
    both = hosts()
    both["b"]["files"]["dataset_sha256"] = "0" * 64
    after = plan.stage_plan(both, ["a", "b"], ["a"])
    assert rerun(before, after) == ["generate-1", "gather", "prepare", "extract", "train", "validate"]


def test_settings_are_the_same_input_however_they_are_given() -> None:
    # -e key=value gives strings; -e '{"k": [1, 2]}' gives JSON; group_vars give YAML types.
    as_yaml = plan.stage_plan(hosts(), ["a", "b"], ["a"])
    tiny = tiny_settings()
    as_strings = tiny | {
        "eagle3_generate_temperature": str(tiny["eagle3_generate_temperature"]),
        "eagle3_generate_max_tokens": str(tiny["eagle3_generate_max_tokens"]),
        "eagle3_shared_storage": str(tiny["eagle3_shared_storage"]).lower(),
        "eagle3_aux_layer_ids": json.dumps(tiny["eagle3_aux_layer_ids"]),
        "eagle3_speculators": json.dumps(tiny["eagle3_speculators"]),
    }
    assert hashes(plan.stage_plan(hosts(as_strings), ["a", "b"], ["a"])) == hashes(as_yaml)


@pytest.mark.parametrize("text", ["false", "no", "False", "0", False])
def test_shared_storage_false_means_false(text: Any) -> None:
    result = plan.stage_plan(hosts(tiny_settings() | {"eagle3_shared_storage": text}), ["a", "b"], ["a"])
    assert result["remote_generators"] == ["b"] and "gather" in result["hosts"]["a"]["stages"]


def test_shared_storage_drops_gather_and_reads_rows_in_place() -> None:
    before = plan.stage_plan(hosts(), ["a", "b"], ["a"])
    shared = plan.stage_plan(hosts(tiny_settings() | {"eagle3_shared_storage": "true"}), ["a", "b"], ["a"])
    assert "gather" not in shared["hosts"]["a"]["stages"] and shared["remote_generators"] == []
    assert shared["rows_files"][1].endswith("/gen/rows-1.jsonl")
    # Generation does not depend on how its rows reach the trainer; everything after it does.
    old, new = hashes(before), hashes(shared)
    assert [n for n in ("generate-0", "generate-1") if old[n] != new[n]] == []
    assert all(old[n] != new[n] for n in ("prepare", "extract", "train", "validate"))


def test_rank_and_world_size_feed_generation() -> None:
    two = plan.stage_plan(hosts(), ["a", "b"], ["a"])
    one = plan.stage_plan(hosts(), ["a"], ["a"])
    swapped = plan.stage_plan(hosts(), ["b", "a"], ["a"])
    assert one["hosts"]["a"]["stages"]["generate-0"]["hash"] != two["hosts"]["a"]["stages"]["generate-0"]["hash"]
    assert swapped["hosts"]["a"]["stages"]["generate-1"]["inputs"]["rank"] == 1


def test_several_trainers_train_together_and_only_the_first_validates() -> None:
    shared = tiny_settings() | {"eagle3_shared_storage": True}
    result = plan.stage_plan(hosts(shared), ["a", "b"], ["a", "b"])
    a, b = result["hosts"]["a"], result["hosts"]["b"]
    assert (a["train_stage"], b["train_stage"]) == ("train", "train-node-1")
    assert a["stages"]["train"]["hash"] == b["stages"]["train-node-1"]["hash"]
    assert list(b["stages"]) == ["generate-1", "train-node-1"]
    alone = plan.stage_plan(hosts(shared), ["a", "b"], ["a"])
    assert alone["hosts"]["a"]["stages"]["train"]["hash"] != a["stages"]["train"]["hash"]  # nnodes is an input


def test_settings_that_cannot_make_a_run_are_all_reported() -> None:
    bad = tiny_settings() | {
        "eagle3_aux_layer_ids": [1, 4], "eagle3_hidden_states": "both", "eagle3_hidden_states_dtype": "fp4"
    }  # fmt: skip
    del bad["eagle3_heldout"]
    result = plan.stage_plan(hosts(bad), ["a", "b"], ["a", "b"])
    text = "; ".join(result["problems"])
    assert "eagle3_heldout is not set" in text
    assert "eagle3_aux_layer_ids must list distinct layers below eagle3_num_layers (4)" in text
    assert "eagle3_hidden_states must be fused or separate, not 'both'" in text
    assert "eagle3_hidden_states_dtype must be bf16 or fp8, not 'fp4'" in text
    assert "needs eagle3_shared_storage: true" in text
    assert "hosts" not in result


def test_a_value_of_the_wrong_type_names_the_setting() -> None:
    with pytest.raises(plan.PlanError, match="eagle3_generate_max_tokens='lots' is not a valid int"):
        plan.stage_plan(hosts(tiny_settings() | {"eagle3_generate_max_tokens": "lots"}), ["a"], ["a"])


def test_the_action_is_registered_for_ansible() -> None:
    # Playbooks call it by its FQCN, through the collection the checkout is.
    found = action_loader.find_plugin("eagle3.pipeline.eagle3_plan")
    assert found is not None and Path(found).resolve() == (ROOT / "plugins/action/eagle3_plan.py")


def test_each_stage_names_the_stages_it_reads_whose_markers_it_sees() -> None:
    result = plan.stage_plan(hosts(), ["a", "b"], ["a"])
    a, b = result["hosts"]["a"]["stages"], result["hosts"]["b"]["stages"]
    # generate-1's marker is on host b: gather copies its rows, it cannot check it.
    assert {name: sorted(st["after"]) for name, st in a.items()} == {
        "generate-0": [],
        "gather": ["generate-0"],
        "prepare": ["gather"],
        "extract": ["prepare"],
        "train": ["extract"],
        "validate": ["train"],
    }
    assert a["prepare"]["after"] == {"gather": a["gather"]["hash"]}
    assert b["generate-1"]["after"] == {}
    shared = plan.stage_plan(hosts(tiny_settings() | {"eagle3_shared_storage": True}), ["a", "b"], ["a", "b"])
    sa, sb = shared["hosts"]["a"]["stages"], shared["hosts"]["b"]["stages"]
    # On shared storage every host's markers are in the one run directory.
    assert sa["prepare"]["after"] == {"generate-0": sa["generate-0"]["hash"], "generate-1": sb["generate-1"]["hash"]}
    assert sb["train-node-1"]["after"] == {"extract": sa["extract"]["hash"]}


def plans_of(run: dict[str, Any], todo: dict[str, list[str]], hidden_states: str = "fused") -> dict[str, Any]:
    """Every host's plan as the action's stages step makes it, with ``todo`` stages not complete."""
    out = {}
    for host, part in run["hosts"].items():
        states = [{"stage": name, "state": "todo" if name in todo[host] else "complete"} for name in part["stages"]]
        settings = tiny_settings() | {
            "eagle3_hidden_states": hidden_states,
            "eagle3_server_name": "gen",
            "eagle3_hidden_states_dir": "/run/hs",
            "eagle3_hidden_states_connector": "ExampleHiddenStatesConnector",
            "eagle3_hidden_states_connector_module": "",
        }
        out[host] = plan.host_plan(
            run, host, settings, states, jobs_installed=True, jobs_wheel={"sha256": "w"},
            server_active=False, server_started_by_pipeline=False,
        )  # fmt: skip
    return out


def test_a_host_plan_lists_what_is_not_complete_and_its_server() -> None:
    run = plan.stage_plan(hosts(), ["a", "b"], ["a"])
    a = plans_of(run, {"a": ["train", "validate"], "b": []})["a"]
    assert a["todo"] == ["train", "validate"]
    assert a["trainer"] == "a" and a["rank"] == 0 and a["node_rank"] == 0
    assert a["server"]["unit"] == "vllm-gen.service" and a["server"]["port"] == tiny_settings()["eagle3_server_port"]
    layers = a["captured_layers"]
    assert a["server"]["speculative_config"]["draft_model_config"]["hf_config"] == {
        "eagle_aux_hidden_state_layer_ids": layers
    }
    assert a["server"]["kv_transfer_config"] == {
        "kv_connector": "ExampleHiddenStatesConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": "/run/hs"},
    }


def test_the_fp8_connector_names_its_module() -> None:
    settings = tiny_settings() | {
        "eagle3_hidden_states_connector": " FP8HiddenStatesConnector",
        "eagle3_hidden_states_connector_module": "hs_connectors.fp8_hidden_states_connector",
    }
    _, kv = plan.server_configs(plan.settings_of(settings))
    assert kv["kv_connector"] == "FP8HiddenStatesConnector"
    assert kv["kv_connector_module_path"] == "hs_connectors.fp8_hidden_states_connector"


def test_settle_other_trainers_train_when_the_first_does() -> None:
    shared = tiny_settings() | {"eagle3_shared_storage": True}
    run = plan.stage_plan(hosts(shared), ["a", "b"], ["a", "b"])
    # b's own marker is complete, but torchrun needs every node when a trains again.
    plans = plans_of(run, {"a": ["train", "validate"], "b": []})
    assert plan.settle(plans, "b")["todo"] == ["train-node-1"]
    assert plan.settle(plans, "a")["todo"] == ["train", "validate"]
    done = plans_of(run, {"a": ["validate"], "b": []})
    assert plan.settle(done, "b")["todo"] == []


def test_settle_a_generator_needs_its_server_to_generate_or_to_extract_separately() -> None:
    run = plan.stage_plan(hosts(), ["a", "b"], ["a"])
    generating = plans_of(run, {"a": [], "b": ["generate-1"]})
    assert [plan.settle(generating, h)["server"]["needed"] for h in "ab"] == [False, True]
    extracting = plans_of(run, {"a": ["extract", "train", "validate"], "b": []})
    # Fused capture: the hidden states came with generation; no server is needed to extract.
    assert [plan.settle(extracting, h)["server"]["needed"] for h in "ab"] == [False, False]
    separate = plans_of(run, {"a": ["extract", "train", "validate"], "b": []}, hidden_states="separate")
    # Separate extraction: the first generator's server serves it.
    assert [plan.settle(separate, h)["server"]["needed"] for h in "ab"] == [True, False]


def test_stage_states_are_checked_against_what_was_asked() -> None:
    stages = {"prepare": {}, "extract": {}}
    assert [s["state"] for s in plan.stage_states(stages, None)] == ["todo", "todo"]
    answer = [{"stage": "prepare", "state": "complete"}, {"stage": "extract", "state": "running"}]
    assert plan.stage_states(stages, answer) == answer
    with pytest.raises(plan.PlanError, match="answered for"):
        plan.stage_states(stages, answer[:1])


def test_report_says_what_runs() -> None:
    assert plan.report("a", {"todo": []}, False) == "a: nothing to do, every stage is complete"
    assert plan.report("a", {"todo": ["train", "validate"]}, True) == "a: would run: train, validate"
    assert plan.report("a", {"todo": ["validate"]}, False) == "a: to run: validate"


def test_each_host_reads_only_the_files_its_stages_read() -> None:
    s = tiny_settings()
    assert sorted(plan.input_files("a", s, ["a", "b"], ["a"])) == [
        "dataset_sha256",
        "heldout_sha256",
        "model_config_sha256",
    ]
    assert sorted(plan.input_files("b", s, ["a", "b"], ["a"])) == ["dataset_sha256", "model_config_sha256"]
    assert sorted(plan.input_files("c", s, ["a", "b"], ["a", "c"])) == ["model_config_sha256"]
