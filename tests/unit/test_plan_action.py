"""The action eagle3.pipeline.eagle3_plan run by ansible-playbook, its three steps as plan.yml runs them,
on two hosts of a local inventory: what each host reads, the stages a real ``jobs.stage`` marker
completes, the cross-host settling, and the message a missing file stops the run with."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))

STEPS: list[dict[str, Any]] = [
    {"name": "inputs", "eagle3.pipeline.eagle3_plan": {"step": "inputs"}, "register": "eagle3__inputs"},
    {"name": "check", "eagle3.pipeline.eagle3_plan": {"step": "check"}},
    {
        "name": "stages",
        "eagle3.pipeline.eagle3_plan": {"step": "stages", "jobs_wheel": {"sha256": "w"}},
        "register": "eagle3__stages",
        "check_mode": False,
    },
    {"name": "keep", "ansible.builtin.set_fact": {"eagle3_plan": "{{ eagle3__stages.plan }}"}},
    {"name": "settle", "eagle3.pipeline.eagle3_plan": {"step": "settle"}, "register": "eagle3__settled"},
    {
        "name": "write",
        "ansible.builtin.copy": {
            "content": "{{ {'plan': eagle3__settled.plan, 'msg': eagle3__settled.msg} | to_json }}",
            "dest": "{{ out }}/{{ inventory_hostname }}.json",
            "mode": "0644",
        },
        "check_mode": False,
    },
]


def settings(tmp: Path) -> dict[str, Any]:
    defaults = yaml.safe_load((ROOT / "roles/eagle3/defaults/main.yml").read_text())
    tiny = yaml.safe_load((ROOT / "inventory/tiny/group_vars/all.yml").read_text())
    keep = {k: v for k, v in (defaults | tiny).items() if k.startswith("eagle3_") and "{{" not in str(v)}
    return keep | {
        "eagle3_target_model": str(tmp / "model"),
        "eagle3_dataset": str(tmp / "questions.jsonl"),
        "eagle3_heldout": str(tmp / "heldout.jsonl"),
        "eagle3_python": sys.executable,
        "eagle3_record_dir": str(tmp / "records"),
        "eagle3_server_name": "e3-plan-test-no-such-server",
        "eagle3_hidden_states_dir": str(tmp / "hs"),
        "eagle3_hidden_states_connector": "ExampleHiddenStatesConnector",
        "eagle3_hidden_states_connector_module": "",
    }


def run_plan(tmp: Path, *extra: str, **changes: Any) -> subprocess.CompletedProcess[str]:
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {
        "all": {
            "vars": settings(tmp) | {"out": str(tmp / "out")} | changes,
            "children": {
                "generators": {
                    "hosts": {
                        "a": host | {"eagle3_run_dir": str(tmp / "run-a")},
                        "b": host | {"eagle3_run_dir": str(tmp / "run-b")},
                    }
                },
                "trainers": {"hosts": {"a": None}},
            },
        }
    }
    (tmp / "hosts.yml").write_text(json.dumps(inventory))
    (tmp / "plan.yml").write_text(json.dumps([{"hosts": "generators:trainers", "gather_facts": False, "tasks": STEPS}]))
    (tmp / "out").mkdir(exist_ok=True)
    return subprocess.run(
        [ANSIBLE_PLAYBOOK, str(tmp / "plan.yml"), "-i", str(tmp / "hosts.yml"), *extra],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip


def make_inputs(tmp: Path) -> None:
    (tmp / "model").mkdir()
    (tmp / "model/config.json").write_text('{"num_hidden_layers": 4}\n')
    (tmp / "questions.jsonl").write_text('{"question": "what is a list?"}\n')
    (tmp / "heldout.jsonl").write_text('{"prompt": "what is a dict?"}\n')


def test_the_plan_action_plans_both_hosts_and_sees_a_complete_stage(tmp_path: Path) -> None:
    make_inputs(tmp_path)
    run = run_plan(tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    a = json.loads((tmp_path / "out/a.json").read_text())
    b = json.loads((tmp_path / "out/b.json").read_text())
    assert a["plan"]["todo"] == ["generate-0", "gather", "prepare", "extract", "train", "validate"]
    assert b["plan"]["todo"] == ["generate-1"] and b["msg"] == "b: to run: generate-1"
    assert a["plan"]["jobs_installed"] and a["plan"]["server_active"] is False
    assert a["plan"]["server"]["marker"] == f"{tmp_path}/run-a/.stages/server-started-a"
    assert [a["plan"]["server"]["needed"], b["plan"]["server"]["needed"]] == [True, True]

    # Complete b's generation with a real marker (jobs.stage start of a job that writes its output).
    rows = tmp_path / "run-b/gen/rows-1.jsonl"
    stage = [sys.executable, "-m", "jobs.stage"]
    digest = b["plan"]["stages"]["generate-1"]["hash"]
    started = subprocess.run(
        [*stage, "start", "--dir", str(tmp_path / "run-b"), "--name", "generate-1", "--inputs-hash", digest,
         "--output", str(rows), "--", "sh", "-c", f"mkdir -p {rows.parent} && echo '{{}}' > {rows}"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert json.loads(started.stdout)["started"], started.stdout
    subprocess.run([*stage, "wait", "--dir", str(tmp_path / "run-b"), "--name", "generate-1", "--timeout", "60"],
                   cwd=ROOT, check=True, capture_output=True)  # fmt: skip

    again = run_plan(tmp_path, "--check")
    assert again.returncode == 0, again.stdout + again.stderr
    b = json.loads((tmp_path / "out/b.json").read_text())
    assert b["plan"]["todo"] == [] and b["msg"] == "b: nothing to do, every stage is complete"
    assert b["plan"]["server"]["needed"] is False
    a = json.loads((tmp_path / "out/a.json").read_text())
    assert a["msg"] == "a: would run: generate-0, gather, prepare, extract, train, validate"


def test_a_missing_input_stops_the_plan_naming_the_host_and_the_setting(tmp_path: Path) -> None:
    make_inputs(tmp_path)
    (tmp_path / "heldout.jsonl").unlink()
    run = run_plan(tmp_path)
    assert run.returncode != 0
    assert f"a: {tmp_path}/heldout.jsonl does not exist (eagle3_heldout)" in run.stdout, run.stdout
    assert not (tmp_path / "out/b.json").exists()


def test_settings_that_cannot_make_a_run_stop_it_at_the_check_step(tmp_path: Path) -> None:
    make_inputs(tmp_path)
    run = run_plan(tmp_path, eagle3_generate_max_tokens="lots", eagle3_aux_layer_ids=[1, 9])
    assert run.returncode != 0
    assert "TASK [stages]" not in run.stdout, run.stdout
    assert "Cannot run the pipeline: eagle3_generate_max_tokens='lots' is not a valid int" in run.stdout, run.stdout
    run = run_plan(tmp_path, eagle3_aux_layer_ids=[1, 9])
    assert run.returncode != 0 and "TASK [stages]" not in run.stdout
    assert "Cannot run the pipeline: eagle3_aux_layer_ids must list distinct layers below" in run.stdout, run.stdout
